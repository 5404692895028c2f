"""Run megatron-core's aux-loss-free balancing on a router with a systematic skew, on the
CPU, and print the busiest EP rank's load over the mean before and after the expert bias
has settled (JSON). A helper of tests/compute/test_layer_ops.py, run in its own process
(get_updated_expert_bias all-reduces over megatron-core's data-parallel group).

Usage: python expert_bias_routing.py EXPERTS TOPK EP SEQ STEPS RATE SKEW SEED"""
from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.moe_utils import (get_updated_expert_bias,
                                                         topk_routing_with_score_function)
    experts, topk, ep, seq, steps = (int(x) for x in argv[:5])
    rate, skew_std, seed = float(argv[5]), float(argv[6]), int(argv[7])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + seed % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    torch.manual_seed(seed)
    skew = skew_std * torch.randn(experts)  # the router's systematic popularity
    bias = torch.zeros(experts)
    ratios = []
    for _ in range(steps):
        loads = torch.zeros(experts)
        for _rank in range(ep):  # each EP rank routes its own micro-batch
            logits = torch.randn(seq, experts) + skew
            _, routing = topk_routing_with_score_function(
                logits, topk, score_function="sigmoid", expert_bias=bias)
            loads += routing.sum(dim=0).float()
        ranks = loads.view(ep, experts // ep).sum(dim=1)
        ratios.append(float(ranks.max() / ranks.mean()))
        bias = get_updated_expert_bias(loads.clone(), bias, rate)
    tail = ratios[steps // 2:]
    print(json.dumps({"first": ratios[0], "settled": sum(tail) / len(tail)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
