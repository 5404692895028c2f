"""The vocabulary a Megatron-LM launch line trains with (pure: no torch, no tokenizers).

Megatron-LM builds the tokenizer, takes the size it reports and pads it
(megatron/training/arguments.py ``_vocab_size_with_padding``: up to a multiple of
``--make-vocab-size-divisible-by`` x TP; ModelSpec.make_vocab_size_divisible_by and the
TP factor do the same here). The size before padding is decided in this order, and the
rule that decided it is returned with it:

1. ``--tokenizer-type NullTokenizer``: ``--vocab-size`` + 1 (it appends an EOD token).
2. ``--vocab-size`` with any other tokenizer: that size, as the user states it.
3. A tokenizer file on this machine: ``--vocab-file`` (GPT-2 BPE ``vocab.json``: its
   entries), ``--tokenizer-model`` as a SentencePiece ``.model`` (its pieces), a
   ``tokenizer.json`` or a Hugging Face directory holding one (the model's vocabulary
   plus added tokens outside it, as ``len(AutoTokenizer)`` counts them).
4. A well-known tokenizer (``KNOWN_VOCABS`` by Hugging Face repository name, or the
   tokenizer type's own vocabulary), each with its published source.
5. Otherwise 32,000 tokens, and the note says so and how to set it (``--vocab-size``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

ASSUMED_VOCAB = 32000


@dataclass(frozen=True, kw_only=True, slots=True)
class Vocab:
    size: int  # tokens before padding
    how: str  # the rule that decided it, for the launcher's note


@dataclass(frozen=True, kw_only=True, slots=True)
class KnownVocab:
    size: int  # tokens the tokenizer reports
    source: str


# By the Hugging Face repository name (after the owner), lower case, as a prefix: a
# --tokenizer-model "owner/Name" or a path whose last part is "Name" matches.
KNOWN_VOCABS: tuple[tuple[str, KnownVocab], ...] = (
    ("deepseek-v3", KnownVocab(size=129280, source=(
        "huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json vocab_size"))),
    # Qwen3 (all sizes and MoE): 151,643 BPE tokens + 26 added special tokens (ids
    # 151643..151668 in tokenizer_config.json); config.json pads the embedding to 151,936.
    ("qwen3-", KnownVocab(size=151669, source=(
        "huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/tokenizer_config.json "
        "added_tokens_decoder (last id 151668); config.json vocab_size 151936"))),
    ("meta-llama-3", KnownVocab(size=128256, source=(
        "huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json vocab_size "
        "(128,000 BPE + 256 special tokens)"))),
    ("llama-3", KnownVocab(size=128256, source=(
        "huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json vocab_size"))),
    ("llama-2-", KnownVocab(size=32000, source=(
        "huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json vocab_size "
        "(SentencePiece tokenizer.model, 32,000 pieces)"))),
    ("mixtral-8x7b", KnownVocab(size=32000, source=(
        "huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json vocab_size"))),
    ("mixtral-8x22b-v0.1", KnownVocab(size=32000, source=(
        "huggingface.co/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json vocab_size"))),
    ("gpt-oss-", KnownVocab(size=201088, source=(
        "huggingface.co/openai/gpt-oss-20b/blob/main/config.json vocab_size "
        "(o200k_harmony encoding, github.com/openai/harmony)"))),
    ("gpt2", KnownVocab(size=50257, source=(
        "huggingface.co/openai-community/gpt2/blob/main/config.json vocab_size"))),
)
# Tokenizer types that fix their vocabulary when their file is not at hand.
KNOWN_TYPES: dict[str, KnownVocab] = {
    "GPT2BPETokenizer": KnownVocab(size=50257, source=(
        "GPT-2 BPE vocab.json: 50,257 entries (huggingface.co/openai-community/gpt2 "
        "config.json vocab_size)")),
    "Llama2Tokenizer": KnownVocab(size=32000, source=(
        "Llama 2's SentencePiece model, 32,000 pieces (huggingface.co/meta-llama/"
        "Llama-2-7b-hf config.json vocab_size)")),
}


def resolve_vocab(*, tokenizer_type: str | None, vocab_size: int | None,
                  tokenizer_model: str | None, vocab_file: str | None) -> Vocab:
    if tokenizer_type == "NullTokenizer":
        if vocab_size is None:
            raise ValueError("--tokenizer-type NullTokenizer needs --vocab-size "
                             "(Megatron-LM's NullTokenizer has no vocabulary of its own)")
        return Vocab(size=vocab_size + 1, how=f"NullTokenizer: --vocab-size {vocab_size} "
                                               "+ its EOD token")
    if vocab_size is not None:
        return Vocab(size=vocab_size, how=f"--vocab-size {vocab_size}")
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
    what = tokenizer_model or vocab_file or tokenizer_type or "no tokenizer flags"
    return Vocab(size=ASSUMED_VOCAB, how=(
        f"ASSUMED {ASSUMED_VOCAB} tokens: the vocabulary of {what} is not known here "
        "(no local tokenizer file, not a known tokenizer); set it with --vocab-size N"))


def known_vocab(name: str) -> KnownVocab | None:
    base = name.rstrip("/").split("/")[-1].lower()
    for prefix, known in KNOWN_VOCABS:
        if base.startswith(prefix):
            return known
    return None


def count_tokens(path: str) -> int | None:
    """Tokens of a local tokenizer file or Hugging Face directory; None if unreadable."""
    if os.path.isdir(path):
        for name in ("tokenizer.json", "vocab.json", "tokenizer.model"):
            f = os.path.join(path, name)
            if os.path.exists(f):
                return count_tokens(f)
        return None
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            return _json_tokens(data)
        with open(path, "rb") as fh:
            return _sentencepiece_pieces(fh.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


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
