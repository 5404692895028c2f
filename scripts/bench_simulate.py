"""Wall time of simulate_layer_costs for the tuner's big cases (cold and cached).

Cold = a spec never seen before (the per-spec cache is cleared; group-span and
parameter-count caches stay warm, as in a tuner sweep); cached = the same spec again.

Usage: python scripts/bench_simulate.py [--runs 200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_ext.project import simulate_backend as backend  # noqa: E402
from primus_ext.presets import hardware_preset  # noqa: E402
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec  # noqa: E402

DSV3 = ModelSpec(name="dsv3", num_layers=61, hidden_size=7168, num_attention_heads=128,
                 ffn_hidden_size=18432, vocab_size=129280, multi_latent_attention=True,
                 q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                 v_head_dim=128, num_moe_experts=256, moe_router_topk=8,
                 moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
                 moe_first_k_dense=3, mtp_num_layers=1)
LLAMA = ModelSpec(name="llama405b", num_layers=126, hidden_size=16384,
                  num_attention_heads=128, num_query_groups=8, ffn_hidden_size=53248,
                  vocab_size=128256)


def cases():
    h100 = hardware_preset("h100")
    yield "dsv3 1024xH100 pp16 ep64 fp8", RunSpec(
        model=DSV3, parallel=ParallelSpec(pp=16, ep=64, decoder_first_pipeline_num_layers=3,
                                          decoder_last_pipeline_num_layers=2),
        train=TrainSpec(seq_length=4096, global_batch_size=8192, precision="fp8"),
        cluster=ClusterSpec(hardware=h100, num_nodes=128))
    yield "llama405b 8192xH100 tp8 pp16 selective", RunSpec(
        model=LLAMA, parallel=ParallelSpec(tp=8, pp=16, sequence_parallel=True),
        train=TrainSpec(seq_length=8192, global_batch_size=2048,
                        recompute_granularity="selective"),
        cluster=ClusterSpec(hardware=h100, num_nodes=1024))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    for name, spec in cases():
        cold = []
        for i in range(args.runs):
            # a new, never-seen spec each time: vary a field that changes nothing else
            s = replace(spec, train=replace(spec.train, global_batch_size=spec.train
                                            .global_batch_size * (i + 2)))
            backend._CACHE.clear()
            t = time.perf_counter()
            lc = backend.simulate_layer_costs(s)
            cold.append(time.perf_counter() - t)
        warm = []
        for _ in range(args.runs):
            t = time.perf_counter()
            backend.simulate_layer_costs(s)
            warm.append(time.perf_counter() - t)
        k = len(lc.kinds)
        print(f"{name}: {k} kinds; cold median {statistics.median(cold) * 1e3:.3f} ms "
              f"({statistics.median(cold) * 1e3 / k:.3f} ms/kind), cached median "
              f"{statistics.median(warm) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
