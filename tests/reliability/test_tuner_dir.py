"""Issue 15, defects 2-4: a tuner's out_dir is locked for the run, every file in it is
written atomically with a unique temp name, an existing journal is never wiped without
tune.resume=true / tune.overwrite=true, and a bad journal line costs that line only."""
from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tune_fakes import fake_memory, fake_project

from primus_ext.presets import hardware_preset, model_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from primus_ext.tune.journal import read_journal
from primus_ext.tune.run import tune
from primus_ext.util.files import atomic_write_text

SETTINGS = dict(progress=False, reference=None, strategy="guided", budget={"candidates": 30})


def _spec(gbs=128) -> RunSpec:
    return RunSpec(model=ModelSpec(**model_preset("llama3.1_70b")), parallel=ParallelSpec(),
                   train=TrainSpec(seq_length=8192, global_batch_size=gbs),
                   cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=8))


def _tune(out, gbs=128, **extra):
    return tune(_spec(gbs), {**SETTINGS, "out_dir": str(out), **extra},
                memory_fn=fake_memory, project_fn=fake_project)


# ---- defect 2: two tuners, one directory ------------------------------------------
def test_a_second_tuner_on_a_locked_out_dir_fails_at_once(tmp_path):
    from primus_ext.util.files import lock_dir
    out = tmp_path / "recipe"
    with lock_dir(out, "tune.out_dir"):  # the first tuner, still running
        with pytest.raises(ValueError, match=r"tune.out_dir=.* is in use by another run"):
            _tune(out)
        assert not (out / "trials.jsonl").exists()  # it touched nothing
    r = _tune(out)  # the lock is gone with its holder
    assert r.best is not None and (out / "overrides.txt").is_file()


def test_the_lock_is_released_when_the_tuner_fails(tmp_path):
    from primus_ext.util.files import lock_dir
    out = tmp_path / "recipe"

    def interrupted(spec):  # Ctrl-C before any trial finished: tune() raises
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(_spec(), {**SETTINGS, "out_dir": str(out)}, memory_fn=interrupted,
             project_fn=fake_project)
    with lock_dir(out, "tune.out_dir"):  # free again
        pass


def test_out_dir_that_is_a_file_is_one_clear_error(tmp_path):
    f = tmp_path / "recipe"
    f.write_text("not a directory")
    with pytest.raises(ValueError, match=r"tune.out_dir=.* is a file"):
        _tune(f)


def test_png_temp_names_are_unique(tmp_path):
    """The old writer used the fixed temp name .trials.png.tmp: a second writer's temp
    (here a directory in its way) broke the first's PNG."""
    out = tmp_path / "recipe"
    (out / ".trials.png.tmp").mkdir(parents=True)
    r = _tune(out)
    assert "trials_plot" in r.files
    assert (out / "trials.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_concurrent_writers_leave_one_whole_file(tmp_path):
    path = tmp_path / "f.txt"
    texts = [f"{i}\n" * 20000 for i in range(8)]

    def write(t):
        for _ in range(5):
            atomic_write_text(path, t)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]  # no temp file left


# ---- defect 3: an existing journal is not wiped -------------------------------------
def test_existing_journal_is_refused_without_resume_or_overwrite(tmp_path):
    out = tmp_path / "recipe"
    _tune(out, gbs=256)  # another job's journal
    before = (out / "trials.jsonl").read_bytes()
    with pytest.raises(ValueError) as err:
        _tune(out)
    assert "tune.resume=true" in str(err.value) and "tune.overwrite=true" in str(err.value)
    assert (out / "trials.jsonl").read_bytes() == before
    r = _tune(out, overwrite=True)
    header, recs, _ = read_journal(out / "trials.jsonl")
    assert header["job"]["global_batch_size"] == 128 and len(recs) == len(r.trials)


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="exclude each other"):
        _tune(tmp_path / "r", resume=True, overwrite=True)


# ---- defect 4: a bad line in the middle ---------------------------------------------
@pytest.mark.parametrize("bad", [b"{not json", b"[1, 2]", b"42", b'{"kind": "trial"}',
                                 b'{"kind": "trial", "candidate": {}, "source": "x", '
                                 b'"verdict": "ok", "estimate": {"mfu": "high"}}',
                                 b"\xff\xfe garbage"])
def test_a_bad_middle_line_is_skipped_and_counted(tmp_path, bad):
    out = tmp_path / "recipe"
    first = _tune(out)
    path = out / "trials.jsonl"
    lines = path.read_bytes().split(b"\n")
    k = len(lines) // 2
    damaged = b"\n".join(lines[:k] + [bad] + lines[k:])
    path.write_bytes(damaged)
    from primus_ext.tune.journal import scan_journal
    scan = scan_journal(path)
    readable = bad.startswith(b'{"kind": "trial", "candidate"')  # JSON, but no metrics
    assert scan.bad_lines == ([] if readable else [k + 1])
    # nothing after the bad line is lost
    assert len(scan.records) == len(first.trials) + readable
    calls = {"n": 0}

    def counting(spec):
        calls["n"] += 1
        return fake_project(spec)

    r = tune(_spec(), {**SETTINGS, "out_dir": str(out), "resume": True},
             memory_fn=fake_memory, project_fn=counting)
    assert path.read_bytes().startswith(damaged)  # never truncated
    assert r.best.point == first.best.point
    assert calls["n"] <= 1  # every trial came back from the journal (+1: the winner)
    for line in path.read_bytes().split(b"\n")[len(damaged.split(b"\n")):]:
        if line:
            json.loads(line)


_GOOD = [{"kind": "trial", "index": i, "source": "search", "verdict": "oom", "reason": "x",
          "candidate": {"tp": 2 ** (i % 4), "pp": i + 1}} for i in range(10)]
_JUNK = st.one_of(st.binary(max_size=30).filter(lambda b: b"\n" not in b),
                  st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                               lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                   st.sampled_from(["kind", "candidate", "verdict"]), c,
                                   max_size=3), max_leaves=5)
                  .map(lambda v: json.dumps(v).encode()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10), _JUNK), min_size=1, max_size=4))
def test_property_junk_lines_never_cost_a_good_trial(tmp_path_factory, inserts):
    from primus_ext.tune.journal import Journal
    path = tmp_path_factory.mktemp("j") / "trials.jsonl"
    header = {"job": {"model": "m"}, "job_key": "k"}
    with Journal(path, header) as j:
        for rec in _GOOD:
            j.append(rec)
    lines = path.read_bytes().split(b"\n")[:-1]
    for pos, bad in sorted(inserts, key=lambda x: -x[0]):
        lines.insert(1 + pos, bad)
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(data)
    j = Journal(path, header, resume=True)
    j.close()
    assert path.read_bytes() == data  # nothing truncated, nothing rewritten
    assert [r for r in j.resumed if r in _GOOD] == _GOOD
