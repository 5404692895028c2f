"""Small shared helpers: atomic file writes, JSON-safe values, Hydra override formatting."""
