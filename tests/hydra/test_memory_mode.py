"""mode=memory names the layer stack it counted and, for a run that does not fit, the
cheapest recompute that makes it fit (memory/fit_ladder.py)."""
from __future__ import annotations

import json


def test_memory_mode_states_stack_and_suggestion(dirs, run_app):
    cwd, home = dirs
    res = run_app(["mode=memory", "model=llama3_8b", "parallel.cp=1", "output=json"],
                  cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert not out["fits"]
    assert "Transformer Engine" in out["notes"][0]
    assert "cheapest saving that fits" in out["suggestion"]
    local = run_app(["mode=memory", "model=llama3_8b", "parallel.cp=1", "train.te=false",
                     "output=json"], cwd=cwd, home=home)
    assert local.returncode == 0, local.stderr[-3000:]
    assert json.loads(local.stdout)["peak_bytes"] > out["peak_bytes"]
