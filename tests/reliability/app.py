"""The primus-ext app run in this process (Hydra's own entry point, sys.argv set, the
streams captured): the same exit status, stdout and stderr as the console script, in
milliseconds instead of a fresh interpreter per call."""
from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [x for x in self.stderr.splitlines() if x.startswith("primus-ext: error:")]


def app(args, home, full_error: bool = False) -> Run:
    from primus_ext import cli

    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env = sys.argv[:], dict(os.environ)
    sys.argv[:] = ["primus-ext", *[str(a) for a in args]]
    os.environ["PRIMUS_EXT_HOME"] = str(home)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    if full_error:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None
                                                                    else 1)
            except BaseException:  # noqa: BLE001 - a raise out of the app
                import traceback
                traceback.print_exc(file=err)
                code = 1
    finally:
        sys.argv[:] = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return Run(code, out.getvalue(), err.getvalue())
