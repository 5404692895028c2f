"""The measurement plan (measure/plan.py) on real launch lines: NVIDIA's Llama 3 8B FP8
script does not fit a 6 GiB CPU budget as requested (the memory model says so), the plan
shrinks it in the documented order until it does, a small model is left as requested,
and a budget nothing fits gives the one line that points to the analytic backend."""
from __future__ import annotations

import json
from pathlib import Path

from primus_ext.frameworks.megatron.args import parse_launch_args
from primus_ext.measure.downscale import downscale
from primus_ext.measure.plan import GIB, Candidate, candidate_cost, plan_measurement

DATA = Path(__file__).resolve().parents[1] / "data" / "launch_scripts"


def _target(name: str):
    flags = json.loads((DATA / f"{name}.json").read_text())["flags"]
    return parse_launch_args(flags + ["--project-only", "--target-nodes", "1",
                                      "--target-gpus-per-node", "8",
                                      "--target-hardware", "h100"]).spec


def _down(target, world):
    return lambda c: downscale(target, world, "cpu", layers_per_kind=c.layers_per_kind,
                               num_microbatches=c.num_microbatches,
                               seq_length=c.seq_length, vocab_size=c.vocab_size).spec


def _plan(target, world=1, budget_gib=6.0, seconds=150.0, capture=True):
    req = Candidate(layers_per_kind=1 if capture else 2,
                    num_microbatches=1 if capture else 2, optimizer=not capture)
    return plan_measurement(target, _down(target, world), req, hardware="cpu",
                            use_te=False, num_processes=world,
                            budget_bytes=int(budget_gib * GIB), seconds_budget=seconds,
                            base_bytes=512 << 20, warmup=0 if capture else 2,
                            repeats=1 if capture else 3, capture=capture,
                            contention=False, cuda=False)


def test_llama3_8b_line_is_shrunk_until_it_fits_a_cpu():
    t = _target("mlm_llama3_8b_h100_fp8")
    req = Candidate(layers_per_kind=1, num_microbatches=1, optimizer=False)
    full, _ = candidate_cost(t, _down(t, 1)(req), req, use_te=False, passes=1,
                             base_bytes=0, cuda=False)
    assert full > 6 * GIB  # 128k vocabulary, 8k unfused attention: the blow-up
    p = _plan(t)
    assert p.fits and p.total_bytes <= 6 * GIB and p.seconds <= 150
    c = p.candidate
    assert c.vocab_size is not None and c.vocab_size < t.model.vocab_size
    assert c.seq_length is not None and c.seq_length < t.train.seq_length
    assert [s.split(":")[0] for s in p.steps] == ["vocab", "seq"]
    # Two processes share the budget: each gets a smaller run.
    p2 = _plan(t, world=2)
    assert p2.fits and p2.total_bytes <= 6 * GIB
    assert p2.candidate.seq_length <= c.seq_length


def test_plan_rules_reach_the_downscale():
    t = _target("mlm_llama3_8b_h100_fp8")
    d = downscale(t, 1, "cpu", layers_per_kind=1, num_microbatches=1, seq_length=1024,
                  vocab_size=2048)
    assert d.spec.train.seq_length == 1024 and d.spec.model.vocab_size == 2048
    assert any(r.startswith("seq: 8192 -> 1024") for r in d.rules)
    assert any(r.startswith("vocab: ") for r in d.rules)


def test_same_hardware_small_model_keeps_the_request():
    flags = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
             "--seq-length", "256", "--max-position-embeddings", "256",
             "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16",
             "--vocab-size", "1023", "--tokenizer-type", "NullTokenizer"]
    t = parse_launch_args(flags + ["--target-hardware", "cpu", "--target-nodes", "1",
                                   "--target-gpus-per-node", "1"]).spec
    p = _plan(t, capture=False)
    assert p.fits and p.steps == ()
    assert p.candidate == Candidate(layers_per_kind=2, num_microbatches=2, optimizer=True)


def test_nothing_fits_says_what_it_needs_and_points_to_simulate():
    t = _target("mlm_llama3_8b_h100_fp8")
    p = _plan(t, budget_gib=0.5)
    assert not p.fits
    line = p.need_line(t)
    assert "\n" not in line and "--projection-backend simulate" in line
    assert f"{p.total_bytes / GIB:.1f} GiB" in line


def test_cpu_proof_targets_are_measured_as_requested():
    """docs/cpu-proof.md's targets fit a CPU as they are: the plan changes nothing, so
    the proof measures what it always measured (scripts/cpu_proof.py's configurations,
    its measurement options, two processes sharing the budget)."""
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "scripts" / "cpu_proof.py"
    spec = importlib.util.spec_from_file_location("cpu_proof_for_plan", path)
    cp = importlib.util.module_from_spec(spec)
    import sys
    sys.modules[spec.name] = cp  # its dataclasses look their module up
    spec.loader.exec_module(cp)
    from primus_ext.frameworks.megatron.args import parse_megatron_args
    for quick in (False, True):
        for c in cp.configs(quick):
            t = parse_megatron_args(cp._target_flags(c))
            world = cp.measure_procs(c)
            req = Candidate(layers_per_kind=2, num_microbatches=4, optimizer=True)
            p = plan_measurement(t, _down(t, world), req, hardware="cpu", use_te=False,
                                 num_processes=2, budget_bytes=6 * GIB,
                                 seconds_budget=150.0, base_bytes=512 << 20, warmup=2,
                                 repeats=16, capture=False, contention=True, cuda=False)
            assert p.fits and p.steps == () and p.candidate == req, (quick, c.name)


def test_the_host_rate_costs_the_plan():
    """The plan costs a candidate at the rates this machine reaches (host_rate.py): a CPU
    whose bf16 GEMMs run 20x below the preset's figure gets GEMM-bound estimates about
    20x longer, and a plan that is smaller or says it does not fit."""
    t = _target("mlm_llama3_8b_h100_fp8")
    req = Candidate(layers_per_kind=1, num_microbatches=1, optimizer=False,
                    vocab_size=2048, seq_length=1024)
    slow = {"bf16_tflops": 0.005, "fp32_tflops": 0.1}
    kw = dict(use_te=False, passes=1, base_bytes=0, cuda=False)
    b0, s0 = candidate_cost(t, _down(t, 1)(req), req, **kw)
    b1, s1 = candidate_cost(t, _down(t, 1)(req), req, host_rates=slow, **kw)
    assert b1 == b0 and 10 < s1 / s0 <= 20
    fast = _plan(t)

    def with_rates(rates):
        return plan_measurement(t, _down(t, 1), Candidate(layers_per_kind=1,
                                num_microbatches=1, optimizer=False), hardware="cpu",
                                use_te=False, num_processes=1, budget_bytes=6 * GIB,
                                seconds_budget=150.0, base_bytes=512 << 20, warmup=0,
                                repeats=1, capture=True, contention=False, cuda=False,
                                host_rates=rates)
    assert with_rates(None) == fast
    p = with_rates(slow)
    assert p.seconds > fast.seconds or not p.fits
    assert p.candidate.seq_length <= fast.candidate.seq_length
    if p.fits:
        assert p.seconds <= 150.0
