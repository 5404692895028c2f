"""The host clock: the CPU time a GPU node spends issuing one layer's work.

ARCHITECTURE.md, "two clocks": the host issues every kernel and collective in order,
the device runs them in order, and a kernel starts no earlier than the host issued it.
A layer phase (forward, or backward with its recompute) costs the host

    host_s = python_s / host_speed               megatron-core's own Python, the PyTorch
                                                 dispatcher and autograd, measured on the
                                                 reference host (data/host/reference.json,
                                                 scripts/host_profile.py)
           + kernels * launch_s                  the op model's kernel count (compute/ops.py)
           + te_calls * te_module_host_s         Transformer Engine's module Python over
                                                 the local module it replaces
           + expert_gemms * te_grouped_gemm_host_s  per expert GEMM of a TE GroupedLinear
           + collectives * collective_host_s     c10d / NCCL enqueue per call
           + syncs * sync_s                      host-device synchronisations

with the constants of the target's ``HardwareSpec`` (priors in the presets, fitted by
``mode=calibrate`` on Megatron-LM's GPU-measured functional tests). The step composer
(``project/stages.py``) runs the two clocks against each other.

Reference measurements are per block: the attention block (with half of the layer's own
norms and residual adds), the dense MLP block (the other half), the MoE block as a base
(router, permutation, dispatcher) plus a per-local-expert term (megatron-core's
SequentialMLP loops over its experts; a grouped GEMM calls one module), the embedding,
the output layer with the loss, the schedule's work per microbatch outside the model
(forward_step, batch, loss function) and the optimizer step (fixed plus per parameter
tensor). The variant follows the model: multi-latent attention, GPT-3 style (LayerNorm,
learned positions, biases) or Llama style.

Transformer Engine module calls (megatron-core ``gpt_layer_specs``, TE spec): the
attention block calls ``TELayerNormColumnParallelLinear`` (QKV), ``TEDotProductAttention``
and ``TERowParallelLinear`` (projection): 3; MLA calls its down and up projections
(4 with a q LoRA, 3 without) besides core attention and the projection; the dense MLP
``TELayerNormColumnParallelLinear`` and ``TERowParallelLinear``: 2; the MoE experts two
``TEGroupedLinear`` calls with a grouped GEMM, else two ``TE*Linear`` per local expert;
shared experts 2. The router, permutation and the output layer are megatron-core modules
in both stacks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from primus_ext.spec.hardware import HardwareSpec
from primus_ext.spec.model import ModelSpec

PROFILE_PATH = Path(__file__).resolve().parent.parent / "data" / "host" / "reference.json"
# The reference profile's MoE variants: local experts of each.
_MOE_SMALL, _MOE_LARGE = ("moe4", 4), ("moe8", 8)


@lru_cache(maxsize=1)
def reference_profile() -> dict:
    return json.loads(PROFILE_PATH.read_text())


@dataclass(frozen=True, slots=True)
class HostWork:
    """What one phase of a block asks of the host: reference-host Python seconds, kernel
    launches, Transformer Engine module calls, collective calls and synchronisations."""
    python_s: float = 0.0
    kernels: float = 0.0
    te_calls: float = 0.0
    collectives: float = 0.0
    syncs: float = 0.0
    expert_gemms: float = 0.0

    def __add__(self, other: "HostWork") -> "HostWork":
        return HostWork(self.python_s + other.python_s, self.kernels + other.kernels,
                        self.te_calls + other.te_calls,
                        self.collectives + other.collectives, self.syncs + other.syncs,
                        self.expert_gemms + other.expert_gemms)

    def minus(self, other: "HostWork") -> "HostWork":
        """What is left when ``other`` is taken out (never below zero)."""
        return HostWork(max(self.python_s - other.python_s, 0.0),
                        max(self.kernels - other.kernels, 0.0),
                        max(self.te_calls - other.te_calls, 0.0),
                        max(self.collectives - other.collectives, 0.0), self.syncs,
                        max(self.expert_gemms - other.expert_gemms, 0.0))

    def scaled(self, k: float) -> "HostWork":
        return HostWork(self.python_s * k, self.kernels * k, self.te_calls * k,
                        self.collectives * k, self.syncs * k, self.expert_gemms * k)

    def seconds(self, hw: HardwareSpec, te: bool) -> float:
        if not hw.host_clock:
            return 0.0
        return (self.python_s / hw.host_speed + self.kernels * hw.launch_s
                + (self.te_calls * hw.te_module_host_s
                   + self.expert_gemms * hw.te_grouped_gemm_host_s if te else 0.0)
                + self.collectives * hw.collective_host_s + self.syncs * hw.sync_s)



def variant(model: ModelSpec) -> str:
    if model.multi_latent_attention:
        return "mla"
    if model.normalization == "LayerNorm" and model.position_embedding_type != "rope":
        return "gpt"
    return "llama"


def _blocks(name: str) -> dict:
    return reference_profile()["variants"][name]["blocks_s"]


def _layer_rest(name: str, phase: str) -> float:
    """The layer's own work outside attention and MLP (its norms and residual adds)."""
    b = _blocks(name)
    return max(b[f"layer|{phase}"] - b[f"attn|{phase}"] - b[f"mlp|{phase}"], 0.0)


