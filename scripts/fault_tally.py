"""Bad inputs and faults, re-run: the tally of issue 15's categories.

Every case feeds primus-ext one bad input or one fault, as a careless user or a crashed
job would, and classifies what came back:

- clear: one error line naming the field (or file) and the rule, non-zero exit;
- survived: a fault the program is meant to absorb (a torn journal line, a concurrent
  tuner, hostile text in a launch script) absorbed with nothing lost and nothing run;
- unclear: an error, but one that does not name what is wrong;
- traceback: a Python traceback instead of a message;
- silent: the bad input accepted (a wrong result, or a loss nobody is told about);
- hang-or-corruption: no answer within the time limit, or a file left damaged.

The explicit cases (faults.py) cover every defect of the issue; the property-based fuzz
(faults_fuzz.py, hypothesis, derandomized) draws overrides, CSV cells, journal lines and
profile fields. The CLI runs in this process (Hydra's entry point with sys.argv set), so
the whole tally takes a minute or two.

Usage: python scripts/fault_tally.py [--quick] [--show unclear,traceback,...]
Exit status: 0 when only "clear" and "survived" remain, else 1.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: the tally can be run against another tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

OUTCOMES = ("clear", "survived", "unclear", "traceback", "silent", "hang-or-corruption")
GOOD = ("clear", "survived")
TIME_LIMIT_S = 120.0


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [x for x in self.stderr.splitlines() if x.startswith("primus-ext: error:")]


@dataclass
class Result:
    category: str
    case: str
    outcome: str
    detail: str = ""


_LOCK = threading.Lock()


def cli(args, home) -> Run:
    """``primus-ext ARGS`` in this process: exit status, stdout and stderr."""
    from primus_ext import cli as app

    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env = sys.argv[:], dict(os.environ)
    sys.argv[:] = ["primus-ext", *[str(a) for a in args]]
    os.environ["PRIMUS_EXT_HOME"] = str(home)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    code = 0
    with _LOCK:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    app.main()
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
                except BaseException:  # noqa: BLE001 - what escapes the app is the finding
                    traceback.print_exc(file=err)
                    code = 1
        finally:
            sys.argv[:] = saved_argv
            os.environ.clear()
            os.environ.update(saved_env)
    return Run(code, out.getvalue(), err.getvalue())


def classify_error(run: Run, needles=()) -> tuple[str, str]:
    """An input that must be refused: how was it refused?"""
    if run.returncode == 0:
        return "silent", "accepted (exit 0)"
    if "Traceback" in run.stderr:
        lines = [x for x in run.stderr.splitlines()
                 if x.strip() and not x.startswith("Set the environment variable")]
        return "traceback", lines[-1] if lines else ""
    text = run.stderr
    ours = run.error_lines
    hydra = "Error" in text or "Could not" in text or "Key '" in text
    line = ours[0] if ours else text.strip().splitlines()[0] if text.strip() else ""
    if (len(ours) == 1 or (not ours and hydra)) and all(n in text for n in needles):
        return "clear", line
    return "unclear", line or f"exit {run.returncode}, nothing said"


def classify_exception(fn, needles=()) -> tuple[str, str]:
    """A Python call that must raise one ValueError/TypeError naming ``needles``."""
    try:
        fn()
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        ok = all(n in msg for n in needles) and "\n" not in msg.strip()
        return ("clear" if ok else "unclear"), msg.splitlines()[0] if msg else type(exc).__name__
    except Exception as exc:  # noqa: BLE001
        return "traceback", f"{type(exc).__name__}: {exc}"
    return "silent", "accepted"


def timed(fn, limit_s: float = TIME_LIMIT_S) -> tuple[str, str]:
    """Run ``fn() -> (outcome, detail)`` with a time limit (a hang is an outcome)."""
    box: list = []

    def target():
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001
            box.append(("traceback", f"{type(exc).__name__}: {exc}"))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        return "hang-or-corruption", f"no answer in {limit_s:.0f} s"
    return box[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer fuzz examples")
    ap.add_argument("--show", default="unclear,traceback,silent,hang-or-corruption",
                    help="outcomes whose cases are listed (comma-separated, or 'all')")
    a = ap.parse_args()
    import logging

    import faults
    import faults_fuzz

    # The tuner's warnings (a skipped journal line) are what the cases provoke.
    logging.getLogger("primus_ext").setLevel(logging.ERROR)

    t0 = time.monotonic()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="primus-faults-") as tmp:
        work = Path(tmp)
        for category, case, fn in faults.cases(work, cli):
            outcome, detail = timed(fn)
            results.append(Result(category, case, outcome, detail))
        for category, case, outcome, detail in faults_fuzz.fuzz(work, cli, quick=a.quick):
            results.append(Result(category, case, outcome, detail))
    seconds = time.monotonic() - t0

    by_cat: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_cat[r.category][r.outcome] += 1
    total = collections.Counter(r.outcome for r in results)
    width = max(len(c) for c in by_cat) + 2
    print(f"{'category':<{width}}" + "".join(f"{o:>20}" for o in OUTCOMES))
    for cat in sorted(by_cat):
        print(f"{cat:<{width}}" + "".join(f"{by_cat[cat][o]:>20}" for o in OUTCOMES))
    print(f"{'total':<{width}}" + "".join(f"{total[o]:>20}" for o in OUTCOMES))
    print(f"\n{len(results)} cases in {seconds:.0f} s")
    show = OUTCOMES if a.show == "all" else tuple(a.show.split(","))
    for r in results:
        if r.outcome in show:
            print(f"  [{r.outcome}] {r.category}: {r.case}\n      {r.detail[:300]}")
    return 0 if all(r.outcome in GOOD for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
