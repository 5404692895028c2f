"""A published row whose model has no preset, built from its columns.

Shape columns are required, each refused by name when empty: ``layers``, ``hidden``,
``heads``, ``vocab``, and ``ffn_hidden`` for a dense model or ``topk`` and
``moe_ffn_hidden`` for an MoE one (``num_experts`` set). ``kv_heads`` empty means
multi-head attention. Architecture columns are optional; where a row leaves one out,
Megatron-LM's own default for it is taken and said (``megatron/training/arguments.py``:
GeLU, LayerNorm, learned absolute positions, linear biases, tied embeddings):

==========================  =====================================================
column                      values
==========================  =====================================================
``activation``              swiglu, gelu, relu, squared_relu, quick_geglu
``normalization``           RMSNorm, LayerNorm
``position_embedding``      rope, learned_absolute, alibi, none
``tied_embeddings``         true / false
``bias_linear``             true / false (every linear layer's bias)
``qkv_bias``                true / false (q/k/v biases only, as Qwen2)
``head_dim``                the attention head width (kv_channels)
``shared_expert_ffn_hidden``  the shared experts' total width
``first_k_dense``           dense layers before the MoE layers (ffn_hidden is theirs)
==========================  =====================================================

Where every architecture column is empty and the row states its size
(``params_total_b``), the defaults are chosen by that size: Megatron-LM's (above) or the
decoder convention of Hugging Face's ``LlamaConfig`` defaults (``hidden_act`` silu, i.e.
SwiGLU; RMSNorm; RoPE; ``tie_word_embeddings`` false; ``attention_bias`` and ``mlp_bias``
false), which most open MoE and dense models of the tables follow; the one whose
parameter count is nearer the stated size is taken and said (``model_columns.py``). A
count still more than 5 % off the stated size is said: a wrong column shows there.
"""
from __future__ import annotations

from primus_ext.published.cells import _Row
from primus_ext.spec.model import ACTIVATIONS, NORMALIZATIONS, POSITION_EMBEDDINGS

# Megatron-LM's argument defaults (core_v0.16.1 megatron/training/arguments.py):
# --normalization LayerNorm, no --swiglu (GeLU), --position-embedding-type
# learned_absolute, biases unless --disable-bias-linear, embeddings tied unless
# --untie-embeddings-and-output-weights.
MEGATRON_DEFAULTS = {"activation": "gelu", "normalization": "LayerNorm",
                     "position_embedding": "learned_absolute", "tied_embeddings": True,
                     "bias_linear": True, "qkv_bias": False}
# transformers LlamaConfig defaults (hidden_act "silu" with the gated MLP, RMSNorm, rotary
# positions, tie_word_embeddings False, attention_bias False, mlp_bias False).
LLAMA_DEFAULTS = {"activation": "swiglu", "normalization": "RMSNorm",
                  "position_embedding": "rope", "tied_embeddings": False,
                  "bias_linear": False, "qkv_bias": False}
CONVENTIONS = {"Megatron-LM's defaults": MEGATRON_DEFAULTS,
               "the LlamaConfig convention": LLAMA_DEFAULTS}
_CHOICES = {"activation": ACTIVATIONS, "normalization": NORMALIZATIONS,
            "position_embedding": POSITION_EMBEDDINGS}
_FIELDS = {"activation": "activation", "normalization": "normalization",
           "position_embedding": "position_embedding_type",
           "bias_linear": "add_bias_linear", "qkv_bias": "add_qkv_bias"}
_BOOL = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
SIZE_TOLERANCE = 0.05


def architecture_stated(r: _Row) -> bool:
    """Does the row give any architecture column (then Megatron-LM's defaults fill the
    rest, as a launch line's would)?"""
    return any(r.text(c) for c in MEGATRON_DEFAULTS)


def fields_from_columns(r: _Row, name: str, notes: list[str],
                        convention: str = "Megatron-LM's defaults") -> dict:
    """ModelSpec fields for a row whose model matches no preset; empty architecture
    columns take ``CONVENTIONS[convention]``."""
    defaults = CONVENTIONS[convention]
    moe = bool(r.text("num_experts"))
    required = ["layers", "hidden", "heads", "vocab"]
    required += ["topk", "moe_ffn_hidden"] if moe else ["ffn_hidden"]
    for column in required:
        if r.int_(column) is None:
            raise r.fail(column, f"is empty; model {r.text('model')!r} has no preset, so "
                         f"the row's columns must give its shape ({', '.join(required)})")
    fields: dict = {"name": name}
    defaulted = []
    for column, default in defaults.items():
        cell = r.text(column)
        if not cell:
            value = default
            defaulted.append(f"{column}={default}")
        elif column in _CHOICES:
            value = next((c for c in _CHOICES[column] if c.lower() == cell.lower()), None)
            if value is None:
                raise r.fail(column, f"{cell!r} is not one of {', '.join(_CHOICES[column])}")
        else:
            value = _BOOL.get(cell.lower())
            if value is None:
                raise r.fail(column, f"{cell!r} is not true or false")
        if column == "tied_embeddings":
            fields["untie_embeddings_and_output_weights"] = not value
        else:
            fields[_FIELDS[column]] = value
    for column, key in (("head_dim", "kv_channels"),
                        ("shared_expert_ffn_hidden", "moe_shared_expert_intermediate_size"),
                        ("first_k_dense", "moe_first_k_dense")):
        value = r.int_(column)
        if value is not None:
            fields[key] = value
    notes.append(f"model {r.text('model')!r}: no preset; built from the row's shape columns"
                 + (f", with {convention} for what it leaves out: "
                    f"{', '.join(defaulted)}" if defaulted else ""))
    if not r.text("kv_heads"):
        notes.append("kv_heads empty: multi-head attention (one KV head per query head)")
    return fields


def check_stated_size(r: _Row, counted_b: float, notes: list[str]) -> None:
    """Say when a model built from columns differs from the row's stated size."""
    stated = r.float_("params_total_b")
    if stated and abs(counted_b - stated) > SIZE_TOLERANCE * stated:
        notes.append(f"the model built from the columns has {counted_b:.1f}B parameters, "
                     f"the row states {stated:g}B: a column or a default above differs "
                     "from the model that ran")
