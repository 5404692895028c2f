"""What a real torchtitan model allocates and saves on this CPU, per rank (ground truth
for the torchtitan memory model; used by scripts/memory_torchtitan.py and tests/slow,
never by a projection).

Run under torchrun (one process per rank): torchtitan's Trainer is built from a torchtitan
line (the CPU patches of ``patches/``), one training step is taken, and each rank counts

- ``param_bytes``: its parameters' local shards (``DTensor.to_local()``: FSDP2 keeps the
  fp32 master shard; TP shards; PP keeps only the stage's blocks);
- ``grad_bytes``: the local shards of ``.grad`` after the step's backward (fp32, FSDP2's
  reduce-scattered shard);
- ``optimizer_bytes``: every tensor in the optimizers' state (AdamW ``exp_avg``,
  ``exp_avg_sq``; ``step`` is a scalar tensor per parameter, counted too and named);
- ``activation_bytes``: the storages autograd keeps for backward after one microbatch's
  forward of the stage (``primus_ext.measure.saved_tensors.SavedTensorCounter``,
  deduplicated by storage, parameters' storages excluded), by scope (``embedding``,
  ``layer.<i>``, ``final_norm``, ``outside``); the unsharded parameters FSDP2 keeps
  through backward (a group with ``reshard_after_forward=False``) show up as saved
  storages of FSDP2's unsharded parameters and are reported apart
  (``unsharded_param_bytes``); ``unsharded_peak_fwd_bytes`` is the most unsharded
  parameter bytes alive when a module's forward starts (the all-gathered blocks in
  flight).

    torchrun --nproc-per-node 2 -m primus_ext.frameworks.torchtitan.measure_memory \\
        --out FILE --model-dims JSON <torchtitan flags>
"""
from __future__ import annotations

import json
import sys


def _local(t) -> "object":
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _nbytes(t) -> int:
    x = _local(t)
    return x.numel() * x.element_size()


def count(trainer) -> dict:
    """Counts of one rank (see the module docstring)."""
    import torch

    from primus_ext.frameworks.torchtitan.step import StepRunner
    from primus_ext.measure.saved_tensors import SavedTensorCounter
    parts = trainer.model_parts
    params = [p for m in parts for p in m.parameters()]
    out = {"param_bytes": sum(_nbytes(p) for p in params),
           "num_params": sum(_local(p).numel() for p in params),
           "param_dtypes": sorted({str(_local(p).dtype) for p in params})}
    runner = StepRunner(trainer)
    runner.step()
    runner.close()
    out["grad_bytes"] = sum(_nbytes(p.grad) for p in params if p.grad is not None)
    opt, steps = 0, 0
    for o in trainer.optimizers.optimizers:
        for state in o.state.values():
            for name, v in state.items():
                if torch.is_tensor(v):
                    if name == "step":
                        steps += _nbytes(v)
                    else:
                        opt += _nbytes(v)
    out["optimizer_bytes"], out["optimizer_step_bytes"] = opt, steps
    out.update(_activations(trainer))
    return out


def _scopes(model) -> dict:
    scopes = {}
    if getattr(model, "tok_embeddings", None) is not None:
        scopes["embedding"] = model.tok_embeddings
    for key, block in model.layers.items():
        scopes[f"layer.{int(key)}"] = block
    if getattr(model, "norm", None) is not None:
        scopes["final_norm"] = model.norm
    return scopes


