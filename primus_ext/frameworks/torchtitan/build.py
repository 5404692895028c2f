"""Build torchtitan's own Trainer for a measurement or a CPU ground-truth run.

A torchtitan job is its registry config (``--module llama3 --config llama3_8b``) plus tyro
flags (``ConfigManager().parse_args``, ``torchtitan/config/manager.py``). A measurement
replaces the registry model by the downscaled one (``llama3_model_config``: the same
llama3 block, norms, RoPE and init as ``torchtitan/models/llama3/__init__.py`` builds,
with the dims of a ``ModelDims``) and points the tokenizer and the dataset at a small
local copy (``write_assets``: a word-level tokenizer and random-word documents, so no
download and tokens spread over the vocabulary). Nothing here times or traces.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
from dataclasses import dataclass

from primus_ext.util.files import atomic_write_text


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelDims:
    """Per-rank dims of a llama3-style decoder as torchtitan builds it."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads (Llama 3)
    qk_norm: bool = False  # RMSNorm of each head's q and k (Qwen3)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "qk_norm":
                if not isinstance(v, bool):
                    raise ValueError(f"qk_norm={v!r} must be true or false")
                continue
            if not isinstance(v, int) or v < (0 if f.name == "head_dim" else 1):
                raise ValueError(f"{f.name}={v!r} must be a positive integer")
        if not self.head_dim and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not "
                             f"divisible by num_query_groups={self.num_query_groups}")

    @classmethod
    def of_model(cls, model, num_layers: int | None = None) -> "ModelDims":
        """From a ``ModelSpec`` (primus_ext.spec)."""
        return cls(num_layers=num_layers or model.num_layers, hidden_size=model.hidden_size,
                   num_attention_heads=model.num_attention_heads,
                   num_query_groups=model.num_query_groups or model.num_attention_heads,
                   ffn_hidden_size=model.dense_ffn_size, vocab_size=model.vocab_size,
                   head_dim=model.head_dim, qk_norm=model.qk_layernorm)

    @property
    def per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelDims":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"model dims {text!r} are not JSON: {exc}") from exc
        return cls(**d)


def llama3_model_config(dims: ModelDims):
    """torchtitan's ``Llama3Model.Config`` with ``dims`` (untied embeddings, SwiGLU FFN of
    ``ffn_hidden_size``, GQA, complex RoPE as the 8B flavour); attention by the registry's
    default backend (FlexAttention; SDPA on the CPU through patches/torchtitan_sdpa.py)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import get_attention_config, make_gqa_config
    from torchtitan.models.llama3 import (_EMBEDDING_INIT, _LINEAR_INIT, _NORM_INIT,
                                          _build_llama3_layers, _depth_init,
                                          _output_linear_init)
    from torchtitan.models.llama3.model import Llama3Model
    d, v, hd = dims.hidden_size, dims.vocab_size, dims.per_head
    rope = ComplexRoPE.Config(dim=hd, max_seq_len=131072, theta=500000, scaling="llama")
    layers = _build_llama3_layers(
        fuse_qkv=True, n_layers=dims.num_layers, dim=d, n_heads=dims.num_attention_heads,
        n_kv_heads=dims.num_query_groups, hidden_dim=dims.ffn_hidden_size, rope=rope,
        attn_backend="flex")
    if dims.head_dim or dims.qk_norm:
        # A head dim other than hidden / heads (Qwen3, GPT-OSS) and q/k norms: the same
        # attention as _build_llama3_layers makes, through make_gqa_config's own options.
        qk = RMSNorm.Config(normalized_shape=hd, param_init=_NORM_INIT) \
            if dims.qk_norm else None
        layers = [dataclasses.replace(layer, attention=make_gqa_config(
            dim=d, n_heads=dims.num_attention_heads, n_kv_heads=dims.num_query_groups,
            head_dim=hd, qk_norm=qk, wqkv_param_init=_LINEAR_INIT,
            wo_param_init=_depth_init(i), inner_attention=get_attention_config("flex"),
            fuse_qkv=True, rope=rope)) for i, layer in enumerate(layers)]
    return Llama3Model.Config(
        dim=d, vocab_size=v,
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d,
                                        param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=d, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v,
                              param_init=_output_linear_init(d)),
        layers=layers)


def write_assets(root: str, vocab_size: int, *, num_docs: int = 64,
                 words_per_doc: int = 600, seed: int = 0) -> str:
    """A word-level tokenizer (``<bos>``, ``<eos>`` and ``vocab_size - 2`` words) and a
    ``train.jsonl`` of random-word documents under ``root``; returns ``root``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    if vocab_size < 3:
        raise ValueError(f"vocab_size={vocab_size} must be >= 3 (two special tokens)")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    words = [f"w{i}" for i in range(vocab_size - 2)]
    vocab = {"<bos>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    atomic_write_text(os.path.join(root, "tokenizer.json"), tok.to_str())
    atomic_write_text(os.path.join(root, "tokenizer_config.json"),
                      json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    rng = random.Random(seed)
    lines = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(words_per_doc))})
             for _ in range(num_docs)]
    atomic_write_text(os.path.join(root, "data", "train.jsonl"), "\n".join(lines) + "\n")
    return root


