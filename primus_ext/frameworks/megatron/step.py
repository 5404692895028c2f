"""One training step of a built megatron-core model on synthetic data.

Mock data are random tokens (the same on every rank of a tensor/context/pipeline group,
different per data-parallel rank, as a real data loader gives them); the step is
Megatron-LM's: zero the DDP grad buffers and the optimizer, ``get_forward_backward_func()``
over the microbatches, ``optimizer.step()``.
"""
from __future__ import annotations

import time
from functools import partial

import torch

from primus_ext.frameworks.megatron.build import Built


class MockData:
    """Infinite iterator of microbatches: tokens, labels, loss mask, positions."""

    def __init__(self, vocab_size: int, seq_length: int, micro_batch_size: int,
                 seed: int) -> None:
        self.vocab, self.seq, self.mbs = vocab_size, seq_length, micro_batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if torch.cuda.is_available() else torch.device("cpu"))

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        toks = torch.randint(0, self.vocab, (self.mbs, self.seq + 1), generator=self.gen)
        pos = torch.arange(self.seq).unsqueeze(0).expand(self.mbs, -1)
        batch = {"tokens": toks[:, :-1].contiguous(), "labels": toks[:, 1:].contiguous(),
                 "loss_mask": torch.ones(self.mbs, self.seq), "position_ids": pos}
        return {k: v.to(self.device) for k, v in batch.items()}


def data_iterators(built: Built, seed: int = 1234) -> list:
    """One iterator per model chunk (the same stream: every chunk consumes the same
    microbatches). Seeded by data-parallel rank only."""
    from megatron.core import parallel_state as ps
    dp_rank = ps.get_data_parallel_rank(with_context_parallel=False)
    s = built.spec
    return [MockData(s.model.vocab_size, s.train.seq_length, s.train.micro_batch_size,
                     seed + 1000 * dp_rank) for _ in built.model]


def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask) / mask.sum()
    return loss, {"lm loss": loss.detach()}


def forward_step(data_iterator, model):
    from megatron.core import parallel_state as ps
    batch = next(data_iterator)
    if ps.get_context_parallel_world_size() > 1:
        from megatron.core.utils import get_batch_on_this_cp_rank
        batch = get_batch_on_this_cp_rank(batch)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, partial(_loss_func, batch["loss_mask"])


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def train_step(built: Built, iters: list, num_microbatches: int) -> dict:
    """One step; returns {'step_s', 'zero_grad_s', 'fwd_bwd_s', 'optimizer_s',
    'finalize_s' (the gradient sync inside fwd_bwd_s: build.FINALIZE_S), 'loss'}."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    s = built.spec
    _sync()
    t0 = time.perf_counter()
    for chunk in built.model:
        chunk.zero_grad_buffer()
    if built.optimizer is not None:
        built.optimizer.zero_grad()
    _sync()
    tz = time.perf_counter()
    from primus_ext.frameworks.megatron.build import FINALIZE_S
    FINALIZE_S[0] = 0.0
    fwd_bwd = get_forward_backward_func()
    out = fwd_bwd(forward_step_func=forward_step,
                  data_iterator=iters if len(iters) > 1 else iters[0],
                  model=built.model if len(built.model) > 1 else built.model[0],
                  num_microbatches=num_microbatches, seq_length=s.train.seq_length,
                  micro_batch_size=s.train.micro_batch_size, forward_only=False)
    _sync()
    t1 = time.perf_counter()
    if built.optimizer is not None:
        built.optimizer.step()
    _sync()
    t2 = time.perf_counter()
    losses = [o["lm loss"] for o in out if isinstance(o, dict) and "lm loss" in o]
    loss = float(torch.stack(losses).mean()) if losses else float("nan")
    return {"step_s": t2 - t0, "zero_grad_s": tz - t0, "fwd_bwd_s": t1 - tz,
            "optimizer_s": t2 - t1, "finalize_s": FINALIZE_S[0], "loss": loss}
