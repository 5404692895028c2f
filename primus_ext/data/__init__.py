"""Data shipped with the package: the public validation set (published runs, GPU datasheets, with their README) and the committed calibration."""
