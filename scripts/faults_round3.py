"""The explicit cases of issue 26 (third round) for scripts/fault_tally.py: special files,
scale, typed top-level keys, overrides a mode does not read, tracebacks and unclear
errors."""
from __future__ import annotations

import csv
import os
import stat
import time

from fault_tally import classify_error


def _err(cli, home, args, *needles):
    return lambda: classify_error(cli(args, home), needles)


def cases(work, cli):
    home = work / "home3"
    d = work / "round3"
    d.mkdir()
    fifo = d / "p"
    os.mkfifo(fifo)
    c = "special files"

    def pipe_kept(args, needle):
        def check():
            outcome, detail = classify_error(cli(args, home), (needle,))
            if not stat.S_ISFIFO(os.stat(fifo).st_mode):
                return "hang-or-corruption", "the named pipe was replaced"
            return outcome, detail
        return check
    yield c, "validate out=FIFO", pipe_kept(["mode=validate", "runs=golden", f"out={fifo}"],
                                            "named pipe")
    yield c, "plot=/dev/null", _err(cli, home, ["mode=memory", "plot=/dev/null"],
                                    "character device")
    yield c, "runs=FIFO", pipe_kept(["mode=validate", f"runs={fifo}"], "runs=")
    yield c, "calibration=FIFO", pipe_kept([f"calibration={fifo}"], "calibration=")
    yield c, "runs=DIR says directory", _err(cli, home, ["mode=validate", f"runs={d}"],
                                             "is a directory")
    yield c, "plot= unwritable directory", _err(cli, home, ["plot=/sys/x.png"], "plot=",
                                                "cannot write")

    c = "scale"

    def huge_cluster():
        t0 = time.monotonic()
        run = cli(["cluster.num_nodes=100000000", "train.global_batch_size=800000000",
                   "parallel.cp=1", "output=json"], home)
        if run.returncode != 0:
            return classify_error(run)
        return "survived", f"1e8 nodes projected in {time.monotonic() - t0:.1f} s"
    yield c, "1e8 nodes", huge_cluster

    def many_rows():
        from primus_ext.published import DEFAULT_PATH
        rows = list(csv.DictReader(open(DEFAULT_PATH)))
        path = d / "many.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            for i in range(20000):
                w.writerow({**rows[i % len(rows)], "run_id": f"X{i}"})
        t0 = time.monotonic()
        run = cli(["mode=validate", f"runs={path}", f"out={d / 'many_out.csv'}"], home)
        if run.returncode != 0:
            return classify_error(run)
        took = time.monotonic() - t0
        return ("survived" if took < 120 else "hang-or-corruption",
                f"20,000 rows validated in {took:.0f} s")
    yield c, "validate 20,000 rows", many_rows

    c = "top-level keys"
    yield c, "calibrate out=default", _err(cli, home, ["mode=calibrate", "out=default",
                                                      "loso=false"], "out='default'")
    yield c, "newline in hardware_overrides.source", _err(
        cli, home, ["+cluster.hardware_overrides.source='a\nb'"], "one line")
    yield c, "calibrate loso=maybe", _err(cli, home, ["mode=calibrate", "loso=maybe"],
                                          "loso=")
    yield c, "measure out=", _err(cli, home, ["mode=measure", f"out={d / 'x'}"], "out=",
                                  "mode=measure")
    yield c, "trace_max_events=lots", _err(cli, home, [f"trace={d / 't.json'}",
                                                       "trace_max_events=lots"],
                                           "trace_max_events=")
    yield c, "trace_max_events=-5", _err(cli, home, ["trace_max_events=-5"],
                                         "trace_max_events=")
    lst = d / "list.json"
    lst.write_text("[1, 2]")
    yield c, "calibration file holding a list", _err(cli, home, [f"calibration={lst}"],
                                                     "calibration=")
    yield c, "full-width digit", _err(cli, home, ["parallel.tp=\uff18"], "parallel.tp")

    def sweep_with_bad_value():
        cwd = os.getcwd()
        os.chdir(d)
        try:
            run = cli(["-m", "trace_max_events=5,lots"], home)
        finally:
            os.chdir(cwd)
        if run.returncode != 0 or "Traceback" in run.stderr:
            return classify_error(run)
        found = list(d.glob("multirun/*/*/summary.csv"))
        if not found:
            return "silent", "no summary.csv"
        return "survived", "the bad job recorded as illegal; summary.csv written"
    yield c, "sweep with trace_max_events=lots", sweep_with_bad_value
