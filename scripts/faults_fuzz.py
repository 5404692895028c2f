"""Property-based fuzz for scripts/fault_tally.py (hypothesis, derandomized: the same
examples on every run): overrides, CSV cells, journal lines and profile fields.

Each drawn input is classified like an explicit case. An accepted input is checked for
what "silent" would mean there: a spec field of the wrong type or a non-finite value;
a CSV row used with a cell that is not a clean count or a finite positive measurement;
a journal whose good lines were lost or whose bytes were truncated; a projection from a
damaged profile with non-finite figures.
"""
from __future__ import annotations

import copy
import json
import math
import typing
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fault_tally import classify_error
from faults import published_rows, write_csv

_SETTINGS = dict(derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))
_KEYS = ["parallel.tp", "parallel.pp", "parallel.vpp", "parallel.cp", "parallel.fsdp",
         "parallel.sequence_parallel", "parallel.schedule", "parallel.order",
         "parallel.overlap_grad_reduce", "train.seq_length", "train.micro_batch_size",
         "train.global_batch_size", "train.precision", "train.recompute_granularity",
         "train.te", "train.recompute_modules", "model.num_layers", "model.hidden_size",
         "model.name", "model.hidden_dropout", "cluster.num_nodes", "cluster.gpus_per_node",
         "cluster.gpu_hour_cost", "+cluster.hardware_overrides.gemm_efficiency",
         "+cluster.hardware_overrides.hbm_bytes", "+cluster.hardware_overrides.name"]
_VALUES = st.one_of(
    st.sampled_from(["off", "on", "yes", "1e3", "nan", "inf", "-inf", "-1", "0", "1", "2",
                     "2.5", "true", "null", "[1,2]", "[]", "{a: 1}", "''", "' '",
                     "'$(touch PWNED)'", "abc", "8", "0.5", "1.0", "tp-cp-ep-dp-pp"]),
    st.integers(-3, 10**6).map(str), st.floats(allow_nan=True).map(repr),
    st.text(st.characters(min_codepoint=33, max_codepoint=126,
                          blacklist_characters="'\"\\$`,[]{}()=~+"), min_size=1,
            max_size=8))


