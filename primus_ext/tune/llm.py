"""LLM investigation loop: a model proposes cross-axis candidates, the projector judges.

Each round the model sees the job, the search axes, the best trials with their
breakdowns (where the step time goes) and what its previous proposals scored; it answers
with a few candidates as JSON, each with a one-line hypothesis. Candidates are validated
(axis names, values on the axes, legality), memory-filtered and projected like any other
trial, then fed back. Rounds stop when one brings no improvement, at ``max_rounds``, or
after ``max_failures`` failed rounds in a row. A malformed answer, an illegal candidate,
a timeout, a 5xx or an unreachable endpoint is logged and survived: the tuner's answer
never depends on the LLM being there.

Any OpenAI-compatible endpoint: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (or
``tune.llm.base_url`` / ``tune.llm.api_key``), ``tune.llm.model``.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field

from primus_ext.tune.evaluate import Evaluator, Trial
from primus_ext.tune.settings import LLMSettings
from primus_ext.tune.space import as_dict, candidate_from_dict, describe

log = logging.getLogger("primus_ext.tune.llm")

SYSTEM_PROMPT = """You are a performance engineer tuning the parallel layout of a \
megatron-core training job. A projector scores every candidate (projected step time, \
tokens/s/GPU, MFU, per-GPU memory); you propose candidates worth scoring. Think across \
axes: a change that only pays off together with another (e.g. more pipeline stages with \
virtual stages and a bigger micro batch; less tensor parallelism once recompute frees \
memory). Use the breakdown of the best trials: it says where the step time goes.

Answer with ONE JSON object and nothing else:
{"candidates": [{"hypothesis": "<one line: why this should be faster>",
                 "changes": {"<axis>": <value>, ...}}]}
