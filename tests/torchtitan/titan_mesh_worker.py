"""torchtitan's own verdict on launch lines: ``ConfigManager().parse_args`` and
``ParallelDims.from_config(...).build_mesh()`` on ``world`` ranks of torch's fake process
group (one process, no devices). Reads ``[{"argv": [...], "world": N}, ...]`` as JSON on
stdin; prints one JSON list of verdicts. Run as its own process (it owns the process
group)."""
import json
import sys


def check(argv: list[str], world: int) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    try:
        cfg = ConfigManager().parse_args(argv)
    except SystemExit as exc:  # tyro prints its error and exits
        return {"ok": False, "stage": "ConfigManager", "error": f"exit {exc.code}"}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "stage": "ConfigManager", "error": repr(exc)}
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        pd = ParallelDims.from_config(cfg.parallelism, world)
        pd.build_mesh()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "stage": "ParallelDims", "error": repr(exc)}
    finally:
        dist.destroy_process_group()
    t = cfg.training
    dp = pd.dp_replicate * pd.dp_shard
    return {"ok": True, "dp_shard": pd.dp_shard, "dp_replicate": pd.dp_replicate,
            "tp": pd.tp, "pp": pd.pp, "cp": pd.cp, "ep": pd.ep,
            "efsdp": pd.dp_shard * pd.cp * pd.tp // pd.ep,
            "local_batch_size": t.local_batch_size, "global_batch_size": t.global_batch_size,
            "seq_len": t.seq_len, "batch_rule": t.global_batch_size % (t.local_batch_size * dp)
            == 0, "module": cfg.model_spec.name, "flavor": cfg.model_spec.flavor}


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    print(json.dumps([check(c["argv"], c["world"]) for c in cases]))
