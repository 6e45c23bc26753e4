"""Plain-NumPy reference forward pass: the oracle for the fast path.

Weights are dequantized with ``gguf``'s own dequantizers; every call recomputes the whole
sequence without a cache, in float64, so it shares no code with the kernels beyond
reading the file.  With ``llama_rounding`` (the default, like the fast path) each matmul
input is rounded as llama.cpp rounds it (8-bit blocks: Q8_0 via gguf's quantizer, Q8_K
written here), Q/K/V are rounded to f16 for attention.
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType

from ..model.architectures import get_architecture
from ..model.gguf_file import GGUFFile, dequantize_tensor
from .transformer import rope_inv_freq


Q8_0_INPUT = {GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
              GGMLQuantizationType.Q8_0}
Q8_K_INPUT = {GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K}


def q8_k_round(x: np.ndarray) -> np.ndarray:
    """Q8_K round trip of rows x [T, K] (blocks of 256): q = min(127, rint(-127/m * x)), m the
    value of largest magnitude in the block; returns q * (m / -127)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    idx = np.abs(b).argmax(-1)[..., None]
    m = np.take_along_axis(b, idx, -1)  # [T, nb, 1]
    safe = np.where(m == 0, np.float32(1), m)
    iscale = np.float32(-127.0) / safe
    q = np.minimum(np.float32(127), np.rint(iscale * b))
    out = q * (np.float32(1) / iscale)
    return np.where(m == 0, np.float32(0), out).reshape(x.shape)


def round_input(x: np.ndarray, qtype) -> np.ndarray:
    """The matmul input llama.cpp builds for a weight of ``qtype``."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if qtype in Q8_0_INPUT:
        return gguf_quants.dequantize(gguf_quants.quantize(x32, GGMLQuantizationType.Q8_0),
                                      GGMLQuantizationType.Q8_0).reshape(x.shape)
    if qtype in Q8_K_INPUT:
        return q8_k_round(x32)
    if qtype == GGMLQuantizationType.F16:
        return x32.astype(np.float16).astype(np.float32)
    if qtype == GGMLQuantizationType.BF16:
        bits = x32.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return x32


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float16).astype(np.float64)


class ReferenceModel:
    def __init__(self, gguf: GGUFFile, llama_rounding: bool = True):
        arch = get_architecture(gguf.require("general.architecture"))
        self.config = cfg = arch.read_config(gguf)
        self.rope_neox = arch.ROPE_NEOX
        self.llama_rounding = llama_rounding
        self.qtypes = {name: info.qtype for name, info in gguf.tensors.items()}
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
            layer["types"] = {n: self.qtypes[p + n + ".weight"] for n in names}
            for b in ("attn_q", "attn_k", "attn_v"):
                layer[b + ".bias"] = opt(p + b + ".bias")
            self.layers.append(layer)
        self.output_type = self.qtypes.get("output.weight", self.qtypes["token_embd.weight"])
        freqs = opt("rope_freqs.weight")
        self.inv_freq = rope_inv_freq(cfg, freqs)

    def _mm(self, x, w, qtype):
        """x @ w.T with x rounded as llama.cpp would for a weight of ``qtype``."""
        if self.llama_rounding:
            x = round_input(x, qtype).astype(np.float64)
        return x @ w.T

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
            ty = L["types"]
            q = self._mm(h, L["attn_q"], ty["attn_q"])
            k = self._mm(h, L["attn_k"], ty["attn_k"])
            v = self._mm(h, L["attn_v"], ty["attn_v"])
            if L["attn_q.bias"] is not None:
                q, k, v = q + L["attn_q.bias"], k + L["attn_k.bias"], v + L["attn_v.bias"]
            q = self._rope(q.reshape(T, c.n_head, c.head_dim), pos)
            k = self._rope(k.reshape(T, c.n_kv_head, c.head_dim), pos)
            v = v.reshape(T, c.n_kv_head, c.head_dim)
            if self.llama_rounding:  # f16 KV cache, Q rounded to f16 for the K product
                q, k, v = _f16(q), _f16(k), _f16(v)
            k = np.repeat(k, group, axis=1)  # [T, H, D]
            v = np.repeat(v, group, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(c.head_dim) + mask  # [H, T, T]
            s = np.exp(s - s.max(-1, keepdims=True))
            p = s / s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", p, v).reshape(T, -1)
            x = x + self._mm(o, L["attn_output"], ty["attn_output"])
            h = self._rms(x, L["ffn_norm"])
            g, u = self._mm(h, L["ffn_gate"], ty["ffn_gate"]), self._mm(h, L["ffn_up"], ty["ffn_up"])
            x = x + self._mm(g / (1.0 + np.exp(-g)) * u, L["ffn_down"], ty["ffn_down"])
        return self._mm(self._rms(x, self.output_norm), self.output, self.output_type).astype(np.float32)
