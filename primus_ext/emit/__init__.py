"""What the app writes for people and other tools: console tables, recipe directories (Hydra overrides, Megatron-LM torchrun scripts, reports), plots, Chrome traces, sweep summaries."""
