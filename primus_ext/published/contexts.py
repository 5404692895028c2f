"""The sequence length each model preset was pre-trained at, as its paper or model card
states it: the reader fills an empty ``seq_len`` cell with it (and says so in the row's
notes). This is the pre-training context, not ``max_position_embeddings`` (Llama 3.1's
131072 is the long-context extension; its pre-training ran at 8192 tokens)."""
from __future__ import annotations

# preset -> (tokens, source)
TRAINING_CONTEXT: dict[str, tuple[int, str]] = {
    "llama3_8b": (8192, "Llama 3 paper, arXiv 2407.21783 Sec. 3.4.1 (initial pre-training "
                  "on 8K-token sequences)"),
    "llama3_70b": (8192, "Llama 3 paper, arXiv 2407.21783 Sec. 3.4.1"),
    "llama3.1_8b": (8192, "Llama 3 paper, arXiv 2407.21783 Sec. 3.4.1"),
    "llama3.1_70b": (8192, "Llama 3 paper, arXiv 2407.21783 Sec. 3.4.1"),
    "llama3.1_405b": (8192, "Llama 3 paper, arXiv 2407.21783 Sec. 3.4.1"),
    "llama2_7b": (4096, "Llama 2 paper, arXiv 2307.09288 Table 1 (context length 4k)"),
    "llama2_13b": (4096, "Llama 2 paper, arXiv 2307.09288 Table 1"),
    "llama2_70b": (4096, "Llama 2 paper, arXiv 2307.09288 Table 1"),
    "mixtral_8x7b": (32768, "Mixtral paper, arXiv 2401.04088 Sec. 2 (context size of 32k "
                     "tokens)"),
    "qwen3_30b_a3b": (4096, "Qwen3 technical report, arXiv 2505.09388 Sec. 3.2 (stage S1 "
                      "at a sequence length of 4,096 tokens)"),
    "qwen3_235b_a22b": (4096, "Qwen3 technical report, arXiv 2505.09388 Sec. 3.2"),
    "deepseek_v3": (4096, "DeepSeek-V3 report, arXiv 2412.19437 Sec. 4.2 (maximum sequence "
                    "length 4K during pre-training)"),
    "gpt3_175b": (2048, "GPT-3 paper, arXiv 2005.14165 Sec. 2.1 (context window 2048)"),
    "gpt3_20b": (2048, "NeMo GPTConfig20B seq_length 2048"),
    "gpt3_5b": (2048, "NeMo GPTConfig5B seq_length 2048"),
    "mpt_1b": (2048, "llm-foundry yamls/pretrain/mpt-1b.yaml max_seq_len 2048"),
    "mpt_3b": (2048, "llm-foundry yamls/pretrain/mpt-3b.yaml max_seq_len 2048"),
    "mpt_7b": (2048, "llm-foundry yamls/pretrain/mpt-7b.yaml max_seq_len 2048"),
    "mpt_13b": (2048, "llm-foundry yamls/pretrain/mpt-13b.yaml max_seq_len 2048"),
    "mpt_30b": (2048, "llm-foundry yamls/pretrain/mpt-30b.yaml max_seq_len 2048"),
    "mpt_70b": (2048, "llm-foundry yamls/pretrain/mpt-70b.yaml max_seq_len 2048"),
    "nemotron4_15b": (4096, "Nemotron-4 15B report, arXiv 2402.16819 Sec. 2 (sequence "
                      "length 4096)"),
    "nemotron4_340b": (4096, "Nemotron-4 340B report, arXiv 2406.11704 Sec. 2.2 (sequence "
                       "length 4096)"),
    "grok1_314b": (8192, "xai-org/grok-1 README (context 8,192 tokens)"),
}


def training_context(preset: str | None) -> tuple[int, str] | None:
    return TRAINING_CONTEXT.get(preset) if preset else None
