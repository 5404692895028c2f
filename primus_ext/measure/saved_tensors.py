"""Exact count of the activation bytes autograd keeps for backward, per module scope.

Method (reference/megatron-on-cpu.md, Sec. 4):

- a ``torch.autograd.graph.saved_tensors_hooks`` pack hook wraps every saved tensor in a
  small holder object that records the scope (layer) active when it was saved, set by
  forward pre/post hooks on the modules named in ``scopes``;
- parameters are skipped (their storage is in the set of parameter storages; with mcore
  DDP and the distributed optimizer a parameter is a view of the param buffer, whose
  storage is in that set too);
- at the end of the forward only holders still alive count (a ``weakref.WeakSet``, after
  ``gc.collect()``): mcore runs bias-dropout-add under ``torch.enable_grad()`` even inside
  the ``no_grad`` forward of a full-recompute checkpoint, which saves tensors that die at
  once; counting raw pack calls would include them;
- bytes are deduplicated by storage (``untyped_storage().data_ptr()`` among live tensors,
  which cannot share addresses): Q, K and V are views of one QKV storage, a saved view
  keeps its whole storage alive, and one tensor saved by two ops is held once;
- dropout can be routed to ``torch.native_dropout`` while counting ("GPU-like"): on CPU,
  ``F.dropout`` saves an input-dtype noise tensor, on CUDA a bool mask (1 byte/element).

The counter also tags each holder with the microbatch (one per forward of a ``roots``
module) it was saved in, so a pipeline run can report how many microbatches' activations
are alive after each forward (the in-flight count at a stage's peak).

Self-contained: needs only torch. megatron-core modules are passed in by the caller.
"""
from __future__ import annotations

import gc
import weakref
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

OUTSIDE = "outside"


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor holding the storage: a DTensor's local shard (TP and FSDP2 through
    DTensor save DTensors, wrapper subclasses without a storage of their own)."""
    return getattr(tensor, "_local_tensor", tensor)


class _Holder:
    """What the autograd graph stores instead of the saved tensor."""

    __slots__ = ("tensor", "scope", "microbatch", "site", "__weakref__")

    def __init__(self, tensor: torch.Tensor, scope: str, microbatch: int,
                 site: str = "") -> None:
        self.tensor = tensor
        self.scope = scope
        self.microbatch = microbatch
        self.site = site


def _call_site() -> str:
    """Innermost megatron frame that saved the tensor (debugging aid, slow)."""
    import traceback
    for frame in reversed(traceback.extract_stack(limit=40)):
        if "megatron" in frame.filename:
            return f"{frame.filename.split('megatron/')[-1]}:{frame.lineno}"
    return ""


@dataclass(frozen=True, slots=True)
class SavedStorage:
    """One live storage held for backward."""

    scope: str
    microbatch: int
    nbytes: int
    shape: tuple[int, ...]  # shape of the (first) saved tensor viewing it
    dtype: str
    producer: str  # grad_fn of the saved tensor, or "leaf"/"no_grad"
    site: str = ""  # megatron file:line that saved it (with record_sites=True)
    data_ptr: int = 0  # of the storage (to match it with known buffers)


def _gpu_like_dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout as CUDA does it: output plus a bool mask (the mask is what is saved)."""
    if not training or p == 0.0:
        return input
    out, _mask = torch.native_dropout(input, p, True)
    if inplace:
        with torch.no_grad():
            input.copy_(out)
        return input
    return out


