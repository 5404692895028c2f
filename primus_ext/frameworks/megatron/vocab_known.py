"""Well-known tokenizers and their sizes, each with its published source (pure data).

``KNOWN_VOCABS`` is keyed by a lower-case prefix of the Hugging Face repository name
(after the owner) or of a tokenizer file's name: what Megatron-LM's tokenizer of that
name reports (``len(AutoTokenizer)`` for ``HuggingFaceTokenizer``: the model's
vocabulary plus added tokens; the pieces of a SentencePiece model). Where only the
model's ``config.json`` ``vocab_size`` (the embedding's rows) is published, that is the
size and the source says so. The first matching prefix wins: longer, more specific
prefixes come first.

``KNOWN_TYPES``: tokenizer types whose vocabulary is fixed when their file is not at hand
(Megatron-LM core_v0.16.1 megatron/training/tokenizer/tokenizer.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class KnownVocab:
    size: int  # tokens the tokenizer reports
    source: str


def _k(size: int, source: str) -> KnownVocab:
    return KnownVocab(size=size, source=source)


_HF = "huggingface.co/"
_QWEN25 = _k(151665, _HF + "Qwen/Qwen2.5-7B/blob/main/tokenizer_config.json "
             "added_tokens_decoder: 151,643 BPE tokens + 22 special tokens (ids 151643.."
             "151664); config.json pads the embedding to 151,936 (0.5B-3B) or 152,064")
KNOWN_VOCABS: tuple[tuple[str, KnownVocab], ...] = (
    ("deepseek-v3", _k(129280, _HF + "deepseek-ai/DeepSeek-V3/blob/main/config.json "
                       "vocab_size")),
    ("deepseek-v2", _k(102400, _HF + "deepseek-ai/DeepSeek-V2/blob/main/config.json "
                       "vocab_size (DeepSeek-V2-Lite: the same)")),
    # Qwen3 (all sizes and MoE): 151,643 BPE tokens + 26 added special tokens (ids
    # 151643..151668 in tokenizer_config.json); config.json pads the embedding to 151,936.
    ("qwen3-", _k(151669, _HF + "Qwen/Qwen3-30B-A3B/blob/main/tokenizer_config.json "
                  "added_tokens_decoder (last id 151668); config.json vocab_size 151936")),
    ("qwen3", _k(151669, _HF + "Qwen/Qwen3-8B/blob/main/tokenizer_config.json "
                 "added_tokens_decoder (last id 151668)")),
    ("qwen2.5-", _QWEN25),
    ("qwen2_5", _QWEN25),
    ("qwen2-", _k(151646, _HF + "Qwen/Qwen2-72B/blob/main/tokenizer_config.json "
                  "added_tokens_decoder: 151,643 BPE tokens + 3 special tokens (ids 151643.."
                  "151645); config.json vocab_size 151,936 (0.5B, 1.5B) or 152,064")),
    ("meta-llama-3", _k(128256, _HF + "meta-llama/Meta-Llama-3-8B/blob/main/config.json "
                        "vocab_size (128,000 BPE + 256 special tokens)")),
    ("llama-3", _k(128256, _HF + "meta-llama/Llama-3.1-8B/blob/main/config.json "
                   "vocab_size")),
    ("llama3", _k(128256, _HF + "meta-llama/Llama-3.1-8B/blob/main/config.json "
                  "vocab_size (a Llama 3 tokenizer directory or file named llama3*)")),
    ("llama-2-", _k(32000, _HF + "meta-llama/Llama-2-7b-hf/blob/main/config.json "
                    "vocab_size (SentencePiece tokenizer.model, 32,000 pieces)")),
    ("llama2", _k(32000, _HF + "meta-llama/Llama-2-7b-hf/blob/main/config.json "
                  "vocab_size (a Llama 2 tokenizer named llama2*)")),
    ("mixtral-8x22b-instruct-v0.1", _k(32768, _HF + "mistralai/Mixtral-8x22B-Instruct-"
                                       "v0.1/blob/main/config.json vocab_size")),
    ("mixtral-8x7b", _k(32000, _HF + "mistralai/Mixtral-8x7B-v0.1/blob/main/config.json "
                        "vocab_size")),
    ("mixtral-8x22b-v0.1", _k(32000, _HF + "mistralai/Mixtral-8x22B-v0.1/blob/main/"
                              "config.json vocab_size")),
    ("mistral-7b-v0.1", _k(32000, _HF + "mistralai/Mistral-7B-v0.1/blob/main/config.json "
                           "vocab_size")),
    ("mistral-7b-instruct-v0.1", _k(32000, _HF + "mistralai/Mistral-7B-Instruct-v0.1/"
                                    "blob/main/config.json vocab_size")),
    ("mistral-7b-instruct-v0.2", _k(32000, _HF + "mistralai/Mistral-7B-Instruct-v0.2/"
                                    "blob/main/config.json vocab_size")),
    ("mistral-7b-v0.3", _k(32768, _HF + "mistralai/Mistral-7B-v0.3/blob/main/config.json "
                           "vocab_size (v3 tokenizer: 32,768)")),
    ("mistral-7b-instruct-v0.3", _k(32768, _HF + "mistralai/Mistral-7B-Instruct-v0.3/"
                                    "blob/main/config.json vocab_size")),
    ("gpt-oss-", _k(201088, _HF + "openai/gpt-oss-20b/blob/main/config.json vocab_size "
                    "(o200k_harmony encoding, github.com/openai/harmony)")),
    ("gpt2", _k(50257, _HF + "openai-community/gpt2/blob/main/config.json vocab_size")),
    ("gemma-2-", _k(256000, _HF + "google/gemma-2-9b/blob/main/config.json vocab_size")),
    ("gemma-7b", _k(256000, _HF + "google/gemma-7b/blob/main/config.json vocab_size")),
    ("gemma-2b", _k(256000, _HF + "google/gemma-2b/blob/main/config.json vocab_size")),
    ("gemma-1.1-", _k(256000, _HF + "google/gemma-1.1-7b-it/blob/main/config.json "
                      "vocab_size")),
    # NVIDIA's 256k SentencePiece model (Megatron-LM's functional tests pass
    # ${DATA_PATH}/utils/nemotron_2_256k.model with GPTSentencePieceTokenizer).
    ("nemotron_2_256k", _k(256000, "Nemotron-4 15B Technical Report, arXiv:2402.16819 "
                           "section 2: a SentencePiece tokenizer with a vocabulary of 256,000 "
                           "tokens; huggingface.co/nvidia/Nemotron-4-340B-Base config "
                           "vocab_size 256000")),
)

KNOWN_TYPES: dict[str, KnownVocab] = {
    "GPT2BPETokenizer": _k(50257, "GPT-2 BPE vocab.json: 50,257 entries (huggingface.co/"
                           "openai-community/gpt2 config.json vocab_size)"),
    "Llama2Tokenizer": _k(32000, "Llama 2's SentencePiece model, 32,000 pieces (huggingface"
                          ".co/meta-llama/Llama-2-7b-hf config.json vocab_size)"),
    # CustomTikTokenizer: 'if vocab_size is None: vocab_size = 2**17' (--vocab-size,
    # when given, is the size instead).
    "TikTokenizer": _k(131072, "Megatron-LM core_v0.16.1 megatron/training/tokenizer/"
                       "tokenizer.py CustomTikTokenizer: without --vocab-size, 2**17"),
}


# Pai-Megatron-Patch's tokenizers (megatron_patch/tokenizer/__init__.py build_tokenizer,
# --patch-tokenizer-type): the embedding is the tokenizer's base vocabulary plus
# --extra-vocab-size (or --padded-vocab-size when given), set as Megatron-LM's
# padded_vocab_size, so nothing more is padded.
_QWEN_BPE = _k(151643, "Qwen's byte-level BPE vocabulary, 151,643 entries "
               "(len(tokenizer.encoder); huggingface.co/Qwen/Qwen2.5-7B tokenizer_config.json: "
               "the added tokens start at id 151643)")
PAI_BASES: dict[str, KnownVocab] = {
    "Qwen2Tokenizer": _QWEN_BPE, "Qwen3Tokenizer": _QWEN_BPE, "Qwen2VLTokenizer": _QWEN_BPE,
    "DeepSeekV2Tokenizer": _k(100000, "DeepSeek LLM (arXiv:2401.02954 section 2.1): 100,000 "
                              "BPE tokens, the embedding set to 102,400 (Pai's "
                              "EXTRA_VOCAB_SIZE 2400 for DeepSeek-V2)"),
    "LLama3Tokenizer": _k(128000, "Llama 3's 128,000 BPE tokens (tokenizer.vocab_size; "
                          "huggingface.co/meta-llama/Llama-3.1-8B config.json vocab_size "
                          "128,256 with the 256 special tokens Pai adds as EXTRA_VOCAB_SIZE)"),
    "LLama2Tokenizer": _k(32000, "Llama 2's SentencePiece model, 32,000 pieces"),
    "MixtralTokenizer": _k(32000, "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json "
                           "vocab_size (Mistral-7B-v0.1 the same)"),
}


def known_vocab(name: str) -> KnownVocab | None:
    """The known tokenizer a name or path means: the last path part first, then the
    parents (a Hugging Face cache's ``models--owner--Name`` reads as ``Name``)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p]
    for part in reversed(parts):
        base = part.split("--")[-1].lower()
        for prefix, known in KNOWN_VOCABS:
            if base.startswith(prefix):
                return known
    return None
