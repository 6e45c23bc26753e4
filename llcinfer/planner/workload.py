"""What one decode step reads and computes: bytes per operator per layer as stored in the
GGUF, KV bytes per token, activations and multiply-accumulates, for a context length and a
number of concurrent sequences.

``workload_from_gguf`` reads the header only (no kernels, no repacking: ``llcinfer plan`` stays
fast); ``workload_from_model`` takes a loaded ``llcinfer.model.Transformer``.  Both give the
same ``Workload`` for the same file.

Operators of one layer (the executor's units of work, in order)::

    attn_norm  qkv  rope_kv_append  attention  wo  ffn_norm  gate_up_swiglu  down

plus ``embed`` (one embedding row per token) before the first layer and ``lm_head`` (final
norm and output projection) after the last.  Units: bytes, MACs (multiply-accumulates) and
flops per decode step of ``concurrency`` sequences unless a name says per token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from ..model.architectures.base import ModelConfig

LAYER_OPS = ("attn_norm", "qkv", "rope_kv_append", "attention", "wo", "ffn_norm", "gate_up_swiglu", "down")
GLOBAL_OPS = ("embed", "lm_head")
# matmul operators -> the weight tensors they read
MATMUL_TENSORS = {"qkv": ("wq", "wk", "wv"), "wo": ("wo",), "gate_up_swiglu": ("w_gate", "w_up"),
                  "down": ("w_down",)}
# the two resident groups of a layer (the planner's unit of placement) -> tensors
GROUP_TENSORS = {"attn": ("attn_norm", "wq", "wk", "wv", "wo", "bias"),
                 "ffn": ("ffn_norm", "w_gate", "w_up", "w_down")}


@dataclass
class LayerBytes:
    """Bytes of one layer's tensors as stored (quantized blocks included)."""

    wq: int
    wk: int
    wv: int
    wo: int
    w_gate: int
    w_up: int
    w_down: int
    attn_norm: int = 0
    ffn_norm: int = 0
    bias: int = 0  # q/k/v biases (qwen2)

    def group(self, name: str) -> int:
        return sum(getattr(self, t) for t in GROUP_TENSORS[name])

    @property
    def total(self) -> int:
        return self.group("attn") + self.group("ffn")


@dataclass
class Workload:
    """One decode step of ``concurrency`` sequences at context ``ctx`` of one model."""

    name: str
    config: ModelConfig  # hyper-parameters (architectures/base.py)
    layers: list[LayerBytes]
    lm_head_bytes: int  # output projection (the embedding matrix when tied)
    embedding_bytes: int  # the whole token embedding matrix
    tied_embeddings: bool
    ctx: int = 4096
    concurrency: int = 1
    kv_itemsize: int = 2  # bytes per K/V element: f16 (default), 1 for int8, 4 for f32
    qtypes: dict[str, str] = field(default_factory=dict)  # tensor -> storage type (layer 0)

    # -- sizes -----------------------------------------------------------------------------

    @property
    def embedding_row_bytes(self) -> int:
        return self.embedding_bytes // self.config.vocab_size

    @property
    def layer_weight_bytes(self) -> int:
        return sum(lb.total for lb in self.layers)

    @property
    def weight_bytes_per_token(self) -> int:
        """Weights one step reads: every layer, the LM head, one embedding row per sequence."""
        return self.layer_weight_bytes + self.lm_head_bytes + self.embedding_row_bytes * self.concurrency

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer: 2 * n_kv_head * head_dim * kv_itemsize."""
        return 2 * self.config.n_kv_head * self.config.head_dim * self.kv_itemsize

    @property
    def kv_bytes_per_step_layer(self) -> int:
        """KV one layer's attention reads per step: ctx tokens of every sequence."""
        return self.ctx * self.kv_bytes_per_token_layer * self.concurrency

    @property
    def kv_bytes_per_step(self) -> int:
        return self.kv_bytes_per_step_layer * self.config.n_layer

    @property
    def activation_bytes(self) -> int:
        """f32 activations live during one layer of one step: residual, normed input, q/k/v,
        attention output, gate and up (the working set next to the weights)."""
        q = self.config.n_head * self.config.head_dim
        kv = self.config.n_kv_head * self.config.head_dim
        return 4 * self.concurrency * (2 * self.config.d_model + q + 2 * kv + q + 2 * self.config.d_ff)

    # -- operators ---------------------------------------------------------------------------

    def op_rows(self, op: str) -> int:
        """Output rows of a matmul operator (the dimension tiles split)."""
        return {"qkv": (self.config.n_head + 2 * self.config.n_kv_head) * self.config.head_dim, "wo": self.config.d_model,
                "gate_up_swiglu": 2 * self.config.d_ff, "down": self.config.d_model, "lm_head": self.config.vocab_size}[op]

    def op_weight_bytes(self, layer: int, op: str) -> int:
        if op == "lm_head":
            return self.lm_head_bytes
        lb = self.layers[layer]
        return sum(getattr(lb, t) for t in MATMUL_TENSORS[op])

    def op_macs(self, op: str) -> int:
        """Multiply-accumulates of a matmul operator for the whole step."""
        cols = {"qkv": self.config.d_model, "wo": self.config.n_head * self.config.head_dim, "gate_up_swiglu": self.config.d_model,
                "down": self.config.d_ff, "lm_head": self.config.d_model}[op]
        return self.op_rows(op) * cols * self.concurrency

    @property
    def attention_flops_layer(self) -> int:
        """q.k and p.v over ctx positions for every head and sequence (2 flops per MAC)."""
        return 4 * self.config.n_head * self.config.head_dim * self.ctx * self.concurrency

    def operators(self) -> list[str]:
        """Every operator of one step by name: 'embed', 'blk.<i>.<op>', 'lm_head'."""
        return ["embed"] + [f"blk.{i}.{op}" for i in range(self.config.n_layer) for op in LAYER_OPS] + ["lm_head"]

    def with_(self, **kw) -> "Workload":
        """A copy with some fields changed (ctx, concurrency, kv_itemsize)."""
        return replace(self, **kw)

    def summary(self) -> str:
        mib = 1 << 20
        return (f"{self.name} ({self.config.arch}, {self.config.n_layer} layers, d_model {self.config.d_model}, "
                f"{self.config.n_head}/{self.config.n_kv_head} heads x {self.config.head_dim}), ctx {self.ctx} x "
                f"{self.concurrency} sequence{'s' if self.concurrency > 1 else ''}, KV {self.kv_itemsize * 8}-bit\n"
                f"  per step: weights {self.weight_bytes_per_token / mib:.1f} MiB (layers "
                f"{self.layer_weight_bytes / mib:.1f}, lm_head {self.lm_head_bytes / mib:.1f}), "
                f"KV {self.kv_bytes_per_step / mib:.1f} MiB")