def attention_python(model: ModelSpec) -> tuple[float, float]:
    """(forward, backward) reference-host seconds of the attention block."""
    v = variant(model)
    b = _blocks(v)
    return tuple(b[f"attn|{ph}"] + _layer_rest(v, ph) / 2 for ph in ("fwd", "bwd"))


def attention_te_calls(model: ModelSpec) -> int:
    if model.multi_latent_attention:
        return 2 + (4 if model.q_lora_rank is not None else 3)
    return 3


def dense_mlp_python(model: ModelSpec) -> tuple[float, float]:
    v = variant(model)
    b = _blocks(v)
    return tuple(b[f"mlp|{ph}"] + _layer_rest(v, ph) / 2 for ph in ("fwd", "bwd"))


def moe_python(local_experts: int, grouped: bool, router_fused: bool = False,
               permute_fused: bool = False) -> tuple[float, float]:
    """(forward, backward) reference-host seconds of the MoE block: the base (router,
    permutation, dispatcher; the reference run's unfused path, split half router, half
    permutation, a fused half replaced by the one TE call the caller counts) and, per
    local expert, megatron-core SequentialMLP's loop; a grouped GEMM runs one expert
    module for all of them."""
    small = _MOE_SMALL[0]
    out = []
    for i, ph in enumerate(("fwd", "bwd")):
        per = _moe_per_expert(ph)
        base = moe_base_python()[i]
        base *= ((0.0 if router_fused else 0.5) + (0.0 if permute_fused else 0.5))
        rest = _layer_rest(small, ph) / 2
        out.append(base + rest + per * (1 if grouped else local_experts))
    return tuple(out)


def _moe_per_expert(ph: str) -> float:
    (small, n_s), (large, n_l) = _MOE_SMALL, _MOE_LARGE
    a, b = _blocks(small)[f"mlp|{ph}"], _blocks(large)[f"mlp|{ph}"]
    return max((b - a) / (n_l - n_s), 0.0)


def moe_base_python() -> tuple[float, float]:
    """(forward, backward) reference-host seconds of the unfused MoE block less its
    per-expert loop: router, permutation and dispatcher, about half each."""
    (small, n_s) = _MOE_SMALL
    return tuple(max(_blocks(small)[f"mlp|{ph}"] - n_s * _moe_per_expert(ph), 0.0)
                 for ph in ("fwd", "bwd"))


def embedding_python() -> tuple[float, float]:
    p = reference_profile()["variants"]["llama"]["embedding_s"]
    return p["embedding|fwd"], p["embedding|bwd"]


def output_python(model: ModelSpec) -> tuple[float, float]:
    p = reference_profile()["variants"][variant(model)]["output_s"]
    return p["output|fwd"], p["output|bwd"]


def schedule_python_per_microbatch(model: ModelSpec) -> float:
    """The schedule's own work per microbatch outside the model's modules: the step of
    the reference run outside its layers, less the embedding and the output layer."""
    v = reference_profile()["variants"][variant(model)]
    e = sum(v["embedding_s"].values())
    o = sum(v["output_s"].values())
    return max(v["outside_layers_per_microbatch_s"] - e - o, 0.0)


def optimizer_python(num_param_tensors: int) -> float:
    """megatron-core's optimizer step on the reference host: fixed plus per tensor
    (multi-tensor kernels; the per-tensor Python of its loops)."""
    v = reference_profile()["variants"]["gpt"]
    return v["optimizer_fixed_s"] + num_param_tensors * v["optimizer_per_param_tensor_s"]


