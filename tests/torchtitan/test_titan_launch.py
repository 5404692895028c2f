"""launch/torchtitan_train.py: torchtitan's line plus --project-only, under torchrun."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--module", "llama3", "--config", "llama3_debugmodel",
        "--parallelism.data_parallel_shard_degree", "-1",
        "--training.local_batch_size", "2", "--training.seq_len", "256",
        "--job.dump_folder", "/tmp/unused", "activation-checkpoint:none"]
TARGET = ["--project-only", "--projection-backend", "simulate", "--target-nodes", "2",
          "--target-gpus-per-node", "8", "--target-hardware", "h100"]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_project_only_simulate_writes_the_estimate_with_config(tmp_path):
    out = tmp_path / "f.json"
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "torchtitan_train.py"),
                        *TINY, *TARGET, "--projection-out", str(out)],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["config"]["framework"] == "torchtitan"
    assert data["config"]["cluster"]["world_size"] == 16
    assert data["config"]["parallel"]["dp_shard"] == -1
    assert data["config"]["train"]["micro_batch_size"] == 2
    assert data["tokens_per_s_per_gpu"] > 0
    assert "no effect on step time or memory: --job.dump_folder" in r.stdout


def test_under_torchrun_two_processes(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "f.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2",
                        str(ROOT / "launch" / "torchtitan_train.py"), *TINY, *TARGET,
                        "--projection-out", str(out)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(out.read_text())["config"]["framework"] == "torchtitan"


def test_bad_line_exits_non_zero_with_one_message(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "torchtitan_train.py"),
                        "--module", "llama3", "--config", "nope", *TARGET],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 2
    assert r.stderr.startswith("error: --module llama3 --config nope")


def test_hybrid_backend_calls_the_measurement_hook(tmp_path, monkeypatch):
    """--projection-backend hybrid hands the target spec and torchtitan's own arguments to
    frameworks.torchtitan.measure.run_measurement and projects what it returns."""
    import importlib.machinery
    import types

    import primus_ext
    from primus_ext.frameworks.torchtitan import launch
    calls = []
    fake = types.ModuleType(launch.MEASURE_MODULE)
    fake.__spec__ = importlib.machinery.ModuleSpec(launch.MEASURE_MODULE, None)

    def run_measurement(spec, argv, opts):
        calls.append((spec, argv, opts))
        return primus_ext.project(spec)
    fake.run_measurement = run_measurement
    fake.TitanMeasureOptions = lambda **kw: kw
    monkeypatch.setitem(sys.modules, launch.MEASURE_MODULE, fake)
    out = tmp_path / "f.json"
    own, titan = launch.split_args([*TINY, *TARGET[:1], "--projection-backend", "hybrid",
                                    *TARGET[3:], "--projection-out", str(out),
                                    "--measure-memory-gib", "3"])
    assert titan == TINY
    launch.project_only(own, titan)
    (spec, argv, opts), = calls
    assert spec.framework == "torchtitan" and spec.world_size == 16 and argv == TINY
    assert opts == {"memory_gib": 3.0, "max_seconds": None}
    assert json.loads(out.read_text())["config"]["framework"] == "torchtitan"


def test_hybrid_without_the_measurement_says_so(monkeypatch):
    from primus_ext.frameworks.torchtitan import launch
    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name: None)
    own, titan = launch.split_args([*TINY, "--project-only", "--projection-backend",
                                    "hybrid"])
    with pytest.raises(ValueError, match="--projection-backend simulate"):
        launch.project_only(own, titan)