def _activations(trainer) -> dict:
    """Saved bytes of one microbatch's forward of this rank's (first) model part."""
    import torch

    from primus_ext.measure.saved_tensors import SavedTensorCounter
    model = trainer.model_parts[0]
    data = trainer.batch_generator(trainer.dataloader)
    input_dict, labels = next(data)
    input_dict = {k: v.to(trainer.device) for k, v in input_dict.items()}
    inputs, labels, extra = trainer.post_dataloading_process(input_dict, labels.to(
        trainer.device))
    if trainer.parallel_dims.pp_enabled:
        mbs = trainer.config.parallelism.pipeline_parallel_microbatch_size
        inputs, labels = inputs[:mbs], labels[:mbs]
        extra = {k: (v[:mbs] if torch.is_tensor(v) and v.dim() > 0 else v)
                 for k, v in extra.items()}
        if not trainer.pp_has_first_stage:
            # What the previous stage sends: hidden states in the compute dtype (FSDP2's
            # mixed-precision param dtype).
            dtype = getattr(torch, trainer.config.training.mixed_precision_param)
            inputs = torch.randn(*inputs.shape, trainer.model_config.dim, dtype=dtype,
                                 requires_grad=True)
    params = [_local(p) for m in trainer.model_parts for p in m.parameters()]
    counter = SavedTensorCounter(scopes=_scopes(model), params=params, roots=[model])
    # The all-gathered parameters alive while each module computes (after FSDP2's own
    # pre-forward hook, registered earlier, has gathered them): the peak is the blocks
    # in flight.
    peak = [0]

    def in_flight(module, args):
        peak[0] = max(peak[0], sum(_unsharded_storages(trainer.model_parts).values()))

    handles = [m.register_forward_pre_hook(in_flight) for m in _scopes(model).values()]
    try:
        with counter.counting():
            out = model(inputs, **extra)
    finally:
        for h in handles:
            h.remove()
    unsharded_ptrs = _unsharded_storages(trainer.model_parts)
    by_scope: dict[str, int] = {}
    unsharded = 0
    first_block = []  # what the first block saves, storage by storage
    for s in counter.details():
        if s.scope == min((k for k in _scopes(model) if k.startswith("layer.")),
                          key=lambda k: int(k.split(".")[1]), default=None) and \
                s.microbatch == 0 and s.data_ptr not in unsharded_ptrs:
            first_block.append([s.producer, list(s.shape), s.dtype, s.nbytes])
        if s.microbatch != 0:
            continue
        if s.data_ptr in unsharded_ptrs:
            unsharded += s.nbytes
            continue
        by_scope[s.scope] = by_scope.get(s.scope, 0) + s.nbytes
    del out
    return {"activation_bytes": sum(by_scope.values()), "activation_by_scope": by_scope,
            "unsharded_param_bytes": unsharded, "unsharded_peak_fwd_bytes": peak[0],
            "first_block_saved": sorted(first_block, key=lambda r: -r[3])}


def _unsharded_storages(parts) -> dict[int, int]:
    """Storages of FSDP2's unsharded parameters alive now (the groups that were not
    resharded after forward: ``reshard_after_forward=False``, as torchtitan sets it for
    the last group and under PP). torch 2.13: ``FSDPModule._get_fsdp_state()
    ._fsdp_param_groups[g].fsdp_params[i]._unsharded_param``."""
    ptrs: dict[int, int] = {}  # storage address -> bytes
    for part in parts:
        for mod in part.modules():
            get = getattr(mod, "_get_fsdp_state", None)
            state = get() if get else None
            # An MoE block holds two groups (dense params on ``fsdp``, experts on
            # ``efsdp``): ``_fsdp_param_groups``; ``_fsdp_param_group`` raises then.
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                groups = [getattr(state, "_fsdp_param_group", None)]
            fps = [fp for g in groups if g is not None for fp in g.fsdp_params or ()]
            for fp in fps:
                t = getattr(fp, "_unsharded_param", None)
                t = getattr(t, "_local_tensor", t)  # a DTensor under TP
                if t is not None and t.untyped_storage().nbytes() > 0:
                    ptrs[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return ptrs


def main(argv: list[str] | None = None) -> int:
    from primus_ext.frameworks.torchtitan.train import _pop
    argv = list(sys.argv[1:] if argv is None else argv)
    out_path, dims_json, assets = (_pop(argv, "--out"), _pop(argv, "--model-dims"),
                                   _pop(argv, "--assets"))
    if not out_path or not assets:
        raise SystemExit("--out FILE and --assets DIR are required")
    import torch  # noqa: F401 - before the patches
    from patches.torchtitan_apply import apply_torchtitan_cpu_patches
    apply_torchtitan_cpu_patches()
    import torch.distributed as dist

    from primus_ext.frameworks.torchtitan import build
    from primus_ext.util.files import atomic_write_text
    dims = build.ModelDims.from_json(dims_json) if dims_json else None
    build.ensure_assets(assets, dims.vocab_size if dims else 2048)
    cut = next((i for i, a in enumerate(argv) if a.startswith("activation-checkpoint:")),
               len(argv))
    argv = argv[:cut] + build.asset_flags(assets) + argv[cut:]
    trainer = build.build_trainer(build.trainer_config(argv, dims))
    try:
        mine = count(trainer)
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            atomic_write_text(out_path, json.dumps({"ranks": everyone}, indent=1) + "\n")
    finally:
        build.teardown(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
