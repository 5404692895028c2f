"""Our memory model next to what megatron-core allocated, row by row.

Each row is one quantity on one rank: ours (``primus_ext.memory``), measured (a
``memory_runner`` result), and the difference the CPU run is known to have against a GPU
run, named and sized exactly. A row agrees when ``measured - ours == cpu_delta``.

Known CPU-vs-GPU differences (none of them exists on a GPU, so the model leaves them out):

- ``cpu_rmsnorm``: torch's RMSNorm on CPU is composite: it saves the fp32 upcast input
  and the fp32 normalised input (4 + 4 bytes per element) where the fused GPU kernel
  (and TE) saves the input in the compute dtype; + (8 - E) * rows * width per norm;
- ``cpu_layernorm_stats``: CPU LayerNorm keeps mean and rstd in the input dtype, CUDA in
  fp32: (2E - 8) * rows per norm (-4 bytes per row in bf16);
- ``cpu_adam_step``: torch's Adam keeps a 4-byte ``step`` tensor per parameter tensor;
  TE/Apex FusedAdam keep one counter per group (reported apart, not in the row).

Expert activations depend on the routing, which is data dependent: per rank they vary,
their sum over the expert-parallel group does not (every token-expert assignment is
processed once), so MoE activation rows with EP > 1 compare the sum over ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.groundtruth.memory_runner import Case
from primus_ext.memory.cpu_delta import cpu_delta_bytes
from primus_ext.memory.activations import chunk_activations, embedding_items, head_items, \
    layer_items, mtp_items
from primus_ext.memory.inflight import inflight_1f1b, inflight_interleaved
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.rank_params import stage_params
from primus_ext.memory.states import (distopt_shard_elements, optimizer_bytes_per_element,
                                      stage_states)
from primus_ext.spec import RunSpec


@dataclass(frozen=True)
class Row:
    case: str
    quantity: str
    rank: str
    ours: int
    measured: int
    cpu_delta: int = 0
    cpu_note: str = ""

    @property
    def diff(self) -> int:
        return self.measured - self.ours

    @property
    def ok(self) -> bool:
        return self.diff == self.cpu_delta


def options_of(case: Case) -> MemoryOptions:
    return MemoryOptions(
        bias_activation_fusion=case.options.get("bias_activation_fusion", True),
        grad_reduce_in_fp32=case.options.get("grad_reduce_in_fp32", True),
        ddp_bucket_size=case.options.get("bucket_size"))


def rank_coords(spec: RunSpec, rank: int) -> dict[str, int]:
    """Megatron-core's coordinates of a global rank (order tp-cp-ep-dp-pp: tp fastest;
    the expert grid is etp-ep-edp-pp)."""
    p = spec.parallel
    tp_r = rank % p.tp
    cp_r = rank // p.tp % p.cp
    dp_r = rank // (p.tp * p.cp) % spec.dp
    pp_r = rank // (p.tp * p.cp * spec.dp)
    inner = rank % (spec.world_size // p.pp)
    etp = p.expert_tp
    ep_r = inner // etp % p.ep
    edp_r = inner // (etp * p.ep)
    return {"tp": tp_r, "cp": cp_r, "dp": dp_r, "pp": pp_r, "ep": ep_r, "edp": edp_r,
            "dp_cp": dp_r * p.cp + cp_r}


def _layer_dict(spec: RunSpec, layer: int, options: MemoryOptions) -> dict[str, int]:
    return dict(layer_items(spec.model, spec.parallel, spec.train,
                            spec.model.is_moe_layer(layer), options))


def activation_rows(case: Case, ranks: list[dict]) -> list[Row]:
    spec, opts = case.spec, options_of(case)
    m, par, train = spec.model, spec.parallel, spec.train
    rows: list[Row] = []
    ep_sum = m.is_moe and par.ep > 1
    measured = [r["activations"] for r in ranks]
    if ep_sum:  # routing-dependent per rank; exact over the EP group
        total = {}
        for meas in measured:
            for k, v in meas.items():
                total[k] = total.get(k, 0) + v
        measured = [total]
    scale = len(ranks) if ep_sum else 1
    label = "sum" if ep_sum else None
    for r, meas in enumerate(measured):
        rank = label or str(r)
        if train.recompute_granularity != "full":
            for layer in range(m.num_layers):
                items = _layer_dict(spec, layer, opts)
                rows.append(Row(case.name, f"layer {layer}", rank, scale * sum(items.values()),
                                meas.get(f"layer.{layer}", 0),
                                scale * cpu_delta_bytes(spec, items), "cpu norms"))
        # MTP blocks reuse the embedding and output layer modules (their scopes) and
        # keep the rest in the "mtp" scope.
        mtp = mtp_items(m, par, train, opts)
        k_mtp = m.mtp_num_layers
        mtp_emb = k_mtp * sum(v for k, v in mtp.items() if k.startswith("mtp.embedding."))
        mtp_head = k_mtp * sum(v for k, v in mtp.items()
                               if k.startswith(("mtp.output_layer.", "mtp.loss.")))
        mtp_block = k_mtp * sum(mtp.values()) - mtp_emb - mtp_head
        mtp_delta = k_mtp * (cpu_delta_bytes(spec, mtp) + cpu_delta_bytes(
            spec, _layer_dict(spec, m.num_layers - 1, opts)))
        if m.mtp_num_layers:
            rows.append(Row(case.name, "mtp blocks", rank, scale * mtp_block,
                            meas.get("mtp", 0), scale * mtp_delta, "cpu norms"))
        emb = embedding_items(m, par, train)
        rows.append(Row(case.name, "embedding", rank, scale * (sum(emb.values()) + mtp_emb),
                        meas.get("embedding", 0)))
        head = head_items(m, par, train)
        if train.recompute_granularity != "full":
            # (full recompute saves its checkpoint inputs outside the layers, in the
            # same scope as the loss: only the microbatch total is comparable there)
            rows.append(Row(case.name, "final norm + output layer + loss", rank,
                            scale * (sum(head.values()) + mtp_head),
                            sum(meas.get(k, 0) for k in ("final_norm", "output_layer",
                                                        "outside")),
                            scale * cpu_delta_bytes(spec, head), "cpu norms"))
        total = chunk_activations(m, par, train, 0, 0, opts)
        # Layers kept whole (all of them, or those after a block-recompute's first k).
        whole = range(m.num_layers)
        if train.recompute_granularity == "full":
            k = train.recompute_num_layers if train.recompute_method == "block" else \
                m.num_layers
            whole = range(min(k, m.num_layers), m.num_layers)
        delta = sum(cpu_delta_bytes(spec, _layer_dict(spec, i, opts)) for i in whole)
        rows.append(Row(case.name, "microbatch total", rank,
                        scale * total.bytes_per_microbatch, sum(meas.values()),
                        scale * (delta + cpu_delta_bytes(spec, head) + mtp_delta),
                        "cpu norms"))
    return rows


def param_rows(case: Case, ranks: list[dict]) -> list[Row]:
    spec = case.spec
    local = spec.train.attention_backend == "unfused"
    rows = []
    for r, res in enumerate(ranks):
        stage = rank_coords(spec, r)["pp"]
        sp = stage_params(spec.model, spec.parallel, stage, local)
        rows.append(Row(case.name, "params dense", str(r), sp.num_dense_params,
                        res["params"]["dense"]))
        rows.append(Row(case.name, "params expert", str(r), sp.num_expert_params,
                        res["params"]["expert"]))
    return rows


def buffer_rows(case: Case, ranks: list[dict]) -> list[Row]:
    spec, opts = case.spec, options_of(case)
    par, train = spec.parallel, spec.train
    local = train.attention_backend == "unfused"
    dp, edp = spec.dp * par.cp, max(spec.expert_dp, 1)
    rows = []
    for r, res in enumerate(ranks):
        c = rank_coords(spec, r)
        st = stage_states(spec.model, par, train, c["pp"], dp, edp, opts)
        buf = res["buffers"]
        rows.append(Row(case.name, "grad buffers", str(r), st.grad_bytes,
                        buf["dense_grad"] + buf["expert_grad"]))
        if par.use_distributed_optimizer:
            rows.append(Row(case.name, "param buffers (distopt)", str(r), st.param_bytes,
                            buf["dense_param"] + buf["expert_param"]))
            elems = distopt_shard_elements(spec.model, par, c["pp"], dp, edp, c["dp_cp"],
                                           c["edp"], opts, local)
        else:
            elems = st.optimizer_elements
        ours = elems * optimizer_bytes_per_element(train)
        opt = res["optimizer"]
        rows.append(Row(case.name, "optimizer state", str(r), ours,
                        opt["main_params"] + opt["moments"]))
    return rows


def inflight_rows(case: Case, ranks: list[dict]) -> list[Row]:
    spec = case.spec
    par = spec.parallel
    m = case.options.get("num_microbatches", spec.num_microbatches)
    rows = []
    for r, res in enumerate(ranks):
        stage = rank_coords(spec, r)["pp"]
        if par.vpp == 1:
            ours = inflight_1f1b(par.pp, stage, m)
        else:
            ours = sum(inflight_interleaved(par.pp, par.vpp, stage, m, (1,) * par.vpp))
        rows.append(Row(case.name, "in-flight microbatches", str(r), ours,
                        max(res["inflight"]["inflight_after_forward"])))
    return rows


def compare(case: Case, ranks: list[dict]) -> list[Row]:
    """All rows of one measured case (raises if a rank reported an error)."""
    for r, res in enumerate(ranks):
        if "error" in res:
            raise RuntimeError(f"case {case.name} rank {r} failed:\n{res['error']}")
    rows: list[Row] = []
    if "params" in case.measure:
        rows += param_rows(case, ranks)
    if "buffers" in case.measure:
        rows += buffer_rows(case, ranks)
    if "activations" in case.measure:
        rows += activation_rows(case, ranks)
    if "inflight" in case.measure:
        rows += inflight_rows(case, ranks)
    return rows
