"""A row's model columns into a ModelSpec: the preset matched from the ``model`` column
supplies what the columns cannot say; ``MegatronGPT-*`` rows have no preset and take
Megatron-LM's GPT defaults; any other model without a preset is built from its shape
columns (``published/shape_columns.py``: the defaults of its empty architecture columns
chosen by its stated size) or refused with the missing column named; an
empty ``seq_len`` takes the preset's pre-training context."""
from __future__ import annotations

import re

from primus_ext.presets import model_preset
from primus_ext.published.cells import RowError, _Row
from primus_ext.published.contexts import TRAINING_CONTEXT, training_context
from primus_ext.published.names import match_model_preset, normalize_model_name
from primus_ext.published.shape_columns import CONVENTIONS, architecture_stated, \
    check_stated_size, fields_from_columns
from primus_ext.spec import ModelSpec

# Megatron-LM's GPT defaults (arguments.py): 4*hidden FFN, MHA, GeLU, LayerNorm, biases,
# learned absolute positions. The MegatronGPT-* rows' stated parameter counts imply untied
# input/output embeddings (1.7B = 1.48B tied, 1.75B untied).
GPT_DEFAULTS = {
    "normalization": "LayerNorm", "activation": "gelu", "add_bias_linear": True,
    "position_embedding_type": "learned_absolute",
    "untie_embeddings_and_output_weights": True,
}
_GPT_FAMILIES = ("megatrongpt",)

_MODEL_COLUMNS = (("layers", "num_layers"), ("hidden", "hidden_size"),
                  ("ffn_hidden", "ffn_hidden_size"), ("heads", "num_attention_heads"),
                  ("kv_heads", "num_query_groups"), ("vocab", "vocab_size"),
                  ("num_experts", "num_moe_experts"), ("topk", "moe_router_topk"),
                  ("moe_ffn_hidden", "moe_ffn_hidden_size"))


_NO_MTP = re.compile(r"\b(?:w/o|without|no)\s+MTP\b", re.I)


def model_of(r: _Row, notes: list[str]) -> tuple[ModelSpec, str | None]:
    name = r.text("model", required=True)
    preset = match_model_preset(name)
    norm = normalize_model_name(name)
    if preset is not None:
        fields = model_preset(preset)
        notes.append(f"model {name!r} -> preset {preset}")
    elif norm.startswith(_GPT_FAMILIES):
        fields = {"name": norm, **GPT_DEFAULTS}
        notes.append(f"model {name!r}: no preset; Megatron GPT defaults (4*hidden FFN "
                     "unless given, MHA unless kv_heads given, GeLU, LayerNorm, biases, "
                     "learned absolute positions, untied embeddings as the published "
                     "parameter counts imply)")
    else:
        return _from_columns(r, norm, notes)
    return _build(r, fields, preset, norm, notes), preset


def _from_columns(r: _Row, norm: str, notes: list[str]) -> tuple[ModelSpec, None]:
    """A model without a preset: from its shape columns, the defaults for the empty
    architecture columns chosen by the stated size where the row states one and no
    architecture column (shape_columns.py)."""
    from primus_ext.memory.params import count_params
    stated = r.float_("params_total_b")
    names = list(CONVENTIONS) if stated and not architecture_stated(r) else \
        [next(iter(CONVENTIONS))]
    built = []
    for convention in names:
        own: list[str] = []
        model = _build(r, fields_from_columns(r, norm, own, convention), None, norm, own)
        built.append((count_params(model).num_params / 1e9, convention, model, own))
    counted, convention, model, own = min(
        built, key=lambda b: abs(b[0] - stated) if stated else 0.0)
    notes += own
    if len(built) > 1:
        counts = ", ".join(f"{c}: {b:.1f}B" for b, c, _, _ in built)
        notes.append(f"architecture columns empty: {convention} taken, the nearer count "
                     f"to the stated {stated:g}B ({counts})")
    check_stated_size(r, counted, notes)
    return model, None


def _build(r: _Row, fields: dict, preset: str | None, norm: str,
           notes: list[str]) -> ModelSpec:
    name = r.text("model", required=True)
    for column, key in _MODEL_COLUMNS:
        value = r.int_(column)
        if value is None:
            continue
        if preset is not None and key in fields and fields[key] != value:
            notes.append(f"{key}={value} from column {column!r} (preset {preset} has "
                         f"{fields[key]})")
        fields[key] = value
    for column, key in (("layers", "num_layers"), ("hidden", "hidden_size"),
                        ("heads", "num_attention_heads")):
        if fields.get(key) is None:
            raise r.fail(column, "is empty and no preset supplies it")
    if preset is not None and not r.text("vocab") and "vocab_size" in fields:
        notes.append(f"vocab empty: vocab_size={fields['vocab_size']} from preset {preset}")
    if fields.get("mtp_num_layers") and _NO_MTP.search(name + " " + r.text("notes")):
        fields["mtp_num_layers"] = 0
        notes.append("mtp_num_layers=0 (the row says the run had no MTP layers)")
    _fill_seq(r, preset, notes)
    seq = r.int_("seq_len", required=True)
    if fields.get("position_embedding_type") == "learned_absolute":
        if fields.get("max_position_embeddings", 0) < seq:
            fields["max_position_embeddings"] = seq
            notes.append(f"max_position_embeddings={seq} (learned position table sized to "
                         "the run's sequence length)")
    try:
        return ModelSpec(**fields)
    except ValueError as exc:
        raise RowError(f"row {r.run_id}: {exc}") from None


def _fill_seq(r: _Row, preset: str | None, notes: list[str]) -> None:
    """An empty seq_len takes the preset's pre-training context (published/contexts.py)."""
    if r.text("seq_len"):
        return
    known = training_context(preset)
    if known is None:
        raise r.fail("seq_len", f"is empty and model preset {preset!r} states no "
                     "training context; give the run's sequence length (presets with one: "
                     f"{', '.join(sorted(TRAINING_CONTEXT))})")
    tokens, source = known
    r.row["seq_len"] = str(tokens)
    notes.append(f"seq_len empty: {tokens}, the pre-training context of {preset} "
                 f"({source})")