def dispatch_syncs(spec) -> int:
    """Host-device synchronisations in one MoE layer's forward (megatron-core 0.16
    token_dispatcher.py): the alltoall dispatcher copies the tokens-per-expert counts to
    the host for the all-to-all splits (``_maybe_update_cuda_sync_point``), the allgather
    dispatcher and the grouped / sequential experts need them for the GEMM splits
    (``tokens_per_expert.tolist()``), DeepEP returns them as a host list; with token
    dropping padded to capacity every split is static and none is needed. Sinkhorn
    balancing (moe_utils.sinkhorn) tests convergence on the host every iteration
    (``while error > tol``): ``SINKHORN_ITERATIONS`` more."""
    m, p = spec.model, spec.parallel
    n = 0 if (m.moe_expert_capacity_factor is not None
              and m.moe_pad_expert_input_to_capacity) else 1
    if p.moe_router_load_balancing_type == "sinkhorn":
        n += SINKHORN_ITERATIONS
    return n


# Sinkhorn iterations to tolerance 1e-4 on router logits of a model at initialisation
# (megatron-core moe_utils.sinkhorn, a fresh 8-expert router: 3-4 iterations).
SINKHORN_ITERATIONS = 4
# Kernels of one Sinkhorn iteration: two row / column sums with their reciprocals, the
# error's abs, mean and compare.
SINKHORN_KERNELS = 9


