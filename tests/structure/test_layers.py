"""The package layering of docs/architecture.md, read from the source
(``scripts/architecture.py``): the pure core never imports torch, megatron-core, Hydra
or torchtitan, nor an edge package when it loads; no package import cycle; the page is
current."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts" / "architecture.py")
arch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arch)


def test_core_imports_no_edge():
    bad = arch.core_violations()
    assert not bad, "\n".join(bad)


def test_no_cycle_between_packages():
    found = arch.cycles(arch.graph())
    assert not found, "packages on an import cycle:\n" + "\n".join(found)


def test_rules_catch_a_violation(tmp_path, monkeypatch):
    """The checks are live: a core module importing torch and a two-package cycle are
    both reported."""
    pkg = tmp_path / "primus_ext"
    for name, text in {"spec/__init__.py": "", "spec/a.py": "import torch\n"
                       "from primus_ext.memory import b\n",
                       "memory/__init__.py": "", "memory/b.py": "from primus_ext.spec import a\n"
                       }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    monkeypatch.setattr(arch, "PKG", pkg)
    monkeypatch.setattr(arch, "ROOT", tmp_path)
    assert any("imports torch" in v for v in arch.core_violations())
    assert arch.cycles(arch.graph())


def test_architecture_page_is_current():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert page == arch.render(), ("docs/architecture.md is out of date: run "
                                   "python scripts/architecture.py --write")
