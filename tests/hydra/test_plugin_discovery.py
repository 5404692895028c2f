"""Hydra finds the primus_tuner sweeper after the README's install (scripts/setup.sh:
an editable install in compat mode). Run in a fresh interpreter of the venv: plugin
discovery scans the hydra_plugins namespace once per process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
names = [f"{p.__module__}.{p.__name__}" for p in Plugins.instance().discover(Sweeper)]
print("\\n".join(names))
print("config:", "primus_tuner.yaml" in ConfigStore.instance().list("hydra/sweeper"))
"""


def test_hydra_discovers_the_sweeper():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120, cwd="/")  # not the repo root: the install must do
    assert res.returncode == 0, res.stderr
    assert ("hydra_plugins.primus_ext_tuner.primus_tuner_sweeper.PrimusTunerSweeper"
            in res.stdout.splitlines())
    assert "config: True" in res.stdout


def test_no_init_in_the_namespace_package():
    import hydra_plugins
    for path in hydra_plugins.__path__:
        assert not (Path(path) / "__init__.py").exists(), path


def test_plugin_import_is_light():
    """Hydra imports the plugin module on every start of every Hydra app: it must not
    pull in the tuner (that happens when the sweeper is built)."""
    code = ("import sys, hydra_plugins.primus_ext_tuner.primus_tuner_sweeper; "
            "print(any(m.startswith('primus_ext') for m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd="/")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
