"""TorchTitan: its flags, the measurement of a real Trainer run and its launch entry."""
