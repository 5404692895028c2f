"""``launch/pretrain_gpt.py --help`` lists and explains every primus-ext flag
(--project-only, --projection-*, --target-*, the measurement's) from the flag table."""
from __future__ import annotations

import contextlib
import io

import pytest

from primus_ext.frameworks.megatron.args import _parser
from primus_ext.frameworks.megatron.table import PRIMUS


def test_every_primus_flag_is_explained_in_help():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    text = " ".join(buf.getvalue().split())
    names = [f.name for f in PRIMUS]
    for prefix in ("--project-only", "--projection-", "--target-", "--measure-"):
        assert any(n.startswith(prefix) for n in names), prefix
    for f in PRIMUS:
        assert f.help and len(f.help) > 15, f.name
        assert " ".join(f.help.replace("%%", "%").split())[:40] in text, f.name
