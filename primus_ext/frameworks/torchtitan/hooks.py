"""Per-block timing hooks on a torchtitan decoder (``torchtitan/models/common/decoder.py``:
``tok_embeddings``, ``layers`` (a ModuleDict keyed by the global layer index), ``norm``,
``lm_head``), built on the framework-neutral ``primus_ext.measure.hooks.LayerTimer``.

What differs from megatron-core:

- FSDP2 (``fully_shard``) all-gathers a block's parameters in its forward pre-hook and
  installs the backward all-gather on the block's outputs in its forward post-hook. The
  timer's hooks are registered with ``prepend=True``, so a block's forward includes its
  all-gather and the gradient hook on its output runs before FSDP's pre-backward one (the
  backward all-gather counts in the block's backward), as on the real run's timeline.
- Activation checkpointing wraps each block (``CheckpointWrapper``; with FSDP2,
  ``FSDPCheckpointWrapper``): the recomputation in backward calls the inner module, not
  the wrapper, so the hooks go on the inner block (``_checkpoint_wrapped_module``) and its
  recomputed forward, running inside the backward, is recorded as phase ``recompute``
  (tests/slow/test_torchtitan_hooks.py).
- The lm_head runs inside the loss (``ChunkedLossWrapper`` computes logits chunk by
  chunk; ``_skip_lm_head``), so scope ``output`` runs from the final norm's forward to the
  loss's return (``wrap_loss``), and its backward from the loss's gradient to the norm's
  input gradient.
- The embedding's backward (a scatter-add into its weight, then FSDP's root post-backward)
  has no tensor to hook under FSDP2 (its sharded weight never accumulates a gradient
  through autograd); it runs from layer 0's input gradient to the end of ``backward()``
  (``end_backward``, called by the step wrapper).
"""
from __future__ import annotations

from primus_ext.measure.hooks import LayerTimer


def _inner(module):
    return getattr(module, "_checkpoint_wrapped_module", module)


class TitanTimer(LayerTimer):
    """``LayerTimer`` for one torchtitan model part (pp=1: the whole decoder)."""

    def attach(self, parts: bool = False) -> "TitanTimer":
        m = self.model
        reg = self._handles.append

        def pair(module, scope, start_out=True, end_in=True):
            reg(module.register_forward_pre_hook(self._fwd_pre(scope, end_in),
                                                 with_kwargs=True, prepend=True))
            reg(module.register_forward_hook(self._fwd_post(scope, start_out),
                                             with_kwargs=True, prepend=True))

        self._first_layer = None
        for key, block in m.layers.items():
            block = _inner(block)
            i = int(key)
            self._first_layer = i if self._first_layer is None else min(self._first_layer, i)
            pair(block, f"layer.{i}")
            if parts:
                if getattr(block, "attention", None) is not None:
                    pair(block.attention, f"layer.{i}.attn")
                if getattr(block, "feed_forward", None) is not None:
                    pair(block.feed_forward, f"layer.{i}.mlp")
        if getattr(m, "tok_embeddings", None) is not None:
            pair(m.tok_embeddings, "embedding", start_out=True, end_in=False)
        if getattr(m, "norm", None) is not None:
            reg(m.norm.register_forward_pre_hook(self._fwd_pre("output", True),
                                                 with_kwargs=True, prepend=True))
        reg(m.register_forward_pre_hook(self._root_pre, with_kwargs=True, prepend=True))
        return self

    def _bwd_end(self, scope: str):
        inner = super()._bwd_end(scope)

        def hook(grad):
            inner(grad)
            # The embedding's backward starts when the first block's input grad is done.
            if self.enabled and scope == f"layer.{self._first_layer}" and \
                    getattr(self.model, "tok_embeddings", None) is not None:
                self._bwd_stack.append("embedding")
                self._start("embedding", "bwd")
        return hook

    def wrap_loss(self, loss_fn):
        """The loss callable with the end of scope ``output`` (forward) and the start of
        its backward (a hook on the loss) around it."""
        post = self._fwd_post("output", True)

        def loss(*args, **kwargs):
            out = loss_fn(*args, **kwargs)
            value = out[0] if isinstance(out, (tuple, list)) else out
            if self.enabled and getattr(self.model, "norm", None) is not None:
                post(None, (), {}, value)
            return out
        loss.__wrapped__ = loss_fn
        return loss

    def end_backward(self) -> None:
        if self.enabled:
            self._stop("embedding", "bwd")
        super().end_backward()
