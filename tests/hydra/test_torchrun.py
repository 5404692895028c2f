"""Under torchrun every rank runs the app: one run directory for all ranks, Hydra's
output from rank 0 only, no multirun. Simulated with torchrun's environment variables
in subprocesses (mode=describe: fast, no projection needed)."""
from __future__ import annotations

import pytest

from primus_ext.cli import torchrun_args, torchrun_run_id

TORCHRUN_ENV = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "f00d-1234",
                "TORCHELASTIC_RESTART_COUNT": "0"}


def _rank(r: int) -> dict:
    return {**TORCHRUN_ENV, "RANK": str(r), "LOCAL_RANK": str(r)}


def test_all_ranks_share_one_run_dir_and_only_rank0_writes_hydra_output(dirs, run_app):
    cwd, home = dirs
    args = ["mode=describe", "model=tiny_dense", "hydra.output_subdir=.hydra"]
    for r in (1, 0):  # rank 1 first: it must not create the .hydra subdirectory
        res = run_app(args, cwd=cwd, home=home, env=_rank(r))
        assert res.returncode == 0, res.stderr
        if r == 1:
            run_dirs = list((home / "runs").iterdir())
            assert [d.name for d in run_dirs] == ["torchrun-f00d-1234"]
            assert not (run_dirs[0] / ".hydra").exists()
    run_dirs = list((home / "runs").iterdir())
    assert [d.name for d in run_dirs] == ["torchrun-f00d-1234"]
    assert (run_dirs[0] / ".hydra" / "config.yaml").exists()
    assert not list(cwd.iterdir())  # nothing in the working directory


def test_multirun_is_refused_under_torchrun(dirs, run_app):
    cwd, home = dirs
    res = run_app(["-m", "mode=describe", "model=tiny_dense,llama3_8b"], cwd=cwd,
                  home=home, env=_rank(0))
    assert res.returncode == 2
    assert "multirun (-m) under torchrun" in res.stderr
    assert not list(cwd.iterdir())


def test_single_run_outside_torchrun_writes_nothing_in_cwd(dirs, run_app):
    cwd, home = dirs
    res = run_app(["mode=describe", "model=tiny_dense"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr
    assert not list(cwd.iterdir())
    assert not list((home / "runs").iterdir())  # its run directory stayed empty: removed
    res = run_app(["mode=describe", "model=tiny_dense", "hydra.output_subdir=.hydra"],
                  cwd=cwd, home=home)
    (run_dir,) = (home / "runs").iterdir()  # one that holds something is kept
    assert not run_dir.name.startswith("torchrun")


@pytest.mark.parametrize("env,pid,expected", [
    ({"PRIMUS_EXT_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "x"}, 7, "mine"),
    ({"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"}, 7,
     "torchrun-abc-restart2"),
    # static rendezvous on one node: the agent (every worker's parent) tells runs apart
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1",
      "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, 7, "torchrun-h-1-agent7"),
    # ... across nodes only the master address and port are shared
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1",
      "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 7, "torchrun-h-1"),
])
def test_run_id_rules(env, pid, expected):
    assert torchrun_run_id(env, pid) == expected


def test_args_unchanged_outside_torchrun():
    argv = ["primus-ext", "mode=project"]
    assert torchrun_args(argv, {}, 1) == (argv, {})
    argv1, env1 = torchrun_args(argv, _rank(1), 1)
    argv0, env0 = torchrun_args(argv, _rank(0), 1)
    assert argv1 == argv + ["hydra.output_subdir=null"] and argv0 == argv
    assert env0 == env1 == {"PRIMUS_EXT_RUN_ID": "torchrun-f00d-1234"}