def layer_parts(spec, moe: bool) -> dict[str, tuple[HostWork, HostWork]]:
    """Per part of a decoder layer ('attn', 'mlp'), its (forward, backward) host work
    besides kernels and collectives (the caller counts those from the op model): Python,
    TE calls, syncs; the Sinkhorn iterations' kernels in the MoE part."""
    m, p = spec.model, spec.parallel
    af, ab = attention_python(m)
    te_a = attention_te_calls(m)
    attn = (HostWork(af, te_calls=te_a), HostWork(ab, te_calls=te_a))
    if not moe:
        mf, mb = dense_mlp_python(m)
        return {"attn": attn, "mlp": (HostWork(mf, te_calls=2), HostWork(mb, te_calls=2))}
    local = max(m.num_moe_experts // p.ep, 1)
    mf, mb = moe_python(local, p.moe_grouped_gemm, p.moe_router_fusion,
                        p.moe_permute_fusion)
    te = (2 if p.moe_grouped_gemm else 2 * local) + p.moe_router_fusion \
        + p.moe_permute_fusion
    if m.moe_shared_expert_intermediate_size:
        sf, sb = dense_mlp_python(m)
        mf, mb, te = mf + sf, mb + sb, te + 2
    kf, kb = moe_base_kernels(p.moe_router_fusion, p.moe_permute_fusion)
    if p.moe_router_load_balancing_type == "sinkhorn":
        kf += SINKHORN_ITERATIONS * SINKHORN_KERNELS
    for term in p.moe_router_terms:
        f, b = ROUTER_TERM_KERNELS[term][1 if p.moe_router_fusion else 0]
        kf, kb = kf + f, kb + b
    g = expert_gemms(spec, local)
    return {"attn": attn, "mlp": (HostWork(mf, kf, te, 0, dispatch_syncs(spec), g),
                                  HostWork(mb, kb, te_calls=te, expert_gemms=2 * g))}


def expert_gemms(spec, local: int) -> float:
    """Expert GEMMs the two ``TEGroupedLinear`` calls of a forward loop over (fc1 and fc2,
    one per local expert; the backward twice as many: dgrad and wgrad). TE's fused
    grouped MLP (``parallel.moe_fused_grouped_mlp``) runs each as one kernel over all
    experts, and without a grouped GEMM each expert is a module of its own (te_calls)."""
    p = spec.parallel
    if not p.moe_grouped_gemm or p.moe_fused_grouped_mlp:
        return 0.0
    return 2.0 * local


# Kernels each optional router term adds to one MoE layer, (forward, backward), unfused
# and with --moe-router-fusion (megatron-core 0.16 moe/router.py TopKRouter and
# moe_utils.py): the balancing loss recomputes the routing scores
# (compute_routing_scores_for_aux_loss: score function, top-k, scatter) and reduces them
# with the tokens per expert (switch_load_balancing_loss_func: sums, product, mean;
# MoEAuxLossAutoScaler), fused as TE's fused_compute_score_for_moe_aux_loss and
# fused_moe_aux_loss; z-loss is logsumexp, square, mean and the scaler; the jitter a
# uniform sample and a product; the expert bias an add and a gather of the unbiased
# scores; sigmoid scores a sigmoid and their normalisation; the top-k scaling one
# product; quantization padding pads the routing map; per-layer logging keeps each
# layer's losses (their read-backs are per step: project/host_step.py). The fused
# router takes score function, scaling and bias inside its kernels.
ROUTER_TERM_KERNELS = {
    "aux_loss": ((8, 5), (2, 2)),
    "z_loss": ((4, 3), (4, 3)),
    "input_jitter": ((2, 1), (2, 1)),
    "expert_bias": ((2, 0), (0, 0)),
    "sigmoid": ((3, 2), (0, 0)),
    "topk_scaling": ((1, 1), (0, 0)),
    "padding": ((3, 0), (3, 0)),
    "per_layer_logging": ((1, 0), (1, 0)),
}
# Kernels a fused path launches in place of megatron-core's unfused router or
# permutation (TE fused_topk_with_score_function and its aux-loss scores; TE
# moe_permute / moe_unpermute), per phase.
FUSED_KERNELS = 2


def moe_base_kernels(router_fused: bool, permute_fused: bool, split: bool = False
                     ) -> tuple:
    """(forward, backward) kernels of the MoE block's router, permutation and dispatcher
    bookkeeping beyond what the op model counts: the reference run's unfused count (the
    MoE block less its per-expert loop, dispatched aten ops that are not views), split
    half router, half permutation; a fused path launches ``FUSED_KERNELS`` instead of
    its half. ``split``: per phase the pair (router, permutation) instead of its sum."""
    (small, n_s), (large, n_l) = _MOE_SMALL, _MOE_LARGE
    ops = reference_profile()["variants"]
    out = []
    for ph in ("fwd", "bwd"):
        a = ops[small]["ops_per_microbatch"][f"mlp|{ph}"]["kernels"]
        b = ops[large]["ops_per_microbatch"][f"mlp|{ph}"]["kernels"]
        base = max(a - n_s * (b - a) / (n_l - n_s), 0.0)
        half = base / 2
        pair = (FUSED_KERNELS if router_fused else half,
                FUSED_KERNELS if permute_fused else half)
        out.append(pair if split else sum(pair))
    return tuple(out)


# What replaying one captured CUDA graph asks of the host (TE make_graphed_callables /
# megatron-core CudaGraphManager: copy the inputs into the graph's static buffers, then
# cudaGraphLaunch): a few launches.
GRAPH_REPLAY_KERNELS = 3


def graphed_parts(spec, moe: bool) -> frozenset[str]:
    """The layer parts one CUDA graph replays (train.cuda_graph_scope; megatron-core
    enums.CudaGraphModule): 'attn'; 'mlp' (dense layers); 'moe' (drop-and-pad MoE layers
    only: every shape static); 'layer' (the whole layer, its MoE part only when padded:
    a dropless dispatch syncs with the host, which no graph can hold); 'full_iteration'
    (the step's forward and backward, MoE layers included: a full-iteration capture runs
    only with a sync-free MoE, as the recipes that use it set up -- Megatron-Bridge 26.08
    ``_enable_hybridep_full_iteration_mxfp8``: HybridEP with ``moe_paged_stash`` and
    ``moe_expert_rank_capacity_factor``, fixed-size receive buffers)."""
    scope = set(spec.train.cuda_graph_scope)
    m = spec.model
    static_moe = (m.moe_expert_capacity_factor is not None
                  and m.moe_pad_expert_input_to_capacity) or "full_iteration" in scope
    out = set()
    whole = bool(scope & {"layer", "full_iteration"})
    if whole or "attn" in scope:
        out.add("attn")
    if not moe and (whole or "mlp" in scope):
        out.add("mlp")
    if moe and static_moe and (whole or "moe" in scope):
        out.add("mlp")
    return frozenset(out)


# A captured part's host work: its kernels, Python and collectives replaced by one replay.
REPLAY = HostWork(kernels=GRAPH_REPLAY_KERNELS)


def embedding_work() -> tuple[HostWork, HostWork]:
    f, b = embedding_python()
    return HostWork(f), HostWork(b)


def output_work(model: ModelSpec) -> tuple[HostWork, HostWork]:
    """The final norm (a TE module in the TE spec), the output layer and the loss."""
    f, b = output_python(model)
    return HostWork(f, te_calls=1), HostWork(b, te_calls=1)
