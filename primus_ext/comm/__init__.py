"""Collective cost model: group spans, per-tier alpha-beta costs, in-layer and step comms."""
