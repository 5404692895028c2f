"""Recipes for torchtitan's MoE families, checked by torchtitan itself: the lines of a
Qwen3-30B-A3B and a DeepSeek-V3-16B tune, and the lines of legal layouts (EP, TP, PP, CP, HSDP) of qwen3,
deepseek_v3 and gpt_oss configs, fed to ``ConfigManager`` and ``ParallelDims`` (mesh
built on torch's fake process group; tests/torchtitan/titan_mesh_worker.py)."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import primus_ext
from primus_ext.frameworks.torchtitan.flags import titan_argv

pytest.importorskip("torchtitan")
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("titan_mesh_worker.py")
QWEN = ["framework=torchtitan", "model=qwen3_30b_a3b", "cluster.hardware=h100",
        "cluster.num_nodes=2", "train.global_batch_size=64", "train.seq_length=4096"]


def _verdicts(cases: list[dict]) -> list[dict]:
    r = subprocess.run([sys.executable, str(WORKER)], input=json.dumps(cases),
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _words(script: str) -> tuple[list[str], int]:
    line = next(ln for ln in script.splitlines() if ln.startswith("torchrun "))
    words = shlex.split(line.replace('"$@"', ""))
    nnodes = int(words[1].split("=")[1])
    nproc = int(words[2].split("=")[1])
    assert words[3:5] == ["-m", "torchtitan.train"]
    return words[5:], nnodes * nproc


DSV3 = ["framework=torchtitan", "model=deepseek_v2_lite", "cluster.hardware=h100",
        "cluster.num_nodes=4", "train.global_batch_size=128", "train.seq_length=4096"]
JOBS = {"qwen3": (QWEN, ("qwen3", "30B-A3B")), "deepseek_v3": (DSV3, ("deepseek_v3", "16B"))}


def _tune(job: list[str], out: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "primus_ext.cli", "mode=tune", *job,
                        f"tune.out_dir={out}", "tune.llm.enabled=false",
                        "tune.budget.candidates=60", "tune.progress=false"],
                       capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    return {k: _tune(job, tmp_path_factory.mktemp(k)) for k, (job, _) in JOBS.items()}


def _sample(overrides: list[str], n: int = 8) -> list:
    """Legal layouts of the tuner's space, one per distinct (tp, pp, cp, ep, sharding),
    those with the most parallel axes first."""
    from primus_ext.tune.settings import SpaceSettings
    from primus_ext.tune.space import SearchSpace, as_dict
    base = primus_ext.compose(overrides)
    space = SearchSpace(base, SpaceSettings(values={"micro_batch_size": (1, 2),
                                                    "sharding": ("fsdp", "hsdp")}))
    seen, specs = set(), []
    for pt in space.legal_points():
        d = as_dict(pt)
        key = (d["tp"], d["pp"], d["vpp"] > 1, d["cp"], d["ep"], d["sharding"])
        if key in seen:
            continue
        seen.add(key)
        specs.append(space.spec(pt))
    specs.sort(key=lambda s: -sum(x > 1 for x in (s.parallel.tp, s.parallel.pp,
                                                   s.parallel.cp, s.parallel.ep,
                                                   s.parallel.dp_replicate)))
    return specs[:n]


def test_moe_tunes_write_lines_torchtitan_accepts(recipes):
    """Qwen3-30B-A3B (--config qwen3_30b_a3b) and DeepSeek-V2-Lite's shape (--config
    deepseek_v3_16b): each tune's torchtitan_args.sh, as torchtitan reads it."""
    cases, winners = [], []
    for key, out in recipes.items():
        text = (out / "torchtitan_args.sh").read_text()
        assert "exit 2" not in text and f"--module {key} --config" in text
        words, world = _words(text)
        cases.append({"argv": words, "world": world})
        winners.append(primus_ext.compose((out / "overrides.txt").read_text().split()))
    for (key, (job, flavour)), winner, v in zip(JOBS.items(), winners, _verdicts(cases)):
        assert v["ok"], (key, v)
        assert (v["module"], v["flavor"]) == flavour
        p = winner.parallel
        assert (v["tp"], v["pp"], v["cp"], v["ep"]) == (p.tp, p.pp, p.cp, p.ep)
        assert v["dp_replicate"] * v["dp_shard"] == winner.dp and v["batch_rule"]
        assert v["global_batch_size"] == winner.train.global_batch_size
        assert v["seq_len"] == 4096


def test_legal_layouts_are_legal_for_torchtitan():
    specs = []
    for model in ("qwen3_30b_a3b", "deepseek_v2_lite", "gpt_oss_20b"):
        job = ["framework=torchtitan", f"model={model}", "cluster.hardware=h100",
               "cluster.num_nodes=4", "train.global_batch_size=128",
               "train.seq_length=4096"]
        some = _sample(job)
        assert any(s.parallel.ep > 1 for s in some) and any(s.parallel.pp > 1 for s in some)
        specs += some
    cases = [{"argv": titan_argv(s), "world": s.world_size} for s in specs]
    for s, case, v in zip(specs, cases, _verdicts(cases), strict=True):
        assert v["ok"], (s.model.name, s.layout.describe(), case["argv"], v)
        p = s.parallel
        assert (v["tp"], v["pp"], v["cp"], v["ep"], v["dp_replicate"]) == (
            p.tp, p.pp, p.cp, p.ep, p.dp_replicate)
        assert v["dp_replicate"] * v["dp_shard"] == s.dp and v["batch_rule"]
        assert v["efsdp"] * p.ep == v["dp_shard"] * p.cp * p.tp  # EP beside FSDP2


def test_torchtitan_refuses_what_the_spec_refuses():
    """The worker's verdicts are live: an EP that does not divide dp_shard*cp*tp fails
    the mesh build, as spec/torchtitan.py says."""
    argv = ["--module", "qwen3", "--config", "qwen3_30b_a3b",
            "--parallelism.expert_parallel_degree", "3", "--training.disable_cuda_graphs"]
    [v] = _verdicts([{"argv": argv, "world": 16}])
    assert not v["ok"] and v["stage"] == "ParallelDims"
    with pytest.raises(ValueError, match="EP borrows ranks"):
        primus_ext.compose(QWEN + ["parallel.ep=3"])
