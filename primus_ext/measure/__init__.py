"""What a measurement run (``--project-only``, ``mode=measure``) executes, independent of
the framework: the plan (``plan``: the downscale that fits the measuring device's memory
and time budgets, ``budget``), progress on stderr (``progress``), what was measured and
what modelled (``provenance``), per-layer timing hooks, the collective tracer, the
downscaler, the
communication microbenchmarks, routing capture, the saved-activation counter, the
aggregation of samples over ranks, and the checks of captured bytes against the models.
A framework's package (``frameworks/megatron``) builds and steps its model around these."""
