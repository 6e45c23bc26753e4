"""What every decoder-only architecture provides, and the llama-style loader they share.

An architecture module defines ``NAME``, ``ROPE_NEOX`` (rotate halves instead of adjacent
pairs) and ``QKV_BIAS``, and may override ``read_config`` / ``load_weights``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...errors import ModelFileError
from ..gguf_file import GGUFFile, TensorInfo, dequantize_tensor

Matrix = Any  # a weight matrix bound to its kernel (kernels.Linear): what ``load_weights``' factory makes


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters read from GGUF metadata."""

    arch: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    vocab_size: int
    n_ctx_train: int
    rope_base: float
    rope_dim: int
    rope_neox: bool
    rms_eps: float
    qkv_bias: bool

    @property
    def kv_bytes_per_token(self) -> int:
        """f32 K and V for every layer (the simple cache)."""
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * 4


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [d_model] f32
    wq: Matrix  # [n_head * head_dim, d_model]
    wk: Matrix  # [n_kv_head * head_dim, d_model]
    wv: Matrix  # [n_kv_head * head_dim, d_model]
    wo: Matrix  # [d_model, n_head * head_dim]
    ffn_norm: np.ndarray  # [d_model] f32
    w_gate: Matrix  # [d_ff, d_model]
    w_up: Matrix  # [d_ff, d_model]
    w_down: Matrix  # [d_model, d_ff]
    bq: np.ndarray | None = None  # [n_head * head_dim]
    bk: np.ndarray | None = None  # [n_kv_head * head_dim]
    bv: np.ndarray | None = None  # [n_kv_head * head_dim]


@dataclass
class ModelWeights:
    token_embd: Matrix  # [vocab, d_model]
    output_norm: np.ndarray  # [d_model] f32
    output: Matrix  # [vocab, d_model]; the embedding itself when tied
    layers: list[LayerWeights] = field(default_factory=list)
    rope_freq_factors: np.ndarray | None = None  # [rope_dim / 2]

    @property
    def nbytes(self) -> int:
        total = self.token_embd.nbytes + (0 if self.output is self.token_embd else self.output.nbytes)
        for lw in self.layers:
            total += sum(m.nbytes for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down))
        return total


def read_config(f: GGUFFile, arch: str, rope_neox: bool, qkv_bias: bool) -> ModelConfig:
    """The llama-family hyper-parameters ``{arch}.*``, each of them checked on its own by
    ``GGUFFile.metadata`` (type and range, model/metadata.py), here against each other
    and against the embedding."""
    m = f.metadata

    def key(suffix: str):
        return m.value(f"{arch}.{suffix}")

    n_head, d_model = key("attention.head_count"), key("embedding_length")
    n_kv = key("attention.head_count_kv") or n_head
    head_dim = key("attention.key_length")
    if head_dim is None:
        if d_model % n_head:
            raise ModelFileError(f"{arch}.attention.head_count {n_head} does not divide {arch}.embedding_length "
                                 f"{d_model} (and {arch}.attention.key_length is not set)")
        head_dim = d_model // n_head
    if n_head % n_kv:
        raise ModelFileError(f"{arch}.attention.head_count {n_head} is not a multiple of "
                             f"{arch}.attention.head_count_kv {n_kv}")
    if head_dim % 2:
        raise ModelFileError(f"head dimension {head_dim} must be even for RoPE")
    rope_dim = key("rope.dimension_count") or head_dim
    if rope_dim != head_dim:
        raise ModelFileError(f"partial rotary embeddings (rope dim {rope_dim} < head dim {head_dim}) are not supported")
    vocab = int(f.tensor("token_embd.weight").shape[0])
    tokens = m.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != vocab:
        raise ModelFileError(f"{os.path.basename(f.path)}: the vocabulary (tokenizer.ggml.tokens) has {len(tokens)} "
                             f"tokens but token_embd.weight has {vocab} rows")
    return ModelConfig(
        arch=arch,
        n_layer=key("block_count"),
        d_model=d_model,
        n_head=n_head,
        n_kv_head=n_kv,
        head_dim=head_dim,
        d_ff=key("feed_forward_length"),
        vocab_size=vocab,
        n_ctx_train=key("context_length"),
        rope_base=float(key("rope.freq_base")),
        rope_dim=rope_dim,
        rope_neox=rope_neox,
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        qkv_bias=qkv_bias,
    )


def _vector(f: GGUFFile, name: str, n: int, required: bool = True) -> np.ndarray | None:
    t = f.tensor(name, required=required)
    if t is None:
        return None
    v = dequantize_tensor(t).reshape(-1)
    if v.shape != (n,):
        raise ModelFileError(f"tensor {name}: shape {t.shape}, expected ({n},)")
    return np.ascontiguousarray(v, dtype=np.float32)


def load_weights(f: GGUFFile, cfg: ModelConfig, matrix: Callable[[TensorInfo, tuple], Matrix]) -> ModelWeights:
    """Every tensor of a llama-style model; ``matrix(info, (rows, cols))`` binds a weight
    matrix to its kernel and checks its shape (the forward pass passes kernels.Linear)."""
    d, dq, dkv, ff = cfg.d_model, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.d_ff
    token_embd = matrix(f.tensor("token_embd.weight"), (cfg.vocab_size, d))
    out_info = f.tensor("output.weight", required=False)
    output = matrix(out_info, (cfg.vocab_size, d)) if out_info is not None else token_embd
    layers = []
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        layers.append(
            LayerWeights(
                attn_norm=_vector(f, p + "attn_norm.weight", d),
                wq=matrix(f.tensor(p + "attn_q.weight"), (dq, d)),
                wk=matrix(f.tensor(p + "attn_k.weight"), (dkv, d)),
                wv=matrix(f.tensor(p + "attn_v.weight"), (dkv, d)),
                wo=matrix(f.tensor(p + "attn_output.weight"), (d, dq)),
                ffn_norm=_vector(f, p + "ffn_norm.weight", d),
                w_gate=matrix(f.tensor(p + "ffn_gate.weight"), (ff, d)),
                w_up=matrix(f.tensor(p + "ffn_up.weight"), (ff, d)),
                w_down=matrix(f.tensor(p + "ffn_down.weight"), (d, ff)),
                bq=_vector(f, p + "attn_q.bias", dq, required=cfg.qkv_bias),
                bk=_vector(f, p + "attn_k.bias", dkv, required=cfg.qkv_bias),
                bv=_vector(f, p + "attn_v.bias", dkv, required=cfg.qkv_bias),
            )
        )
    return ModelWeights(
        token_embd=token_embd,
        output_norm=_vector(f, "output_norm.weight", d),
        output=output,
        layers=layers,
        rope_freq_factors=_vector(f, "rope_freqs.weight", cfg.rope_dim // 2, required=False),
    )
