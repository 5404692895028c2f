"""Tokenizer files read for their size, in the formats Megatron-LM's tokenizers load:
Hugging Face ``tokenizer.json`` (model vocabulary plus added tokens, as
``len(AutoTokenizer)`` counts them), a Hugging Face directory, and a SentencePiece
``ModelProto`` (github.com/google/sentencepiece src/sentencepiece_model.proto: field 1,
``repeated SentencePiece pieces``; field 2 the trainer spec)."""
from __future__ import annotations

import json
import struct

import pytest

from primus_ext.frameworks.megatron.vocab import count_tokens, known_vocab, resolve_vocab


def _tokenizer_json(n: int, added: list[int]) -> dict:
    return {"version": "1.0", "added_tokens": [{"id": i, "content": f"<s{i}>",
                                                "special": True} for i in added],
            "model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(n)}, "merges": []}}


def test_tokenizer_json_counts_vocabulary_and_new_added_tokens(tmp_path):
    f = tmp_path / "tokenizer.json"
    f.write_text(json.dumps(_tokenizer_json(100, [0, 100, 101])))  # id 0 is in the vocab
    assert count_tokens(str(f)) == 102
    assert count_tokens(str(tmp_path)) == 102  # a Hugging Face directory
    v = resolve_vocab(tokenizer_type="HuggingFaceTokenizer", vocab_size=None,
                      tokenizer_model=str(tmp_path), vocab_file=None)
    assert v.size == 102 and str(tmp_path) in v.how


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def test_sentencepiece_model_counts_its_pieces(tmp_path):
    pieces = b"".join(_field(1, _field(1, f"piece{i}".encode()) + b"\x15"
                             + struct.pack("<f", -float(i)) + b"\x18\x01")
                      for i in range(7))
    trainer = _field(2, _varint(3 << 3 | 0) + _varint(7))  # trainer_spec.vocab_size
    f = tmp_path / "tokenizer.model"
    f.write_bytes(pieces + trainer)
    assert count_tokens(str(f)) == 7
    v = resolve_vocab(tokenizer_type="Llama2Tokenizer", vocab_size=None,
                      tokenizer_model=str(f), vocab_file=None)
    assert v.size == 7


def test_names_match_by_repository_name():
    assert known_vocab("deepseek-ai/DeepSeek-V3").size == 129280
    assert known_vocab("/models/Qwen3-30B-A3B/").size == 151669
    assert known_vocab("meta-llama/Llama-3.1-8B").size == 128256
    assert known_vocab("openai/gpt-oss-120b").size == 201088
    assert known_vocab("mistralai/Mixtral-8x22B-Instruct-v0.1").size == 32768
    assert known_vocab("acme/Mixtral-8x22B-Instruct-v0.2") is None  # not listed


def _vocab(**kw):
    args = dict(tokenizer_type=None, vocab_size=None, tokenizer_model=None, vocab_file=None)
    return resolve_vocab(**(args | kw))


# Tokenizers Megatron-LM's own launch lines name (tests/ and examples/ of NVIDIA/
# Megatron-LM main d98e8a64), with the size each reports.
@pytest.mark.parametrize("kind,model,size", [
    ("GPTSentencePieceTokenizer", "${DATA_PATH}/utils/nemotron_2_256k.model", 256000),
    ("HuggingFaceTokenizer", "/lustre/models/models--meta-llama--Meta-Llama-3.1-8B-"
     "Instruct/snapshots/5206a32e0bd3067aef1ce90f5528ade7d866253f/", 128256),
    ("HuggingFaceTokenizer", "${CHECKPOINT_LOAD_PATH}/model/qwen3-8b-dist/tokenizer",
     151669),
    ("HuggingFaceTokenizer", "unsloth/Qwen2.5-32B", 151665),
    ("HuggingFaceTokenizer", "Qwen/Qwen2-72B-Instruct", 151646),
    ("HuggingFaceTokenizer", "mistralai/Mistral-7B-Instruct-v0.3", 32768),
    ("HuggingFaceTokenizer", "deepseek-ai/DeepSeek-V2-Lite", 102400),
    ("HuggingFaceTokenizer", "google/gemma-2-9b", 256000),
    ("HuggingFaceTokenizer", "unsloth/gpt-oss-20b-BF16", 201088),
    ("TikTokenizer", "/ckpt/multiMixV8.gpt4o_nc_sd.500000.128k.vocab.json", 131072),
])
def test_well_known_tokenizers_by_name(kind, model, size):
    v = _vocab(tokenizer_type=kind, tokenizer_model=model)
    assert v.size == size and "ASSUMED" not in v.how and not v.padded


def test_padded_vocab_size_is_taken_as_given_and_vocab_size_only_where_read():
    v = _vocab(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="Qwen/Qwen2.5-7B",
               padded_vocab_size=152064)
    assert (v.size, v.padded) == (152064, True)
    # HuggingFaceTokenizer reports its own size: --vocab-size does not change it ...
    v = _vocab(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="Qwen/Qwen3-8B",
               vocab_size=1000)
    assert v.size == 151669
    # ... but TikTokenizer takes it (CustomTikTokenizer(vocab_size=args.vocab_size)).
    assert _vocab(tokenizer_type="TikTokenizer", tokenizer_model="x.json",
                  vocab_size=200000).size == 200000
    assert _vocab(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="acme/tok",
                  vocab_size=1000).size == 1000  # unknown: the user's statement


def test_a_directory_with_only_config_json_gives_its_vocab_size(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 152064}))
    assert count_tokens(str(tmp_path)) == 152064
    assert count_tokens(str(tmp_path / "config.json")) == 152064
