"""Per-layer timing hooks on a megatron-core GPTModel.

Forward: ``register_forward_pre_hook`` / ``register_forward_hook`` (``with_kwargs=True``:
TransformerBlock calls its layers with keyword arguments). Backward: module full
backward hooks are useless on TransformerLayer (they see no tensor inputs and fire at
once, reference/megatron-on-cpu.md Sec. 3), so tensor hooks are used instead: a hook on
the layer's output ``output[0]`` fires when its gradient arrives (backward of the layer
starts), a hook on the layer's input ``hidden_states`` fires when the input gradient is
complete (backward of the layer ends). The same pair times ``self_attention`` and
``mlp`` inside each layer, the embedding (its backward ends when the word-embedding
weight's gradient is accumulated) and the output layer with the loss (final norm input
to the model's output).

Clocks: CUDA events on a GPU (read after a synchronize at the end of a step); on the CPU
every op is synchronous, so ``time.perf_counter`` at the hook is the op boundary.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch


class CpuClock:
    name = "perf_counter"

    def mark(self):
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return b - a

    def synchronize(self) -> None:
        pass


class CudaClock:
    name = "cuda_events"

    def mark(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def make_clock():
    return CudaClock() if torch.cuda.is_available() else CpuClock()


def _first_tensor(args, kwargs, name="hidden_states"):
    x = kwargs.get(name) if kwargs else None
    if x is None and args:
        x = args[0]
    return x if torch.is_tensor(x) else None


def _out_tensor(output):
    if isinstance(output, (tuple, list)):
        output = output[0] if output else None
    return output if torch.is_tensor(output) else None


class LayerTimer:
    """Interval timings per (scope, phase) over the steps it is enabled for.

    Scopes: ``layer.<i>`` (0-based global decoder layer), ``layer.<i>.attn``,
    ``layer.<i>.mlp``, ``embedding``, ``output`` (final norm + output layer + loss).
    Phases: ``fwd``, ``bwd``, and ``recompute`` (a layer forward that runs while a
    backward is in progress, as under full recompute).
    """

    def __init__(self, model: torch.nn.Module, clock=None) -> None:
        self.model = model  # the bare GPTModel
        self.clock = clock or make_clock()
        self.enabled = False
        self._handles: list = []
        self._pending: list[tuple[str, str, object, object]] = []  # scope, phase, a, b
        self._open: dict[tuple[str, str], object] = {}
        self._fwd_stack: list[str] = []
        self._bwd_stack: list[str] = []
        self._in_backward = False
        self.samples: dict[tuple[str, str], list[float]] = defaultdict(list)
        # The same samples grouped by step: per_step[(scope, phase)][k] = step k's.
        self.per_step: dict[tuple[str, str], list[list[float]]] = defaultdict(list)

    # ---- scope for the collective tracer -------------------------------------------
    def scope(self) -> tuple[str, str]:
        if self._in_backward:
            return (self._bwd_stack[-1] if self._bwd_stack else "backward"), "bwd"
        if self._fwd_stack:
            return self._fwd_stack[-1], "fwd"
        return "step", "step"

    # ---- interval bookkeeping ------------------------------------------------------
    def _start(self, scope: str, phase: str) -> None:
        self._open[(scope, phase)] = self.clock.mark()

    def _stop(self, scope: str, phase: str) -> None:
        a = self._open.pop((scope, phase), None)
        if a is not None:
            self._pending.append((scope, phase, a, self.clock.mark()))

    def collect(self) -> None:
        """Turn the marks of the finished step into seconds (synchronises CUDA)."""
        self.clock.synchronize()
        step: dict[tuple[str, str], list[float]] = defaultdict(list)
        for scope, phase, a, b in self._pending:
            step[(scope, phase)].append(self.clock.seconds(a, b))
        for key, xs in step.items():
            self.samples[key].extend(xs)
            self.per_step[key].append(xs)
        self._pending.clear()
        self._open.clear()
        self._fwd_stack.clear()
        self._bwd_stack.clear()
        self._in_backward = False

    def reset(self) -> None:
        self._pending.clear()
        self.samples.clear()
        self.per_step.clear()

    # ---- hooks ---------------------------------------------------------------------
    def _fwd_pre(self, scope: str, grad_end_on_input: bool):
        def hook(module, args, kwargs):
            if not self.enabled:
                return
            phase = "recompute" if self._in_backward else "fwd"
            self._fwd_stack.append(scope)
            self._start(scope, phase)
            x = _first_tensor(args, kwargs)
            if (grad_end_on_input and phase == "fwd" and x is not None
                    and x.requires_grad):
                x.register_hook(self._bwd_end(scope))
        return hook

    def _fwd_post(self, scope: str, grad_start_on_output: bool):
        def hook(module, args, kwargs, output):
            if not self.enabled:
                return
            phase = "recompute" if self._in_backward else "fwd"
            self._stop(scope, phase)
            if self._fwd_stack and self._fwd_stack[-1] == scope:
                self._fwd_stack.pop()
            y = _out_tensor(output)
            if grad_start_on_output and phase == "fwd" and y is not None and y.requires_grad:
                y.register_hook(self._bwd_start(scope))
        return hook

    def _bwd_start(self, scope: str):
        def hook(grad):
            if self.enabled:
                self._in_backward = True
                self._bwd_stack.append(scope)
                self._start(scope, "bwd")
        return hook

    def _bwd_end(self, scope: str):
        def hook(grad):
            if self.enabled:
                self._stop(scope, "bwd")
                # A layer's input is the previous layer's output: its end hook may run
                # after the previous layer's start hook, so the scope need not be on top.
                for k in range(len(self._bwd_stack) - 1, -1, -1):
                    if self._bwd_stack[k] == scope:
                        del self._bwd_stack[k]
                        break
                if scope == "embedding" and not self._bwd_stack:
                    self._in_backward = False  # the embedding's backward comes last
        return hook

    def attach(self, parts: bool = True) -> "LayerTimer":
        """Install the hooks; ``parts=False`` times whole layers only (on a CPU every
        hook is Python on the critical path, so fewer hooks bias the times less)."""
        m = self.model
        reg = self._handles.append

        def pair(module, scope, start_out=True, end_in=True):
            reg(module.register_forward_pre_hook(self._fwd_pre(scope, end_in),
                                                 with_kwargs=True))
            reg(module.register_forward_hook(self._fwd_post(scope, start_out),
                                             with_kwargs=True))

        for layer in m.decoder.layers:
            i = layer.layer_number - 1
            pair(layer, f"layer.{i}")
            if not parts:
                continue
            if getattr(layer, "self_attention", None) is not None:
                pair(layer.self_attention, f"layer.{i}.attn")
            core = getattr(getattr(layer, "self_attention", None), "core_attention", None)
            if core is not None:  # forward only: prices selective recompute
                pair(core, f"layer.{i}.core_attn", start_out=False, end_in=False)
            if getattr(layer, "mlp", None) is not None:
                pair(layer.mlp, f"layer.{i}.mlp")
        if getattr(m, "embedding", None) is not None and getattr(m, "pre_process", True):
            pair(m.embedding, "embedding", start_out=True, end_in=False)
            weight = m.embedding.word_embeddings.weight
            reg(weight.register_post_accumulate_grad_hook(
                lambda p: self._bwd_end("embedding")(None)))
        if getattr(m, "post_process", True) and getattr(m, "output_layer", None) is not None:
            norm = getattr(m.decoder, "final_layernorm", None)
            head = norm if norm is not None else m.output_layer
            # Output + loss: from the final norm's forward to the model's output (the
            # per-token loss); backward from the loss gradient to the norm's input grad.
            reg(head.register_forward_pre_hook(self._fwd_pre("output", True),
                                               with_kwargs=True))
            reg(m.register_forward_hook(self._fwd_post("output", True), with_kwargs=True))
        # The root marks a new forward: a backward still flagged as running is over.
        reg(m.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        return self

    def end_backward(self) -> None:
        """Mark the backward over (before an optimizer step, for the tracer's scope)."""
        self._in_backward = False
        self._bwd_stack.clear()

    def _root_pre(self, module, args, kwargs):
        self._in_backward = False
        self._bwd_stack.clear()

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- results -------------------------------------------------------------------
    def medians(self) -> dict[tuple[str, str], float]:
        return {k: _median(v) for k, v in self.samples.items() if v}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
