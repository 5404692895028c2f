"""What a measurement run (``--project-only``, ``mode=measure``) executes, independent of
the framework: per-layer timing hooks, the collective tracer, the downscaler, the
communication microbenchmarks, routing capture, the saved-activation counter, the
aggregation of samples over ranks, and the checks of captured bytes against the models.
A framework's package (``frameworks/megatron``) builds and steps its model around these."""
