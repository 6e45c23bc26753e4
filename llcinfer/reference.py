"""Plain-NumPy reference forward pass: the oracle for the fast path.

Weights are dequantized with ``gguf``'s own dequantizers; every call recomputes the whole
sequence without a cache, in float64 for the attention/softmax, so it shares no code
with the kernels beyond reading the file.
"""

from __future__ import annotations

import numpy as np

from .architectures import get_architecture
from .gguf_file import GGUFFile
from .kernels import dequantize_tensor
from .model import rope_inv_freq


class ReferenceModel:
    def __init__(self, gguf: GGUFFile):
        arch = get_architecture(gguf.require("general.architecture"))
        self.config = cfg = arch.read_config(gguf)
        self.rope_neox = arch.ROPE_NEOX
        t = lambda name: dequantize_tensor(gguf.tensor(name))  # noqa: E731
        opt = lambda name: dequantize_tensor(gguf.tensors[name]) if name in gguf.tensors else None  # noqa: E731
        self.embd = t("token_embd.weight")  # [vocab, d]
        self.output = opt("output.weight")
        if self.output is None:
            self.output = self.embd
        self.output_norm = t("output_norm.weight")
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
            layer = {n: t(p + n + ".weight") for n in names}
            for b in ("attn_q", "attn_k", "attn_v"):
                layer[b + ".bias"] = opt(p + b + ".bias")
            self.layers.append(layer)
        freqs = opt("rope_freqs.weight")
        self.inv_freq = rope_inv_freq(cfg, freqs)

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.config.rms_eps) * w

    def _rope(self, x, positions):
        """x [T, H, D]"""
        theta = positions[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        half = x.shape[-1] // 2
        if self.rope_neox:
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def logits(self, tokens) -> np.ndarray:
        """Logits # [T, vocab] (float32) for every position of ``tokens``."""
        c = self.config
        ids = np.asarray(tokens, dtype=np.int64)
        T = ids.size
        pos = np.arange(T, dtype=np.float64)
        x = self.embd[ids].astype(np.float64)  # [T, d]
        mask = np.triu(np.full((T, T), -np.inf), 1)  # [T, T] causal
        group = c.n_head // c.n_kv_head
        for L in self.layers:
            h = self._rms(x, L["attn_norm"])
            q, k, v = h @ L["attn_q"].T, h @ L["attn_k"].T, h @ L["attn_v"].T
            if L["attn_q.bias"] is not None:
                q, k, v = q + L["attn_q.bias"], k + L["attn_k.bias"], v + L["attn_v.bias"]
            q = self._rope(q.reshape(T, c.n_head, c.head_dim), pos)
            k = self._rope(k.reshape(T, c.n_kv_head, c.head_dim), pos)
            v = v.reshape(T, c.n_kv_head, c.head_dim)
            k = np.repeat(k, group, axis=1)  # [T, H, D]
            v = np.repeat(v, group, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(c.head_dim) + mask  # [H, T, T]
            s = np.exp(s - s.max(-1, keepdims=True))
            p = s / s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", p, v).reshape(T, -1)
            x = x + o @ L["attn_output"].T
            h = self._rms(x, L["ffn_norm"])
            g, u = h @ L["ffn_gate"].T, h @ L["ffn_up"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ L["ffn_down"].T
        return (self._rms(x, self.output_norm) @ self.output.T).astype(np.float32)
