"""The vocabulary a Megatron-LM launch line trains with (pure: no torch, no tokenizers).

Megatron-LM builds the tokenizer, takes the size it reports and pads it
(megatron/training/tokenizer/tokenizer.py ``_vocab_size_with_padding``: up to a multiple
of ``--make-vocab-size-divisible-by`` x TP; ModelSpec.make_vocab_size_divisible_by and
the TP factor do the same here), unless ``--padded-vocab-size`` is given: then that is
the embedding's size and nothing is padded (``build_tokenizer``: 'if padded_vocab_size is
None'). The size is decided in this order, and the rule that decided it is returned:

1. ``--tokenizer-type NullTokenizer``: ``--vocab-size`` + 1 (it appends an EOD token).
2. ``--padded-vocab-size``: taken as given (``Vocab.padded``).
3. ``--tokenizer-type TikTokenizer`` with ``--vocab-size``: that size (CustomTikTokenizer
   takes it; the other tokenizers report their own size and ignore ``--vocab-size``).
4. A tokenizer file on this machine: ``--vocab-file`` (GPT-2 BPE ``vocab.json``: its
   entries), ``--tokenizer-model`` as a SentencePiece ``.model`` (its pieces), a
   ``tokenizer.json`` or a Hugging Face directory holding one (the model's vocabulary
   plus added tokens outside it, as ``len(AutoTokenizer)`` counts them), or else its
   ``config.json`` ``vocab_size``.
5. A well-known tokenizer name or file name (``vocab_known.KNOWN_VOCABS``), or the
   tokenizer type's own vocabulary (``KNOWN_TYPES``), each with its published source.
6. ``--vocab-size`` with another tokenizer: that size, as the user states it.
7. Otherwise 32,000 tokens, and the note says so and how to set it (``--vocab-size``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from primus_ext.frameworks.megatron.vocab_known import KNOWN_TYPES, PAI_BASES, known_vocab

ASSUMED_VOCAB = 32000


@dataclass(frozen=True, kw_only=True, slots=True)
class Vocab:
    size: int  # tokens before padding (the padded size itself when ``padded``)
    how: str  # the rule that decided it, for the launcher's note
    padded: bool = False  # --padded-vocab-size: Megatron-LM pads nothing more


def resolve_vocab(*, tokenizer_type: str | None, vocab_size: int | None,
                  tokenizer_model: str | None, vocab_file: str | None,
                  padded_vocab_size: int | None = None,
                  patch_tokenizer_type: str | None = None, extra_vocab_size: int = 0) -> Vocab:
    if tokenizer_type == "NullTokenizer":
        if vocab_size is None:
            raise ValueError("--tokenizer-type NullTokenizer needs --vocab-size "
                             "(Megatron-LM's NullTokenizer has no vocabulary of its own)")
        return Vocab(size=vocab_size + 1, how=f"NullTokenizer: --vocab-size {vocab_size} "
                                               "+ its EOD token")
    if padded_vocab_size is not None:
        if padded_vocab_size < 1:
            raise ValueError(f"--padded-vocab-size {padded_vocab_size}: must be positive")
        return Vocab(size=padded_vocab_size, padded=True,
                     how=f"--padded-vocab-size {padded_vocab_size}, taken as given "
                         "(Megatron-LM pads no further)")
    if patch_tokenizer_type is not None:
        return _pai_vocab(patch_tokenizer_type, extra_vocab_size)
    if tokenizer_type == "TikTokenizer" and vocab_size is not None:
        return Vocab(size=vocab_size, how=f"TikTokenizer: --vocab-size {vocab_size}")
    for path in (vocab_file, tokenizer_model):
        if path and os.path.exists(path):
            n = count_tokens(path)
            if n is not None:
                return Vocab(size=n, how=f"read from {path}")
    if tokenizer_model:
        known = known_vocab(tokenizer_model)
        if known is not None:
            return Vocab(size=known.size, how=f"{tokenizer_model}: {known.size} tokens "
                                              f"({known.source})")
    kind = tokenizer_type
    if kind is None and vocab_file:
        kind = "GPT2BPETokenizer"  # --vocab-file / --merge-file: GPT-2 BPE
    if kind in KNOWN_TYPES:
        known = KNOWN_TYPES[kind]
        return Vocab(size=known.size, how=f"{kind} without its file here: "
                                          f"{known.size} tokens ({known.source})")
    if vocab_size is not None:
        return Vocab(size=vocab_size, how=f"--vocab-size {vocab_size}")
    what = tokenizer_model or vocab_file or tokenizer_type or "no tokenizer flags"
    return Vocab(size=ASSUMED_VOCAB, how=(
        f"ASSUMED {ASSUMED_VOCAB} tokens: the vocabulary of {what} is not known here "
        "(no local tokenizer file, not a known tokenizer); set it with --vocab-size N "
        "or --padded-vocab-size N"))


def _pai_vocab(kind: str, extra: int) -> Vocab:
    """Pai-Megatron-Patch (--patch-tokenizer-type): its tokenizer's base vocabulary plus
    --extra-vocab-size is the padded size (build_tokenizer sets padded_vocab_size)."""
    base = PAI_BASES.get(kind)
    if base is None:
        return Vocab(size=ASSUMED_VOCAB, how=(
            f"ASSUMED {ASSUMED_VOCAB} tokens: --patch-tokenizer-type {kind} is not known "
            "here; set it with --padded-vocab-size N"))
    return Vocab(size=base.size + extra, padded=True, how=(
        f"--patch-tokenizer-type {kind}: {base.size} + --extra-vocab-size {extra} = "
        f"{base.size + extra}, the padded size (Pai-Megatron-Patch build_tokenizer; "
        f"{base.source})"))


def count_tokens(path: str) -> int | None:
    """Tokens of a local tokenizer file or Hugging Face directory; None if unreadable."""
    if os.path.isdir(path):
        for name in ("tokenizer.json", "vocab.json", "tokenizer.model"):
            f = os.path.join(path, name)
            if os.path.exists(f):
                return count_tokens(f)
        return _config_vocab(os.path.join(path, "config.json"))
    if os.path.basename(path) == "config.json":
        return _config_vocab(path)
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            return _json_tokens(data)
        with open(path, "rb") as fh:
            return _sentencepiece_pieces(fh.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _config_vocab(path: str) -> int | None:
    """A Hugging Face ``config.json``'s ``vocab_size`` (the embedding's rows; a
    multimodal config's ``text_config``), when a directory holds no tokenizer file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and isinstance(data.get("text_config"), dict) \
            and "vocab_size" not in data:
        data = data["text_config"]
    n = data.get("vocab_size") if isinstance(data, dict) else None
    return n if isinstance(n, int) and n > 0 else None


def _json_tokens(data) -> int | None:
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        vocab = data["model"].get("vocab")  # tokenizer.json (Hugging Face tokenizers)
        if not isinstance(vocab, (dict, list)):
            return None
        ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
        ids |= {t["id"] for t in data.get("added_tokens", []) if "id" in t}
        return len(ids)
    if isinstance(data, dict) and all(isinstance(v, int) for v in data.values()):
        return len(data)  # GPT-2 BPE vocab.json: token -> id
    return None


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def _sentencepiece_pieces(buf: bytes) -> int | None:
    """Pieces of a SentencePiece ModelProto (field 1, ``repeated SentencePiece pieces``;
    github.com/google/sentencepiece src/sentencepiece_model.proto), read from the wire
    format: what ``SentencePieceProcessor.vocab_size()`` returns."""
    i, pieces = 0, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return None
        if field == 1 and wire == 2:
            pieces += 1
    return pieces or None