def fuzz(work: Path, cli, quick: bool = False):
    n = 12 if quick else 1
    out: list = []
    _overrides(out, max(120 // n, 8))
    _csv_cells(out, work, max(150 // n, 10))
    _journals(out, work, max(60 // n, 6))
    _profiles(out, work, cli, max(60 // n, 4))
    return out


def _spec_ok(spec) -> str | None:
    """None, or why an accepted spec holds a value its field does not allow."""
    import dataclasses

    for group in ("model", "parallel", "train", "cluster"):
        obj = getattr(spec, group)
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                return f"{group}.{f.name}={v!r}"
            if hints[f.name] is bool and not isinstance(v, bool):
                return f"{group}.{f.name}={v!r} is not a boolean"
            if hints[f.name] is int and (isinstance(v, bool) or not isinstance(v, int)):
                return f"{group}.{f.name}={v!r} is not an integer"
    return None


def _overrides(out, n):
    from primus_ext.config import compose

    @settings(max_examples=n, **_SETTINGS)
    @given(st.lists(st.tuples(st.sampled_from(_KEYS), _VALUES), min_size=1, max_size=3))
    def one(pairs):
        ovs = [f"{k}={v}" for k, v in pairs]
        try:
            spec = compose(ovs)
        except ValueError as exc:
            msg = str(exc)
            named = any(k.lstrip("+").split(".")[-1] in msg or k.split(".")[0].lstrip("+")
                        in msg for k, _ in pairs) or "world size" in msg \
                or "divisible" in msg or "microbatches" in msg or "interleaved" in msg
            out.append(("fuzz: overrides", " ".join(ovs), "clear" if named else "unclear",
                        msg.splitlines()[0]))
            return
        except Exception as exc:  # noqa: BLE001
            mod = type(exc).__module__
            ok = mod.startswith(("hydra", "omegaconf"))  # Hydra's grammar errors: named
            out.append(("fuzz: overrides", " ".join(ovs), "clear" if ok else "traceback",
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
            return
        bad = _spec_ok(spec)
        out.append(("fuzz: overrides", " ".join(ovs), "silent" if bad else "survived",
                    bad or "a legal spec"))
    one()


_INT_COLS = ("layers", "hidden", "heads", "num_gpus", "tp", "pp", "cp", "ep", "mbs", "gbs",
             "seq_len", "vocab")
_MEASURED = ("measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu")


def _clean_int(text: str) -> bool:
    t = text.strip()
    return t.lstrip("+").isdigit() and t.isascii()


def _csv_cells(out, work, n):
    from primus_ext.published import read_runs
    from primus_ext.project.validate import project_run

    header, rows = published_rows()
    base = rows["P001"]
    d = work / "fuzz-csv"
    d.mkdir()
    counter = iter(range(10**6))

    @settings(max_examples=n, **_SETTINGS)
    @given(st.sampled_from(_INT_COLS + _MEASURED + ("gpu", "precision", "model", "run_id")),
           st.one_of(_VALUES, st.text(max_size=6), st.sampled_from(["1e3", "8.0", " 8 ",
                                                                   "0x10", "1_000"])))
    def one(col, value):
        path = write_csv(d / f"{next(counter)}.csv", header, [{**base, col: value}])
        case = f"{col}={value!r}"
        try:
            (run,) = read_runs(path)
            res = project_run(run, None)
        except ValueError as exc:
            out.append(("fuzz: CSV cells", case, "clear", str(exc).splitlines()[0]))
            return
        except Exception as exc:  # noqa: BLE001
            out.append(("fuzz: CSV cells", case, "traceback", f"{type(exc).__name__}: {exc}"))
            return
        if run.error:
            named = col in run.error or "row" in run.error
            out.append(("fuzz: CSV cells", case, "clear" if named else "unclear", run.error))
            return
        v = value.strip()
        if col in _INT_COLS and v and not _clean_int(v):
            out.append(("fuzz: CSV cells", case, "silent", f"{col} read from {value!r}"))
        elif col in _MEASURED and v and not (_finite_positive(v)):
            out.append(("fuzz: CSV cells", case, "silent", f"{col} used: {value!r}"))
        elif res.rel_error is not None and not math.isfinite(res.rel_error):
            out.append(("fuzz: CSV cells", case, "silent", "non-finite error"))
        else:
            out.append(("fuzz: CSV cells", case, "survived", "a valid row"))
    one()


def _finite_positive(v: str) -> bool:
    try:
        x = float(v)
    except ValueError:
        return False
    return math.isfinite(x) and x > 0


def _journals(out, work, n):
    from primus_ext.tune.journal import Journal

    d = work / "fuzz-journal"
    d.mkdir()
    header = {"job": {"model": "m"}, "job_key": "k"}
    good = [{"kind": "trial", "index": i, "source": "search", "verdict": "oom",
             "reason": "x", "candidate": {"tp": 2 ** (i % 4), "pp": i + 1}}
            for i in range(12)]
    counter = iter(range(10**6))
    junk = st.one_of(st.binary(max_size=30).filter(lambda b: b"\n" not in b),
                     st.recursive(st.none() | st.booleans() | st.integers() | st.text(
                         max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(
                         st.sampled_from(["kind", "candidate", "verdict", "source",
                                          "estimate"]), c, max_size=4), max_leaves=6)
                     .map(lambda v: json.dumps(v).encode()))

    @settings(max_examples=n, **_SETTINGS)
    @given(st.lists(st.tuples(st.integers(0, 12), junk), min_size=1, max_size=4),
           st.booleans())
    def one(inserts, torn_tail):
        path = d / f"{next(counter)}" / "trials.jsonl"
        with Journal(path, header) as j:
            for rec in good:
                j.append(rec)
        lines = path.read_bytes().split(b"\n")[:-1]
        for pos, bad in sorted(inserts, reverse=True):
            lines.insert(1 + pos, bad)
        data = b"\n".join(lines) + b"\n" + (b'{"kind": "tri' if torn_tail else b"")
        path.write_bytes(data)
        case = f"{len(inserts)} bad line(s){' + torn tail' if torn_tail else ''}"
        try:
            j = Journal(path, header, resume=True)
            kept = [r for r in j.resumed if r in good]
            j.append(good[0])
            j.close()
        except Exception as exc:  # noqa: BLE001
            out.append(("fuzz: journals", case, "traceback", f"{type(exc).__name__}: {exc}"))
            return
        body = data[:len(data) - (len(b'{"kind": "tri') if torn_tail else 0)]
        if not path.read_bytes().startswith(body):
            out.append(("fuzz: journals", case, "hang-or-corruption", "truncated"))
        elif len(kept) < len(good):
            out.append(("fuzz: journals", case, "silent",
                        f"kept {len(kept)} of {len(good)} good trials"))
        else:
            out.append(("fuzz: journals", case, "survived",
                        f"{len(getattr(j, 'bad_lines', ()))} line(s) skipped and counted"))
    one()


def _valid_profile() -> tuple[dict, list[str]]:
    from primus_ext.config import compose
    from primus_ext.measure.downscale import downscale
    from primus_ext.presets.overrides import spec_overrides
    from primus_ext.project.profile import KindTiming, Profile, rank_shapes

    target = ["model=tiny_dense", "cluster.hardware=cpu", "cluster.gpus_per_node=1",
              "train.seq_length=256", "train.global_batch_size=8",
              "parallel.sequence_parallel=false", "parallel.cp=1"]
    spec = compose(target)
    d = downscale(spec, 1, "cpu")
    kinds = {k: KindTiming(kind=k, num_layers=n, num_samples=6, fwd_s=f, bwd_s=2 * f)
             for k, n, f in (("dense", 2, 0.01), ("embedding", 1, 2e-4), ("output", 1, 2e-3))}
    prof = Profile(created="fuzz", device={"kind": "cpu", "name": "fuzz", "hardware": "cpu",
                                           "count": 1},
                   versions={}, target_overrides=tuple(spec_overrides(spec)),
                   downscale_overrides=d.overrides, rules=d.rules,
                   measured_shapes=rank_shapes(d.spec), measured_parallel={}, layers=kinds,
                   collectives=(), step={"step_s": 0.2, "fwd_bwd_s": 0.15,
                                         "optimizer_s": 0.01, "zero_grad_s": 0.0,
                                         "num_microbatches": 2, "num_params_per_rank": 10**6})
    return prof.to_dict(), target


def _paths_of(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths_of(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths_of(v, prefix + (i,))


def _profiles(out, work, cli, n):
    base, target = _valid_profile()
    paths = sorted(_paths_of(base), key=str)
    d = work / "fuzz-profile"
    d.mkdir()
    counter = iter(range(10**6))
    home = work / "home"

    @settings(max_examples=n, **_SETTINGS)
    @given(st.sampled_from(paths), st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True),
        st.text(max_size=4), st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
        st.booleans())
    def one(path, value, delete):
        prof = copy.deepcopy(base)
        node = prof
        for k in path[:-1]:
            node = node[k]
        if delete and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = value
        p = d / f"{next(counter)}.json"
        p.write_text(json.dumps(prof))
        case = f"{'/'.join(map(str, path))} {'deleted' if delete else '= ' + repr(value)}"
        run = cli(["backend=profile", f"profile={p}", *target, "output=json"], home)
        if run.returncode == 0:
            est = json.loads(run.stdout)
            fine = all(math.isfinite(est[k]) and est[k] > 0 for k in
                       ("step_time_s", "tokens_per_s_per_gpu"))
            out.append(("fuzz: profiles", case, "survived" if fine else "silent",
                        "projected" if fine else f"step_time_s={est['step_time_s']}"))
            return
        outcome, detail = classify_error(run, ("profile",))
        out.append(("fuzz: profiles", case, outcome, detail))
    one()