def ensure_assets(root: str, vocab_size: int) -> str:
    """``write_assets`` once per folder: the processes of one job share it, so the first
    one writes under a file lock and the others find it (and its vocabulary) there."""
    import fcntl
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            stamp = os.path.join(root, "vocab_size")
            if not os.path.exists(stamp) or open(stamp).read().strip() != str(vocab_size):
                write_assets(root, vocab_size)
                atomic_write_text(stamp, f"{vocab_size}\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root


def asset_flags(root: str) -> list[str]:
    """The job's tokenizer and dataset on the generated assets. The dataset is read as
    torchtitan's ``c4_test`` (``load_dataset(path, split="train")`` on local JSON): the
    ``c4`` loader asks the path for the ``en`` configuration, which only the Hub's
    ``allenai/c4`` has (``BuilderConfig 'en' not found`` on a local folder)."""
    return ["--hf_assets_path", root, "--dataloader.dataset", "c4_test",
            "--dataloader.dataset_path", os.path.join(root, "data")]


def trainer_config(argv: list[str], dims: ModelDims | None = None):
    """``ConfigManager().parse_args(argv)`` (with the CPU flags on a CPU), the model
    replaced by ``dims`` when given. Checkpoints, validation and profiling stay as the
    line says (off unless asked)."""
    from patches.torchtitan_apply import with_cpu_flags
    from torchtitan.config import ConfigManager
    config = ConfigManager().parse_args(with_cpu_flags(argv))
    if dims is not None:
        if config.model_spec.name != "llama3":
            # Another module's parallelize / pipelining functions expect its own model
            # (deepseek_v3's its MTP layers): the measured decoder comes with llama3's.
            config.model_spec = llama3_model_spec()
        config.model_spec.model = llama3_model_config(dims)
    return config


def llama3_model_spec():
    """torchtitan's llama3 ``ModelSpec`` (its parallelize and pipelining functions); the
    caller sets ``model``."""
    from torchtitan.models.llama3 import model_registry
    return model_registry("debugmodel")


def single_process_env() -> None:
    """torchrun's variables for a one-process group (when not launched by torchrun)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def build_trainer(config):
    """The Trainer (process group, parallelized model, optimizer, data loader). A process
    group the caller already initialised (a drop-in under torchrun) is kept: torchtitan's
    ``init_distributed`` calls ``init_process_group`` unconditionally, which is then
    skipped for the build."""
    import torch.distributed as dist
    if not dist.is_initialized():
        trainer = config.build()
        trainer._primus_owns_pg = True
        return trainer
    original = dist.init_process_group
    dist.init_process_group = lambda *args, **kwargs: None
    try:
        trainer = config.build()
    finally:
        dist.init_process_group = original
    trainer._primus_owns_pg = False
    return trainer


def teardown(trainer) -> None:
    """Close the Trainer; destroy the process group only if its build created it."""
    import torch.distributed as dist
    try:
        trainer.close()
    finally:
        if dist.is_initialized() and getattr(trainer, "_primus_owns_pg", True):
            dist.destroy_process_group()
