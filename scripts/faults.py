"""The explicit bad inputs and faults of scripts/fault_tally.py, one per issue-15 defect
and category: overrides, output paths, CSV, calibration, journal and tuner directory,
profile here; launch-script text, Python API, trace size and the drop-in's target in
faults_text.py."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
from pathlib import Path

from fault_tally import classify_error

TUNE = ["mode=tune", "tune.progress=false", "tune.budget.candidates=12",
        "tune.reference=null", "tune.strategy=guided"]


def _err(cli, home, args, *needles):
    return lambda: classify_error(cli(args, home), needles)


def published_rows() -> tuple[list[str], dict]:
    from primus_ext.published import DEFAULT_PATH
    with open(DEFAULT_PATH, newline="") as f:
        r = csv.DictReader(f)
        return list(r.fieldnames), {row["run_id"]: row for row in r}


def write_csv(path: Path, header, rows) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header)
    w.writeheader()
    for row in rows:
        w.writerow(row)
    path.write_text(buf.getvalue())
    return path


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cases(work: Path, cli):
    home = work / "home"
    yield from _overrides(home, cli)
    yield from _paths(work, home, cli)
    yield from _csv(work, home, cli)
    yield from _tuner_dir(work, home, cli)
    yield from _profiles(work, home, cli)
    from faults_text import python_api, shell, trace_and_dropin
    import faults_round3
    yield from faults_round3.cases(work, cli)
    yield from shell(work, home, cli)
    yield from python_api()
    yield from trace_and_dropin(work, home, cli)


def _overrides(home, cli):
    c = "overrides"
    for args, needle in [
            (["parallel.fsdp=off"], "parallel.fsdp"), (["parallel.tp=abc"], "parallel.tp"),
            (["parallel.tp=0"], "parallel.tp"), (["parallel.tp=3"], "tp*pp*cp=3"),
            (["parallel.pp=1e3"], "parallel.pp"),
            (["train.global_batch_size=-1"], "global_batch_size"),
            (["train.precision=fp4"], "train.precision"),
            (["cluster.hardware=z80"], "z80"), (["cluster.num_nodes=0"], "num_nodes"),
            (["+cluster.hardware_overrides.gemm_efficiency=abc"], "gemm_efficiency"),
            (["+cluster.hardware_overrides.gemm_efficiency=2"], "gemm_efficiency"),
            (["+cluster.hardware_overrides.hbm_gbps=nan"], "hbm_gbps"),
            (["model=nonexistent"], "nonexistent"), (["parallel.tpp=2"], "tpp"),
            (["output=xml"], "output"), (["mode=bogus"], "mode"),
            (["backend=xyz"], "backend"), (["model.name='x\ntouch PWNED\ny'"], "model.name"),
            (["train.recompute_granularity=full"], "recompute_method"),
            (["parallel.vpp=2"], "vpp"), (["parallel.sequence_parallel=maybe"],
                                          "sequence_parallel"),
            (["train.te=yes"], "train.te"), (["cluster.gpus_per_node=2.5"], "gpus_per_node"),
            (["parallel.order=tp-pp"], "parallel.order"),
            (["calibration=/nonexistent.json"], "calibration"),
            (["train.seq_length=inf"], "seq_length"),
            ([*TUNE, "tune.budget.candidates=0"], "tune.budget.candidates"),
            ([*TUNE, "tune.resume=off"], "tune.resume"),
            ([*TUNE, "tune.space.tp=[3]"], "no legal layout"),
            ([*TUNE, "+tune.space.tpp=[1]"], "tune.space.tpp")]:
        yield c, " ".join(args[-1:]).replace("\n", "\\n"), _err(cli, home, args, needle)


def _paths(work, home, cli):
    c = "output paths"
    d = work / "adir"
    d.mkdir()
    (work / "afile").write_text("")
    yield c, "trace=DIR", _err(cli, home, [f"trace={d}"], "trace=", "is a directory")
    yield c, "plot=DIR", _err(cli, home, [f"plot={d}"], "plot=", "is a directory")
    yield c, "plot under a file", _err(cli, home, [f"plot={work / 'afile' / 'x.png'}"],
                                       "plot=")
    yield c, "validate out=DIR", _err(cli, home, ["mode=validate", f"out={d}"], "out=")
    yield c, "calibrate out=DIR", _err(cli, home, ["mode=calibrate", f"out={d}",
                                                   "loso=false"], "out=")
    yield c, "tune.out_dir=FILE", _err(cli, home, [*TUNE, f"tune.out_dir={work / 'afile'}"],
                                       "tune.out_dir=", "is a file")
    yield c, "runs=DIR", _err(cli, home, ["mode=validate", f"runs={d}"], "runs=")
    yield c, "profile=DIR", _err(cli, home, ["backend=profile", f"profile={d}"], "profile")


def _csv(work, home, cli):
    c = "CSV"
    header, rows = published_rows()
    p1, p2 = rows["P001"], rows["P002"]
    f = work / "csv"
    f.mkdir()
    (f / "h.csv").write_text("run_id\n")
    yield c, "header only (validate)", _err(cli, home, ["mode=validate",
                                                        f"runs={f / 'h.csv'}"], "none of")
    dup = write_csv(f / "dup.csv", header, [p1, {**p2, "run_id": "P001"}])
    yield c, "duplicated run_id", _err(cli, home, ["mode=validate", f"runs={dup}"], "P001")
    (f / "latin1.csv").write_bytes("run_id,model\nP1,caf\xe9\n".encode("latin-1"))
    yield c, "not UTF-8", _err(cli, home, ["mode=validate", f"runs={f / 'latin1.csv'}"],
                               "latin1.csv")
    (f / "bin.csv").write_bytes(bytes(range(256)) * 4)
    yield c, "binary file", _err(cli, home, ["mode=validate", f"runs={f / 'bin.csv'}"],
                                 "bin.csv")
    (f / "noid.csv").write_text("model,gpu\nx,H100\n")
    yield c, "no run_id column", _err(cli, home, ["mode=validate",
                                                  f"runs={f / 'noid.csv'}"], "run_id")
    for col, value in [("measured_tokens_per_s_per_gpu", "nan"),
                       ("measured_tokens_per_s_per_gpu", "inf"),
                       ("measured_tokens_per_s_per_gpu", "-5"),
                       ("measured_tflops_per_gpu", "-1"), ("gbs", "2.048e3"),
                       ("layers", "1e3"), ("tp", "inf")]:
        path = write_csv(f / f"{col}_{value}.csv", header, [{**p1, col: value}, p2])
        yield c, f"{col}={value}", _row_refused(cli, home, path, "P001", col)
    path = write_csv(f / "allbad.csv", header, [{**p1, "gpu": "Z80"}, {**p2, "layers": "x"}])
    yield c, "no row projects", _err(cli, home, ["mode=validate", f"runs={path}"],
                                     "none of its 2 row(s)")
    c = "calibration"
    pkg = _calibration_file()
    yield c, "calibrate on a header-only CSV", _calibrate_refused(
        cli, home, f / "h.csv", pkg, "no usable row")
    neg = write_csv(f / "neg.csv", header, [{**p1, "measured_tokens_per_s_per_gpu": "-3"}])
    yield c, "calibrate on negative measured values", _calibrate_refused(
        cli, home, neg, pkg, "measured_tokens_per_s_per_gpu")
    good = write_csv(f / "good.csv", header, [p1, p2])
    yield c, "calibrate writes outside the package", _calibrate_home(cli, work, good, pkg)


def _calibration_file() -> Path:
    from primus_ext.project.calibration import DEFAULT_PATH
    return DEFAULT_PATH


def _row_refused(cli, home, path, run_id, column):
    def check():
        run = cli(["mode=validate", f"runs={path}", "output=json"], home)
        if run.returncode != 0 or "Traceback" in run.stderr:
            return classify_error(run)
        row = {r["run_id"]: r for r in json.loads(run.stdout)["rows"]}[run_id]
        if row["rel_error"] != "" or row["tokens_per_s_per_gpu"] != "":
            return "silent", f"row {run_id} used: {row}"
        return ("clear" if column in row["error"] else "unclear"), row["error"]
    return check


def _calibrate_refused(cli, home, path, pkg, needle):
    def check():
        before = _digest(pkg)
        outcome, detail = classify_error(cli(["mode=calibrate", f"runs={path}",
                                              "loso=false"], home), (needle,))
        if _digest(pkg) != before:
            return "hang-or-corruption", "the package's calibration file changed"
        return outcome, detail
    return check


def _calibrate_home(cli, work, path, pkg):
    def check():
        before = _digest(pkg)
        home = work / "calhome"
        run = cli(["mode=calibrate", f"runs={path}", "loso=false"], home)
        if run.returncode != 0:
            return classify_error(run)
        if _digest(pkg) != before:
            return "hang-or-corruption", "the package's calibration file changed"
        if not (home / "calibration.json").is_file():
            return "silent", "no calibration file under the home"
        return "survived", f"written to {home / 'calibration.json'}; package untouched"
    return check


def _tuner_dir(work, home, cli):
    c = "journal and tuner directory"
    base = work / "tune"

    def refuse_existing():
        out = base / "existing"
        first = cli([*TUNE, f"tune.out_dir={out}", "train.global_batch_size=256"], home)
        if first.returncode != 0:
            return classify_error(first)
        before = (out / "trials.jsonl").read_bytes()
        outcome, detail = classify_error(cli([*TUNE, f"tune.out_dir={out}"], home),
                                         ("tune.resume=true", "tune.overwrite=true"))
        if (out / "trials.jsonl").read_bytes() != before:
            return "hang-or-corruption", "the existing journal changed"
        return outcome, detail
    yield c, "existing journal without resume", refuse_existing

    def other_job():
        out = base / "other"
        cli([*TUNE, f"tune.out_dir={out}", "train.global_batch_size=256"], home)
        return classify_error(cli([*TUNE, f"tune.out_dir={out}", "tune.resume=true"], home),
                              ("another job",))
    yield c, "resume another job's journal", other_job

    def locked():
        from primus_ext.util.files import lock_dir
        out = base / "locked"
        with lock_dir(out, "tune.out_dir"):
            return classify_error(cli([*TUNE, f"tune.out_dir={out}"], home), ("in use",))
    yield c, "second tuner on a locked out_dir", locked

    def two_at_once():
        """Two real processes (Hydra's global state is per process)."""
        import sys
        out = base / "race"
        env = {**os.environ, "PRIMUS_EXT_HOME": str(home), "OMP_NUM_THREADS": "1"}
        env.pop("HYDRA_FULL_ERROR", None)
        cmd = [sys.executable, "-m", "primus_ext.cli", *TUNE, "tune.budget.candidates=40",
               f"tune.out_dir={out}"]
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        runs = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
        for line in (out / "trials.jsonl").read_bytes().split(b"\n"):
            if line:
                json.loads(line)  # a torn line is corruption
        codes = sorted(r[2] for r in runs)
        refused = [r[1] for r in runs if r[2] != 0]
        if codes == [0, 2] and ("in use" in refused[0] or "tune.resume=true" in refused[0]):
            return "survived", refused[0].strip().splitlines()[-1][:200]
        if codes == [0, 0]:
            return "hang-or-corruption", "both tuners wrote into one out_dir"
        return "unclear", " | ".join(r[1].strip()[-200:] for r in runs)
    yield c, "two tuners at once on one out_dir", two_at_once

    def bad_middle_line():
        out = base / "bad-line"
        run = cli([*TUNE, f"tune.out_dir={out}"], home)
        if run.returncode != 0:
            return classify_error(run)
        path = out / "trials.jsonl"
        lines = path.read_bytes().split(b"\n")
        damaged = b"\n".join(lines[:3] + [b"{torn line"] + lines[3:])
        path.write_bytes(damaged)
        run = cli([*TUNE, f"tune.out_dir={out}", "tune.resume=true"], home)
        if run.returncode != 0:
            return classify_error(run)
        if not path.read_bytes().startswith(damaged):
            return "hang-or-corruption", "the journal was truncated"
        return "survived", "bad line skipped and counted, later trials kept"
    yield c, "bad line in the middle of trials.jsonl", bad_middle_line

    def journal_is_a_dir():
        out = base / "jdir"
        (out / "trials.jsonl").mkdir(parents=True)
        return classify_error(cli([*TUNE, f"tune.out_dir={out}"], home), ("trials.jsonl",))
    yield c, "trials.jsonl is a directory", journal_is_a_dir

    def png_temp_in_the_way():
        out = base / "png"
        (out / ".trials.png.tmp").mkdir(parents=True)
        run = cli([*TUNE, f"tune.out_dir={out}"], home)
        if run.returncode != 0:
            return classify_error(run)
        ok = (out / "trials.png").is_file()
        return ("survived", "PNG written") if ok else ("silent", "no trials.png")
    yield c, "another writer's PNG temp file", png_temp_in_the_way


def _profiles(work, home, cli):
    c = "profile"
    d = work / "profiles"
    d.mkdir()
    for name, body in [("layers is a number", {"schema_version": 1, "layers": 5}),
                       ("missing keys", {"schema_version": 1}),
                       ("a list", [1, 2]), ("old schema", {"schema_version": 0})]:
        p = d / f"{name.replace(' ', '_')}.json"
        p.write_text(json.dumps(body))
        yield c, name, _err(cli, home, ["backend=profile", f"profile={p}"], "profile")
    (d / "notjson.json").write_text("{")
    yield c, "not JSON", _err(cli, home, ["backend=profile", f"profile={d / 'notjson.json'}"],
                              "profile")
    yield c, "backend=profile without profile=", _err(cli, home, ["backend=profile"],
                                                      "profile=FILE")
