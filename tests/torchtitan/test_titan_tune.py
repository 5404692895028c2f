"""mode=tune framework=torchtitan: torchtitan's layout space and torchtitan_args.sh."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import primus_ext
from primus_ext.frameworks.torchtitan.flags import parse_titan, to_overrides

ROOT = Path(__file__).resolve().parents[2]
JOB = ["framework=torchtitan", "model=llama3_70b", "cluster.hardware=h100",
       "cluster.num_nodes=8", "train.global_batch_size=128", "train.seq_length=8192"]


def _titan_words(script: str) -> list[str]:
    line = next(ln for ln in script.splitlines() if ln.startswith("torchrun "))
    words = shlex.split(line.replace('"$@"', ""))
    assert words[3:5] == ["-m", "torchtitan.train"]
    return words[5:]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("tt_recipe")
    r = subprocess.run([sys.executable, "-m", "primus_ext.cli", "mode=tune", *JOB,
                        f"tune.out_dir={out}", "tune.llm.enabled=false"],
                       capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_recipe_directory(recipe):
    for name in ("torchtitan_args.sh", "overrides.txt", "recipe.yaml", "report.md"):
        assert (recipe / name).is_file(), name
    assert not (recipe / "megatron_args.sh").exists()


def test_args_parse_back_into_the_winner(recipe):
    words = _titan_words((recipe / "torchtitan_args.sh").read_text())
    ovs = (recipe / "overrides.txt").read_text().split()
    winner = primus_ext.compose(ovs)
    assert winner.framework == "torchtitan"
    back = primus_ext.compose(to_overrides(parse_titan(words), 80, winner.world_size)
                              + ["cluster.hardware=h100", "cluster.num_nodes=8"])
    for f in ("tp", "pp", "vpp", "cp", "dp_replicate", "sequence_parallel"):
        assert getattr(back.parallel, f) == getattr(winner.parallel, f), f
    assert back.train.activation_checkpoint == winner.train.activation_checkpoint
    assert back.train.global_batch_size == 128
    assert back.dp == winner.dp


def test_torchtitan_parser_accepts_the_args(recipe):
    manager = pytest.importorskip("torchtitan.config.manager")
    words = _titan_words((recipe / "torchtitan_args.sh").read_text())
    cfg = manager.ConfigManager().parse_args(words)
    assert cfg.training.global_batch_size == 128
    assert cfg.training.seq_len == 8192


def test_search_space_is_torchtitan_s():
    from primus_ext.tune.settings import SpaceSettings
    from primus_ext.tune.space import SearchSpace, as_dict
    base = primus_ext.compose(JOB)
    space = SearchSpace(base, SpaceSettings(values={"tp": (4, 8), "pp": (1, 2),
                                                    "vpp": (1, 2), "cp": (1,),
                                                    "micro_batch_size": (1,),
                                                    "sharding": ("fsdp", "hsdp")}))
    assert space.axes["recompute"] == ("none", "selective", "full")
    points = space.legal_points()
    assert points
    seen = set()
    for pt in points:
        spec = space.spec(pt)
        d = as_dict(pt)
        assert spec.framework == "torchtitan" and spec.parallel.dp_shard == -1
        assert spec.train.activation_checkpoint == d["recompute"]
        assert spec.parallel.dp_replicate == (8 if d["sharding"] == "hsdp" else 1)
        if spec.parallel.pp > 1:
            assert spec.parallel.schedule == ("1F1B" if spec.parallel.vpp == 1
                                              else "Interleaved1F1B")
        seen.add((d["sharding"], spec.parallel.pp, spec.parallel.vpp))
    assert ("hsdp", 2, 2) in seen and ("fsdp", 1, 1) in seen
    with pytest.raises(ValueError, match="with framework=torchtitan"):
        SearchSpace(base, SpaceSettings(values={"sharding": ("distributed_optimizer",)}))
