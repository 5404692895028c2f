"""One package per training framework: its flags (parse and emit side by side), how to
build and step its model for a measurement, its launch entry and its CPU patches."""
