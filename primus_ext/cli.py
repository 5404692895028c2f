"""The ``primus-ext`` Hydra application: ``mode=`` dispatches to one module per mode.

User errors (a bad override value, an illegal layout, a malformed CSV row) print one line
naming the field and the rule and exit with status 2; set HYDRA_FULL_ERROR=1 for the
traceback.

Under torchrun (RANK / LOCAL_RANK set) every rank runs this app: all ranks agree on one
run directory (``torchrun_run_id``), only rank 0 may write Hydra's output subdirectory,
and multirun is refused (each rank would run its own sweep).
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

import hydra
from omegaconf import DictConfig, OmegaConf

from primus_ext.modes import NotAvailable, dispatch


if not OmegaConf.has_resolver("primus_job_subdir"):
    OmegaConf.register_new_resolver(
        "primus_job_subdir", lambda mode: ".hydra" if str(mode).endswith("MULTIRUN") else None)


def _fail(msg: str, code: int = 2):
    print(f"primus-ext: error: {msg}", file=sys.stderr)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path="pkg://hydra_conf", config_name="config")
def _app(cfg: DictConfig):
    try:
        if _is_multirun() and cfg.get("output", "table") == "table":
            return _sweep_job(cfg)
        try:
            return dispatch(cfg)
        finally:
            _drop_empty_run_dir()
    except (ValueError, NotAvailable, OSError) as exc:
        # OSError: a path the user named that cannot be read or written (permissions, a
        # full disk); anything else is a defect of this program and keeps its traceback.
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        msg = _message(exc)
        if _is_multirun():
            # One illegal combination must not end a sweep: record it as the job's result.
            print(f"primus-ext: {msg}", file=sys.stderr)
            return {"verdict": "illegal", "error": msg}
        _fail(msg)


def _sweep_job(cfg: DictConfig):
    """One job of a multirun: its full output goes to output.txt in its job directory,
    and one line here, so the sweep's ranked summary is what the terminal shows."""
    import contextlib

    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    path = os.path.join(hc.runtime.output_dir, "output.txt")
    with open(path, "w") as f, contextlib.redirect_stdout(f):
        result = dispatch(cfg)
    print(f"job {hc.job.num}: {' '.join(hc.overrides.task)} -> {path}", flush=True)
    return result


def _drop_empty_run_dir() -> None:
    """Remove the run directory Hydra made for a single run when nothing was written
    into it (most modes write their outputs where the user says); kept under torchrun."""
    from hydra.core.hydra_config import HydraConfig

    if torchrun_rank(os.environ) is not None:
        return  # the ranks share it; one finishing early must not pull it from the others
    try:
        os.rmdir(HydraConfig.get().runtime.output_dir)
    except (OSError, ValueError):
        pass  # not empty, already gone, or no Hydra run (the Python API)


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename \
            and not isinstance(exc, FileNotFoundError):
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


_MULTIRUN_FLAGS = ("-m", "--multirun", "hydra.mode=MULTIRUN")


def torchrun_rank(env: Mapping[str, str]) -> int | None:
    """This process's global rank under torchrun (or any launcher that sets RANK or
    LOCAL_RANK), else None."""
    value = env.get("RANK", env.get("LOCAL_RANK"))
    return int(value) if value not in (None, "") else None


def torchrun_run_id(env: Mapping[str, str], agent_pid: int) -> str:
    """One run-directory name that every rank of one torchrun launch derives alike.

    PRIMUS_EXT_RUN_ID wins when set. Else torchrun's rendezvous id (TORCHELASTIC_RUN_ID:
    a fresh uuid for single-node and --standalone launches, the --rdzv-id otherwise),
    with the restart count after an elastic restart. Static multi-node rendezvous has
    no id ("none"): the master address and port are all the nodes share, so such runs
    reuse one directory unless --rdzv-id or PRIMUS_EXT_RUN_ID is given; on one node the
    agent's pid (every worker's parent) tells launches apart.
    """
    if env.get("PRIMUS_EXT_RUN_ID"):
        return env["PRIMUS_EXT_RUN_ID"]
    restarts = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    suffix = f"-restart{restarts}" if restarts not in ("", "0") else ""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchrun-{run_id}{suffix}"
    where = f"{env.get('MASTER_ADDR', 'localhost')}-{env.get('MASTER_PORT', '0')}"
    single_node = env.get("WORLD_SIZE") == env.get("LOCAL_WORLD_SIZE")
    return f"torchrun-{where}" + (f"-agent{agent_pid}" if single_node else "") + suffix


def torchrun_args(argv: list[str], env: Mapping[str, str],
                  agent_pid: int) -> tuple[list[str], dict[str, str]]:
    """(argv, environment updates) for this rank; unchanged outside torchrun."""
    rank = torchrun_rank(env)
    if rank is None:
        return argv, {}
    if any(a in _MULTIRUN_FLAGS for a in argv[1:]):
        raise ValueError(f"multirun (-m) under torchrun (RANK={rank}): every rank would "
                         "run its own sweep; run sweeps and the tuner in one process")
    updates = {"PRIMUS_EXT_RUN_ID": torchrun_run_id(env, agent_pid)}
    if rank != 0:
        argv = argv + ["hydra.output_subdir=null"]
    return argv, updates


def check_override_syntax(args: list[str]) -> None:
    """Raise one ValueError naming the first override Hydra's grammar cannot parse
    (Hydra would print its lexer's exception instead of the key the user typed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue  # Hydra's own flags (-m, --cfg job, ...) and their values
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as exc:
            key = arg.split("=", 1)[0].lstrip("+~")
            hint = ""
            if any(not c.isascii() and (c.isdigit() or c.isspace()) for c in arg):
                hint = "; write numbers with ASCII digits (0-9)"
            elif any(c in arg for c in "[]{}(),'\""):
                hint = "; quote a value that holds brackets, commas or quotes"
            reason = str(exc).splitlines()[0] if str(exc) else "invalid syntax"
            raise ValueError(f"{key}: override {arg!r} is not valid Hydra override syntax "
                             f"({reason}){hint}") from None


def main() -> None:
    try:
        argv, env = torchrun_args(sys.argv, os.environ, os.getppid())
        check_override_syntax(argv[1:])
    except ValueError as exc:
        _fail(str(exc))
    sys.argv[:] = argv
    os.environ.update(env)
    try:
        _app()
    except KeyboardInterrupt:  # Ctrl-C before a mode has anything to report: no traceback
        print("primus-ext: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
