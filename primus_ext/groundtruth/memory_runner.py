"""Run memory-probe cases in real megatron-core processes (gloo, CPU) and collect results.

A case is a RunSpec (its cluster gives the world size) plus the measurements to take:
``params`` (elements per rank), ``buffers`` (DDP grad/param buffers and optimizer
state after one training step), ``activations`` (saved bytes per scope, one microbatch,
pp=1 only), ``inflight`` (microbatches alive after each forward of a pipeline run).
All cases of one world size share one set of processes (``torch.multiprocessing.spawn``,
one thread each); process groups are rebuilt per case.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import traceback
from dataclasses import dataclass, field

from primus_ext.spec import RunSpec


@dataclass(frozen=True)
class Case:
    name: str
    spec: RunSpec
    measure: tuple[str, ...] = ("params",)
    options: dict = field(default_factory=dict)  # probe knobs: bias_activation_fusion, ...

    @property
    def world_size(self) -> int:
        return self.spec.world_size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(case: Case) -> dict:
    """This rank's measurements of one case (inside an initialized process group)."""
    import torch

    from primus_ext.frameworks.megatron.model import setup_parallel, transformer_config
    from primus_ext.groundtruth import memory_probe as mp
    spec = case.spec
    setup_parallel(spec)
    config = transformer_config(
        spec, bias_activation_fusion=case.options.get("bias_activation_fusion", True))
    chunks = mp.build_chunks(spec, config)
    out: dict = {}
    if "params" in case.measure:
        per_chunk = [mp.param_elements(c) for c in chunks]
        out["params"] = {k: sum(pc[k] for pc in per_chunk) for k in ("dense", "expert")}
        out["params_per_chunk"] = per_chunk
    if "activations" in case.measure:
        res = mp.measure_activations(spec, chunks[0], mp.batch(spec),
                                     record_sites=case.options.get("record_sites", False))
        out["activations"] = res.by_scope
        out["activation_details"] = [
            [d.scope, d.nbytes, list(d.shape), d.dtype, d.producer, d.site]
            for d in res.details]
    if "inflight" in case.measure:
        m = case.options.get("num_microbatches", spec.num_microbatches)
        out["inflight"] = mp.measure_inflight(spec, chunks, m)
    if "buffers" in case.measure:
        wrapped = mp.wrap_ddp(spec, config, chunks,
                              grad_reduce_in_fp32=case.options.get("grad_reduce_in_fp32", True),
                              bucket_size=case.options.get("bucket_size"))
        opt = mp.build_optimizer(spec, wrapped)
        for w in wrapped:
            w.zero_grad_buffer()
        opt.zero_grad()
        mp.run_schedule(spec, wrapped, case.options.get("num_microbatches", 1))
        opt.step()
        bufs = [mp.ddp_buffer_bytes(w) for w in wrapped]
        out["buffers"] = {k: sum(b[k] for b in bufs) for k in bufs[0]}
        out["optimizer"] = mp.optimizer_state_bytes(opt)
    del chunks
    torch.distributed.barrier()
    return out


def _worker(rank: int, world_size: int, port: int, cases: list[Case], out_dir: str) -> None:
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from primus_ext.groundtruth import memory_probe as mp
    mp.init_process(rank, world_size, port)
    results = {}
    for case in cases:
        try:
            results[case.name] = run_case(case)
        except Exception:  # noqa: BLE001 -- reported per case to the parent
            results[case.name] = {"error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def run_cases(cases: list[Case]) -> dict[str, list[dict]]:
    """Results per case name, one dict per rank. Cases are grouped by world size."""
    import torch.multiprocessing as tmp
    by_world: dict[int, list[Case]] = {}
    for c in cases:
        by_world.setdefault(c.world_size, []).append(c)
    results: dict[str, list[dict]] = {}
    for world, group in by_world.items():
        with tempfile.TemporaryDirectory() as d:
            tmp.spawn(_worker, args=(world, _free_port(), group, d), nprocs=world, join=True)
            per_rank = []
            for r in range(world):
                with open(os.path.join(d, f"rank{r}.json")) as f:
                    per_rank.append(json.load(f))
        for c in group:
            results[c.name] = [per_rank[r][c.name] for r in range(world)]
    return results