"changes" lists only the axes that differ from the incumbent (the best trial so far).
Values must be taken from the axis lists you are given. recompute values are "none", \
"selective" or "full-<uniform|block>-<num_layers>"."""


@dataclass
class LLMRound:
    round: int
    ok: bool
    error: str | None = None
    proposals: list[dict] = field(default_factory=list)  # per candidate: verdict, score
    best_before: float | None = None
    best_after: float | None = None

    def to_record(self) -> dict:
        return {"kind": "llm_round", "round": self.round, "ok": self.ok,
                "error": self.error, "proposals": self.proposals,
                "best_before": self.best_before, "best_after": self.best_after}


def parse_answer(text: str | None) -> list[dict]:
    """The candidate dicts of an answer; ValueError saying what is wrong with it."""
    if not text or not text.strip():
        raise ValueError("empty answer")
    body = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fence:
        body = fence.group(1).strip()
    start = min((i for i in (body.find("{"), body.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"no JSON object in the answer: {text[:120]!r}")
    end = max(body.rfind("}"), body.rfind("]"))
    try:
        data = json.loads(body[start:end + 1])
    except ValueError as exc:
        raise ValueError(f"answer is not valid JSON ({exc}): {text[:120]!r}") from None
    if isinstance(data, dict):
        data = data.get("candidates")
    if not isinstance(data, list):
        raise ValueError("answer has no 'candidates' list")
    return data


class LLMLoop:
    def __init__(self, ev: Evaluator, settings: LLMSettings, job: dict, start,
                 journal=None, client=None):
        self.ev, self.settings, self.job, self.journal = ev, settings, job, journal
        self.start = start  # the point candidates change when nothing fits yet
        self.client = client
        self.rounds: list[LLMRound] = []
        self.note: str | None = None  # why the loop did not run, if it did not

    # ---- transport ------------------------------------------------------------------
    def _client(self):
        if self.client is not None:
            return self.client
        from openai import OpenAI

        s = self.settings
        base_url = s.base_url or os.environ.get("OPENAI_BASE_URL")
        api_key = s.api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            if not base_url:
                raise RuntimeError("no endpoint: set OPENAI_API_KEY (and OPENAI_BASE_URL "
                                   "for a non-OpenAI endpoint) or tune.llm.api_key")
            api_key = "unused"  # local OpenAI-compatible servers often need none
        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=s.timeout_s,
                             max_retries=0)
        return self.client

    def _ask(self, messages: list[dict]) -> str:
        reply = self._client().chat.completions.create(
            model=self.settings.model, messages=messages,
            temperature=self.settings.temperature)
        return reply.choices[0].message.content or ""

    # ---- prompt ---------------------------------------------------------------------
    def _prompt(self, feedback: list[dict] | None) -> str:
        ev, s = self.ev, self.settings
        best = ev.ok_trials()[:s.top_trials]
        trials = [{"candidate": t.candidate, "layout": describe(t.point),
                   "source": t.source, **_figures(t)} for t in best]
        body = {
            "job": self.job,
            "objective": ev.settings.objective + " (higher is better)"
            if ev.settings.objective == "tokens_per_s_per_gpu"
            else ev.settings.objective + " (lower is better)",
            "axes": {a: list(v) for a, v in ev.space.axes.items()},
            "incumbent": best[0].candidate if best else None,
            "best_trials": trials,
            "num_tried": len(ev.trials),
            "rejected_by_reason": dict(ev.rejected),
            "your_last_proposals": feedback or [],
        }
        return (json.dumps(body, indent=1, default=str) +
                f"\n\nPropose up to {s.candidates_per_round} new candidates not tried yet.")

    # ---- loop -----------------------------------------------------------------------
    def run(self) -> list[LLMRound]:
        s = self.settings
        self._client()  # RuntimeError when no endpoint is configured at all
        failures = 0
        feedback: list[dict] | None = None
        for r in range(1, s.max_rounds + 1):
            incumbent = self.ev.best
            rnd = LLMRound(round=r, ok=False,
                           best_before=incumbent.score if incumbent else None)
            messages = [{"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": self._prompt(feedback)}]
            try:
                answer = self._ask(messages)
            except Exception as exc:  # noqa: BLE001 - timeouts, 5xx, refused, bad keys
                rnd.error = f"{type(exc).__name__}: {exc}"
                log.warning("LLM round %d: request failed: %s", r, rnd.error)
            else:
                try:
                    proposals = parse_answer(answer)
                except ValueError as exc:
                    rnd.error = f"malformed answer: {exc}"
                    log.warning("LLM round %d: %s", r, rnd.error)
                    feedback = [{"error": rnd.error,
                                 "fix": "answer with one JSON object as specified"}]
                else:
                    rnd.proposals = self._score(proposals, incumbent)
                    feedback = rnd.proposals
                    # A round none of whose proposals could be scored is a failed round
                    # (the feedback says why), not a sign that nothing is left to find.
                    rnd.ok = any(p.get("verdict") in ("ok", "oom") and
                                 not p.get("already_tried") for p in rnd.proposals)
                    if not rnd.ok:
                        rnd.error = "no proposal could be scored (invalid, illegal, " \
                                    "off the axes or already tried)"
            rnd.best_after = self.ev.best.score if self.ev.best else None
            self.rounds.append(rnd)
            if self.journal is not None:
                self.journal.append(rnd.to_record())
            if not rnd.ok:
                failures += 1
                if failures >= s.max_failures:
                    log.warning("LLM loop stopped after %d failed rounds", failures)
                    break
                continue
            failures = 0
            if rnd.best_before is not None and not (rnd.best_after > rnd.best_before):
                break  # no improvement this round
        return self.rounds

    def _score(self, proposals: list, incumbent: Trial | None) -> list[dict]:
        out = []
        start = incumbent.point if incumbent else self.start
        for raw in proposals[:self.settings.candidates_per_round]:
            entry: dict = {"proposal": raw}
            try:
                if not isinstance(raw, dict):
                    raise ValueError("a candidate must be an object with 'changes'")
                changes = raw.get("changes", raw.get("candidate"))
                if not isinstance(changes, dict):
                    raise ValueError("candidate has no 'changes' object")
                hypothesis = str(raw.get("hypothesis", ""))[:300]
                point = candidate_from_dict(self.ev.space, changes, start)
            except (ValueError, TypeError) as exc:
                entry.update(verdict="invalid", reason=str(exc))
                log.info("LLM candidate rejected: %s", exc)
                out.append(entry)
                continue
            seen = point in self.ev.cache
            trial = self.ev.evaluate(point, "llm", hypothesis=hypothesis, check_space=True,
                                     enforce_budget=False)
            entry.update(candidate=as_dict(point), already_tried=seen, **_figures(trial))
            out.append(entry)
        return out


def _figures(t: Trial) -> dict:
    m = t.metrics or {}
    if t.verdict != "ok":
        return {"verdict": t.verdict, "reason": t.reason}
    return {"verdict": "ok", "tokens_per_s_per_gpu": round(m["tokens_per_s_per_gpu"], 1),
            "step_time_s": round(m["step_time_s"], 4), "mfu": round(m["mfu"], 4),
            "peak_memory_gib": round(m["peak_memory_bytes"] / 2**30, 1),
            "breakdown_s": {k: round(v, 4) for k, v in m["breakdown"].items()}}
