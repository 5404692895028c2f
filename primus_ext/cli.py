"""The ``primus-ext`` Hydra application: ``mode=`` dispatches to one module per mode.

User errors (a bad override value, an illegal layout, a malformed CSV row) print one line
naming the field and the rule and exit with status 2; set HYDRA_FULL_ERROR=1 for the
traceback.
"""
from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from primus_ext.modes import NotAvailable, dispatch


def _fail(msg: str, code: int = 2):
    print(f"primus-ext: error: {msg}", file=sys.stderr)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path="pkg://hydra_conf", config_name="config")
def _app(cfg: DictConfig):
    try:
        return dispatch(cfg)
    except (ValueError, NotAvailable, FileNotFoundError) as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if _is_multirun():
            # One illegal combination must not end a sweep: record it as the job's result.
            print(f"primus-ext: {exc}", file=sys.stderr)
            return {"verdict": "illegal", "error": str(exc)}
        _fail(str(exc))


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def main() -> None:
    _app()


if __name__ == "__main__":
    main()