@dataclass
class SavedTensorCounter:
    """Count saved-for-backward storages per scope.

    ``scopes`` maps a scope name to a module; a tensor saved while a module's forward is
    running is attributed to the innermost such module (``OUTSIDE`` when none is).
    ``roots``: modules whose forward marks one microbatch (one per model chunk under
    interleaving: then a "microbatch" is a chunk-microbatch).
    """

    scopes: dict[str, torch.nn.Module]
    params: list[torch.nn.Parameter] = field(default_factory=list)
    roots: list[torch.nn.Module] = field(default_factory=list)
    gpu_like_dropout: bool = True
    record_sites: bool = False  # debugging: remember the megatron line of each save
    _holders: "weakref.WeakSet[_Holder]" = field(default_factory=weakref.WeakSet)
    _stack: list[str] = field(default_factory=list)
    _param_ptrs: set[int] = field(default_factory=set)
    _microbatch: int = -1
    _hooks: list = field(default_factory=list)
    inflight_after_forward: list[int] = field(default_factory=list)
    live_bytes_after_forward: list[int] = field(default_factory=list)

    # ---- hooks --------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor):
        if _plain(tensor).untyped_storage().data_ptr() in self._param_ptrs:
            return tensor
        holder = _Holder(tensor, self._stack[-1] if self._stack else OUTSIDE,
                         self._microbatch, _call_site() if self.record_sites else "")
        self._holders.add(holder)
        return holder

    @staticmethod
    def _unpack(obj):
        return obj.tensor if isinstance(obj, _Holder) else obj

    def _enter_scope(self, name: str):
        def pre(module, args, kwargs=None):
            self._stack.append(name)
        return pre

    def _exit_scope(self, name: str):
        def post(module, args, *rest):
            # A scope exits in order; tolerate a module that raised mid-forward.
            while self._stack and self._stack.pop() != name:
                pass
        return post

    def _root_pre(self, module, args, kwargs=None):
        self._microbatch += 1

    def _root_post(self, module, args, *rest):
        gc.collect()
        live = self.storages()
        self.inflight_after_forward.append(len({s.microbatch for s in live}))
        self.live_bytes_after_forward.append(sum(s.nbytes for s in live))

    @contextmanager
    def counting(self):
        """Install the hooks (and GPU-like dropout) for the enclosed forward passes."""
        self._param_ptrs = {_plain(p).untyped_storage().data_ptr() for p in self.params}
        for name, module in self.scopes.items():
            self._hooks.append(module.register_forward_pre_hook(self._enter_scope(name)))
            self._hooks.append(module.register_forward_hook(self._exit_scope(name)))
        for root in self.roots:
            self._hooks.append(root.register_forward_pre_hook(self._root_pre))
            self._hooks.append(root.register_forward_hook(self._root_post))
        saved_dropout = torch.nn.functional.dropout
        if self.gpu_like_dropout:
            torch.nn.functional.dropout = _gpu_like_dropout
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            torch.nn.functional.dropout = saved_dropout
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            self._stack.clear()

    # ---- results ------------------------------------------------------------------
    def storages(self) -> list[SavedStorage]:
        """Live saved storages, deduplicated, each attributed to its first saver."""
        seen: dict[int, SavedStorage] = {}
        holders = sorted(list(self._holders), key=lambda h: (h.microbatch,))
        for h in holders:
            src = h.tensor
            t = _plain(src)
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr in seen or st.nbytes() == 0:
                continue
            fn = src.grad_fn
            producer = type(fn).__name__ if fn is not None else (
                "leaf" if src.requires_grad else "no_grad")
            seen[ptr] = SavedStorage(scope=h.scope, microbatch=h.microbatch,
                                     nbytes=st.nbytes(), shape=tuple(t.shape),
                                     dtype=str(t.dtype).replace("torch.", ""),
                                     producer=producer, site=h.site, data_ptr=ptr)
        return list(seen.values())

    def bytes_by_scope(self, microbatch: int | None = None) -> dict[str, int]:
        """Live saved bytes per scope (of one microbatch, or all)."""
        gc.collect()
        out: dict[str, int] = defaultdict(int)
        for s in self.storages():
            if microbatch is None or s.microbatch == microbatch:
                out[s.scope] += s.nbytes
        return dict(out)

    def details(self, scope: str | None = None) -> list[SavedStorage]:
        gc.collect()
        return [s for s in self.storages() if scope is None or s.scope == scope]


def gpt_scopes(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Scopes of a megatron-core GPTModel: embedding, layer.<global number>,
    final_norm, output_layer, mtp. Works on the bare GPTModel (unwrap DDP and
    Float16Module first)."""
    scopes: dict[str, torch.nn.Module] = {}
    if getattr(model, "embedding", None) is not None:
        scopes["embedding"] = model.embedding
    decoder = getattr(model, "decoder", None)
    if decoder is not None:
        for layer in decoder.layers:
            scopes[f"layer.{layer.layer_number - 1}"] = layer
        if getattr(decoder, "final_layernorm", None) is not None:
            scopes["final_norm"] = decoder.final_layernorm
    if getattr(model, "output_layer", None) is not None:
        scopes["output_layer"] = model.output_layer
    if getattr(model, "mtp", None) is not None:
        scopes["mtp"] = model.mtp
    return scopes


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model
