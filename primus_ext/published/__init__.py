"""Published training runs (``data/validation/published_runs.csv``) into RunSpecs (pure).

The reader's steps, in the order a row goes through them:

1. ``cells``: one CSV cell at a time into a typed value, or a ``RowError`` naming the
   column and the rule;
2. ``names`` and ``model_columns``: the ``model`` and ``gpu`` columns to a model preset
   and a hardware preset, the model columns over the preset into a ``ModelSpec``;
3. ``recipes``: the settings the row's source recipe documents (what the table does not
   state: recompute, overlap flags, FP8 recipe, ...);
   Where a Megatron row and its source leave a setting unstated, the current
   performance recipes' value (Megatron-Bridge perf_recipes), not Megatron-LM's flag
   default;
4. ``gaps``: the remaining gaps (global batch from measured figures, recompute when the
   stated layout would not fit, a layout written only in the notes); ``recompute``
   reads a recompute cell by meaning (``selective(per-op)``, ``full, block, 5 layers``);
   ``contexts`` fills an empty sequence length with the model's pre-training context;
   ``tuned`` gives a row without a published layout the tuner's layout;
5. ``reader``: model, cluster, layout and training specs assembled into a ``RunSpec`` per
   row (``parse_row``), and a whole file (``read_runs``);
6. ``torchtitan``: rows measured with torchtitan's trainer become framework=torchtitan
   specs (FSDP2 degree, activation checkpointing, compile, AsyncTP, schedule).
"""
from primus_ext.published.gaps import DEFAULT_MICROBATCHES_PER_STAGE
from primus_ext.published.names import (MODEL_ALIASES, hardware_preset_name,
                                        match_model_preset, normalize_model_name)
from primus_ext.published.reader import (DEFAULT_PATH, Measured, PublishedRun,
                                         parse_row, read_runs)

__all__ = ["DEFAULT_MICROBATCHES_PER_STAGE", "DEFAULT_PATH", "MODEL_ALIASES",
           "Measured",
           "PublishedRun", "hardware_preset_name", "match_model_preset",
           "normalize_model_name", "parse_row", "read_runs"]
