"""Step-time projection: pipeline schedule simulation and the estimate built on it."""
