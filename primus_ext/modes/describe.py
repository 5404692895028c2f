"""mode=describe: parameter counts and training FLOPs per token of a model."""
from __future__ import annotations

from primus_ext.compute.model_flops import FORMULA_NAME, model_flops_per_token
from primus_ext.config import model_and_notes
from primus_ext.emit.console import print_json, print_table
from primus_ext.memory.params import count_params
from primus_ext.spec import ModelSpec


def describe(model: ModelSpec, seq_length: int) -> dict:
    counts = count_params(model)
    return {
        "model": model.name,
        "num_params": counts.num_params,
        "num_active_params": counts.num_active_params,
        "num_embedding_params": counts.num_embedding_params,
        "num_mtp_params": counts.num_mtp_params,
        "num_layers": model.num_layers,
        "num_moe_layers": model.num_moe_layers,
        "seq_length": seq_length,
        "flops_per_token": model_flops_per_token(model, seq_length),
        "flop_formula": FORMULA_NAME,
    }


def run(cfg) -> dict:
    # describe needs only the model: layouts and clusters are not validated here.
    model, notes = model_and_notes(cfg)
    out = describe(model, int(cfg.train.seq_length))
    if notes:
        out["notes"] = notes
    if cfg.output == "json":
        print_json(out)
    else:
        print_table(f"{model.name}", ["quantity", "value"], [
            ("parameters (total, without MTP)", out["num_params"]),
            ("parameters (active per token)", out["num_active_params"]),
            ("  of which embedding + output", out["num_embedding_params"]),
            ("MTP parameters", out["num_mtp_params"]),
            ("decoder layers (MoE)", f"{model.num_layers} ({model.num_moe_layers})"),
            (f"training FLOPs/token at seq {out['seq_length']}", f"{out['flops_per_token']:.4g}"),
        ], caption=f"FLOPs: {FORMULA_NAME}")
        for note in notes:
            print(f"note: {note}")
    return out
