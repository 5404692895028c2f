"""primus-ext's tuner as a Hydra Sweeper: ``primus-ext -m hydra/sweeper=primus_tuner ...``."""
__version__ = "0.1.0"
