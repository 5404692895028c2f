"""Issue 15, defect 5 (and the unclear messages of 9): every spec field is checked for its
type, from the command line and through dataclasses.replace in Python."""
from __future__ import annotations

import dataclasses
import math
import types
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import primus_ext
from primus_ext.config import compose
from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, HardwareSpec, ModelSpec, ParallelSpec, TrainSpec
from primus_ext.tune.settings import TuneSettings

BASE = compose([])


def test_fsdp_off_is_an_error_not_fsdp_on():
    with pytest.raises(ValueError, match=r"parallel.fsdp='off' must be a boolean"):
        compose(["parallel.fsdp=off"])


def test_fsdp_off_through_dataclasses_replace():
    with pytest.raises(ValueError, match=r"parallel.fsdp='off' must be a boolean"):
        dataclasses.replace(BASE.parallel, fsdp="off")
    with pytest.raises(ValueError, match=r"train.te='yes'"):
        dataclasses.replace(BASE.train, te="yes")


def _parts():
    hw = hardware_preset("h100")
    return {"model": BASE.model, "parallel": BASE.parallel, "train": BASE.train,
            "cluster": BASE.cluster, "hardware": hw}


def _wrong_values(hint):
    """Values of another type than the annotation ``hint`` allows."""
    kinds = set(typing.get_args(hint)) if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else {hint}
    kinds.discard(type(None))
    (kind,) = kinds
    if kind is bool:
        return ["off", 1]
    if kind is int:
        return ["abc", 2.5, True]
    if kind is float:
        return ["abc", True, float("nan"), float("inf")]
    if kind is str:
        return [1, True, 2.5]
    if typing.get_origin(kind) is tuple:
        return ["abc", (object(),)]
    return []


_CASES = [(owner, f.name, bad) for owner, obj in _parts().items()
          for f in dataclasses.fields(obj)
          if f.init and not (owner == "cluster" and f.name == "hardware")
          for bad in _wrong_values(typing.get_type_hints(type(obj))[f.name])]


@pytest.mark.parametrize("owner,name,bad", _CASES,
                         ids=[f"{o}.{n}={b!r}" for o, n, b in _CASES])
def test_every_field_refuses_another_type(owner, name, bad):
    obj = _parts()[owner]
    with pytest.raises(ValueError, match=rf"{owner}\.{name}="):
        dataclasses.replace(obj, **{name: bad})


def test_the_check_covers_every_field():
    counted = {(o, n) for o, n, _ in _CASES}
    for owner, obj in _parts().items():
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.init and not isinstance(v, (HardwareSpec, dict)):
                assert (owner, f.name) in counted, (owner, f.name)


@settings(max_examples=60)
@given(st.sampled_from(["parallel.tp", "parallel.sequence_parallel", "train.seq_length",
                        "train.precision", "model.num_layers", "cluster.num_nodes",
                        "parallel.fsdp", "train.recompute_granularity"]),
       st.one_of(st.text(alphabet="abcxyz0123456789.-", min_size=1, max_size=6),
                 st.sampled_from(["off", "on", "yes", "no", "1e3", "nan", "inf", "-1",
                                  "0", "[1,2]", "{a:1}", "null", "true"])))
def test_property_overrides_give_a_spec_or_one_error_naming_the_key(key, value):
    try:
        spec = compose([f"{key}={value}"])
    except ValueError as exc:
        group = key.split(".")[0]
        assert group in str(exc) or "world size" in str(exc) or "interleaved" in str(exc) \
            or "global_batch_size" in str(exc), str(exc)
        return
    except Exception as exc:  # noqa: BLE001
        # Hydra's own grammar errors name the override
        assert type(exc).__module__.startswith(("hydra", "omegaconf")), repr(exc)
        return
    group, field = key.split(".")
    got = getattr(getattr(spec, group), field)
    # What was accepted has the field's type: booleans are booleans, counts are counts.
    ref = getattr(getattr(BASE, group), field)
    if isinstance(ref, bool):
        assert isinstance(got, bool)
    elif isinstance(ref, int):
        assert isinstance(got, int) and not isinstance(got, bool) and got >= 1
    if isinstance(got, float):
        assert math.isfinite(got)


def test_unclear_messages_are_clear_now():
    with pytest.raises(ValueError) as err:
        compose(["parallel.tp=abc"])
    assert "parallel.tp='abc'" in str(err.value)
    assert "sequence_parallel" not in str(err.value)
    with pytest.raises(ValueError) as err:
        compose(["+cluster.hardware_overrides.gemm_efficiency=abc"])
    assert "cluster.hardware_overrides.gemm_efficiency='abc' must be a number" \
        in str(err.value)
    with pytest.raises(ValueError, match=r"tune.budget.candidates=0"):
        TuneSettings.from_dict({"budget": {"candidates": 0}})
    with pytest.raises(ValueError, match=r"tune.resume='off' must be a boolean"):
        TuneSettings.from_dict({"resume": "off"})


def test_python_api_misuse_is_named():
    with pytest.raises(TypeError, match=r"compose\(overrides='p'\).*list of Hydra override"):
        primus_ext.compose("p")
    with pytest.raises(TypeError, match=r"project\(spec=None\): spec must be a RunSpec"):
        primus_ext.project(None)
    with pytest.raises(TypeError, match=r"memory\(spec=None\)"):
        primus_ext.memory(None)


def test_names_are_one_printable_line():
    with pytest.raises(ValueError, match=r"model.name='x\\ntouch PWNED\\ny' must be one line"):
        compose(["model.name='x\ntouch PWNED\ny'"])
    for ok in ("llama 3 (run #2)", "ünï-cödé", "$(x) `y` 'z'"):
        assert dataclasses.replace(BASE.model, name=ok).name == ok


def test_cluster_and_model_types():
    with pytest.raises(ValueError, match=r"cluster.gpu_hour_cost='cheap'"):
        ClusterSpec(hardware=hardware_preset("h100"), gpu_hour_cost="cheap")
    with pytest.raises(ValueError, match=r"model.hidden_dropout=nan"):
        dataclasses.replace(BASE.model, hidden_dropout=float("nan"))
    assert TrainSpec(recompute_modules=["core_attn"]).recompute_modules == ("core_attn",)
    assert ParallelSpec(pipeline_layout=None).pipeline_layout is None
    assert ModelSpec(name="m", num_layers=2, hidden_size=64, num_attention_heads=4,
                     hidden_dropout=0).hidden_dropout == 0  # an int is a number


def test_python_api_misuse_after_the_subpackages_are_imported():
    """primus_ext.project / .memory become the (callable) subpackages once imported."""
    import primus_ext.memory  # noqa: F401
    import primus_ext.project  # noqa: F401
    with pytest.raises(TypeError, match=r"project\(spec=None\): spec must be a RunSpec"):
        primus_ext.project(None)
    with pytest.raises(TypeError, match=r"memory\(spec='x'\)"):
        primus_ext.memory("x")
