"""Megatron-LM's MoE kernel and module flags and its CUDA-graph flags -> spec fields
(pure): what the host clock (compute/host.py) and the expert MLP model read.

- ``moe_impl``: --moe-grouped-gemm (or the legacy one), --moe-permute-fusion,
  --moe-router-fusion, --moe-router-load-balancing-type, --moe-flex-dispatcher-backend,
  the flex kernels' SMs (``num_sms_flags``) and the router's optional terms
  (``router_terms``) into ParallelSpec fields;
- ``router_dtype``: --moe-router-dtype (fp64 read as fp32, noted ``n``);
- ``cuda_graph_scope``: --cuda-graph-impl / --cuda-graph-scope / --cuda-graph-modules /
  --enable-cuda-graph / --external-cuda-graph into ``train.cuda_graph_scope``.
"""
from __future__ import annotations


def moe_impl(ns) -> dict:
    """The MoE kernel and module choices of the launch line; a dense model keeps the
    spec's defaults (the fields do not apply)."""
    if not ns.num_experts:
        return {}
    return dict(moe_grouped_gemm=ns.moe_grouped_gemm or ns.moe_use_legacy_grouped_gemm,
                moe_permute_fusion=ns.moe_permute_fusion,
                moe_router_fusion=ns.moe_router_fusion,
                moe_router_load_balancing_type=_balancing(ns),
                moe_flex_dispatcher_backend=ns.moe_flex_dispatcher_backend,
                moe_flex_num_sms=num_sms_flags(ns),
                moe_router_terms=router_terms(ns))


def num_sms_flags(ns) -> int | None:
    """SMs of the flex dispatcher's kernels: Megatron-LM main's --moe-flex-dispatcher-num-
    sms (for any backend), else the chosen backend's own flag (core_v0.16.1
    --moe-deepep-num-sms / --moe-hybridep-num-sms; the other backend's is not read, as
    megatron-core passes each only to its own buffer), else None (megatron-core's
    default, comm/moe_comm.py flex_num_sms)."""
    if ns.moe_flex_dispatcher_num_sms is not None:
        return ns.moe_flex_dispatcher_num_sms
    if ns.moe_flex_dispatcher_backend == "hybridep":
        return ns.moe_hybridep_num_sms
    return ns.moe_deepep_num_sms


def router_terms(ns) -> tuple[str, ...]:
    """parallel.moe_router_terms from the router flags (megatron-core moe/router.py:
    the balancing losses only with a positive coefficient, and not under Sinkhorn)."""
    terms = []
    coeffs = [float(c) for c in ns.moe_aux_loss_coeff]
    if any(c > 0 for c in coeffs) and _balancing(ns) not in ("sinkhorn", "none"):
        terms.append("aux_loss")
    for term, on in (("z_loss", bool(ns.moe_z_loss_coeff)),
                     ("input_jitter", ns.moe_input_jitter_eps is not None),
                     ("expert_bias", ns.moe_router_enable_expert_bias),
                     ("sigmoid", ns.moe_router_score_function == "sigmoid"),
                     ("topk_scaling", ns.moe_router_topk_scaling_factor is not None),
                     ("padding", ns.moe_router_padding_for_fp8
                      or ns.moe_router_padding_for_quantization),
                     ("per_layer_logging", ns.moe_per_layer_logging)):
        if on:
            terms.append(term)
    return tuple(terms)


def _balancing(ns) -> str:
    """--moe-router-load-balancing-type: one type, or one per layer group (Megatron-LM
    main accepts a list); Sinkhorn's host synchronisations are what the host clock
    models, so any list holding it reads as sinkhorn."""
    types = ns.moe_router_load_balancing_type
    types = [types] if isinstance(types, str) else list(types)
    return "sinkhorn" if "sinkhorn" in types else types[0]


def cuda_graph_scope(ns) -> tuple[str, ...]:
    """train.cuda_graph_scope from Megatron-LM's CUDA-graph flags (arguments.py
    validate_args and core/transformer/cuda_graph_config.py normalize_cuda_graph_modules):
    --enable-cuda-graph is --cuda-graph-impl local, --external-cuda-graph is
    transformer_engine; an implementation with no modules (or the deprecated 'full')
    captures whole layers; 'full_iteration' (a module name or the implementation) the
    step's forward and backward."""
    impl = ns.cuda_graph_impl
    if ns.enable_cuda_graph:
        impl = "local"
    if ns.external_cuda_graph:
        impl = "transformer_engine"
    mods = [m for v in (ns.cuda_graph_scope or ns.cuda_graph_modules or [])
            for m in str(v).split(",") if m]
    if impl == "full_iteration" or "full_iteration" in mods:
        return ("full_iteration",)
    if impl == "none":
        return ()
    if not mods or mods == ["full"]:
        return ("layer",)
    return tuple(mods)


def router_dtype(ns, n) -> str | None:
    if not ns.num_experts or ns.moe_router_dtype is None:
        return None
    if ns.moe_router_dtype == "fp64":
        n.not_modelled.append("--moe-router-dtype fp64 (modelled as fp32)")
    return "fp32"
