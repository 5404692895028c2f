"""Pipeline splits Megatron-LM accepts where the layers do not divide over the stages.

Megatron-LM splits ``num_layers`` evenly over ``pp * vpp`` virtual stages unless told
otherwise; it rejects a count that does not divide. Teams then state one of two splits:

- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``:
  the embedding and the loss each weigh one layer (``num_layers + 1 + 1`` must divide
  ``pp * vpp``; the first and last virtual stages hold one layer fewer);
- ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: the
  first and last stages hold the stated counts, the middle stages the rest evenly (as
  Llama 3.1 405B's 126 layers over PP 16 were run: 7 on the first and last stage,
  8 on each of the 14 others).

``megatron_split`` picks, for one (pp, vpp), the split whose busiest stage carries the
fewest layers, the embedding and the loss counted as one layer each (the weight
Megatron-LM's own account-for flags give them); fewer flags win a tie.
"""
from __future__ import annotations

from functools import lru_cache

SPLIT_FIELDS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split")
NO_SPLIT = {"decoder_first_pipeline_num_layers": None,
            "decoder_last_pipeline_num_layers": None,
            "account_for_embedding_in_pipeline_split": False,
            "account_for_loss_in_pipeline_split": False}


def _options(num_layers: int, pp: int, vpp: int):
    """(busiest stage load, number of flags, fields) of every legal uneven split."""
    nv = pp * vpp
    for emb, loss in ((1, 1), (1, 0), (0, 1)):
        total = num_layers + emb + loss
        if total % nv == 0 and total // nv - max(emb, loss) >= 1:
            yield (total // pp, emb + loss, {**NO_SPLIT,
                   "account_for_embedding_in_pipeline_split": bool(emb),
                   "account_for_loss_in_pipeline_split": bool(loss)})
    if pp < 2:
        return
    middle_stages = pp - 2
    for first in range(vpp, num_layers, vpp):
        for last in range(vpp, num_layers - first + 1, vpp):
            rest = num_layers - first - last
            if middle_stages == 0:
                if rest:
                    continue
                middle = 0
            else:
                if rest <= 0 or rest % (middle_stages * vpp):
                    continue
                middle = rest // middle_stages
            yield (max(first + 1, last + 1, middle), 2, {**NO_SPLIT, "decoder_first_pipeline_num_layers": first,
                                 "decoder_last_pipeline_num_layers": last})


@lru_cache(maxsize=4096)
def _best(num_layers: int, pp: int, vpp: int):
    best = None
    for load, flags, fields in _options(num_layers, pp, vpp):
        key = (load, flags)
        if best is None or key < best[0]:
            best = (key, fields)
    return None if best is None else tuple(best[1].items())


def megatron_split(num_layers: int, pp: int, vpp: int) -> dict | None:
    """The ParallelSpec split fields for (pp, vpp): the plain even split (no flags) when
    the layers divide, the most balanced uneven split Megatron-LM accepts otherwise, or
    None when there is none."""
    if num_layers % (pp * vpp) == 0:
        return dict(NO_SPLIT)
    fields = _best(num_layers, pp, vpp)
    return None if fields is None else dict(fields)


def split_label(par) -> str:
    """A short label of a ParallelSpec's stated split ('' for the plain even split)."""
    if par.decoder_first_pipeline_num_layers is not None or \
            par.decoder_last_pipeline_num_layers is not None:
        return (f"first/last {par.decoder_first_pipeline_num_layers}/"
                f"{par.decoder_last_pipeline_num_layers}")
    acc = [n for n, on in (("embedding", par.account_for_embedding_in_pipeline_split),
                           ("loss", par.account_for_loss_in_pipeline_split)) if on]
    return f"account for {'+'.join(acc)}" if acc else ""


def pp_sizes(num_layers: int, world: int) -> list[int]:
    """Every PP size Megatron-LM accepts for the model on ``world`` GPUs: the divisors of
    the layer count, and every divisor of the world size up to the layer count that one
    of the uneven splits above makes legal."""
    out = {d for d in range(1, min(num_layers, world) + 1) if num_layers % d == 0}
    out |= {p for p in range(2, min(num_layers, world) + 1)
            if world % p == 0 and megatron_split(num_layers, p, 1) is not None}
    return sorted(out)