KV_ITEMSIZE = {"f16": 2, "int8": 1, "f32": 4}


def workload_key(w: Workload, threads: int) -> str:
    """How observations name a workload: model, context, sequences, KV bits, threads."""
    return f"{w.name}|ctx{w.ctx}|x{w.concurrency}|kv{8 * w.kv_itemsize}|t{threads}"


def workload_from_gguf(path: str | os.PathLike, ctx: int = 4096, concurrency: int = 1,
                       kv_itemsize: int = 2, name: str | None = None) -> Workload:
    """The workload of a GGUF file from its header (tensor sizes and metadata only)."""
    from ..model.architectures import get_architecture
    from ..model.gguf_file import GGUFFile

    f = GGUFFile(path)
    cfg = get_architecture(f.require("general.architecture")).read_config(f)
    names = {"wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
             "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight", "w_down": "ffn_down.weight",
             "attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight"}

    def nbytes(i: int, t: str) -> int:
        if t == "bias":
            return sum(f.tensors[k].n_bytes for k in (f"blk.{i}.attn_{x}.bias" for x in "qkv") if k in f.tensors)
        return f.tensor(f"blk.{i}.{names[t]}").n_bytes

    emb = f.tensor("token_embd.weight")
    out = f.tensor("output.weight", required=False)
    qtypes = {t: f.tensor(f"blk.0.{names[t]}").qtype.name for t in MATMUL_TENSORS["qkv"] + ("wo", "w_gate", "w_up", "w_down")}
    qtypes["lm_head"] = (out or emb).qtype.name
    return _make(cfg, name or os.path.basename(os.fspath(path)).removesuffix(".gguf"), nbytes,
                 (out or emb).n_bytes, emb.n_bytes, out is None, ctx, concurrency, kv_itemsize, qtypes)


def workload_from_model(model, ctx: int = 4096, concurrency: int = 1, kv_itemsize: int = 2,
                        name: str | None = None) -> Workload:
    """The workload of a loaded ``llcinfer.model.Transformer`` (its config and Linear sizes)."""
    cfg, w = model.config, model.weights

    def nbytes(i: int, t: str) -> int:
        lw = w.layers[i]
        if t == "bias":
            return sum(b.nbytes for b in (lw.bq, lw.bk, lw.bv) if b is not None)
        if t in ("attn_norm", "ffn_norm"):
            return int(getattr(lw, t).nbytes)
        return getattr(lw, t).nbytes

    l0 = w.layers[0]
    qtypes = {t: getattr(l0, t).qtype.name for t in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
    qtypes["lm_head"] = w.output.qtype.name
    default = os.path.basename(getattr(getattr(model, "gguf", None), "path", "model")).removesuffix(".gguf")
    return _make(cfg, name or default, nbytes, w.output.nbytes, w.token_embd.nbytes,
                 w.output is w.token_embd, ctx, concurrency, kv_itemsize, qtypes)


def _make(cfg, name, nbytes, lm_head, embedding, tied, ctx, concurrency, kv_itemsize, qtypes) -> Workload:
    layers = [LayerBytes(**{t: int(nbytes(i, t)) for t in LayerBytes.__dataclass_fields__})
              for i in range(cfg.n_layer)]
    return Workload(name=name, config=cfg, layers=layers, lm_head_bytes=int(lm_head), embedding_bytes=int(embedding),
                    tied_embeddings=bool(tied), ctx=int(ctx), concurrency=int(concurrency),
                    kv_itemsize=int(kv_itemsize), qtypes=qtypes)
