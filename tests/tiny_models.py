"""Tiny synthetic GGUF models and random GGML weight blocks for the tests.

Not a test module: ``test_kernels``, ``test_forward_tiny`` and ``test_gguf_errors`` import it.

* :func:`random_weight` -- random bytes in the GGML block layout of a tensor type, with the
  f16 scale fields overwritten by small finite values so the dequantized weights have a
  chosen magnitude (``amp``), plus float weights for F32 / F16 / BF16.
* :func:`write_tiny_model` -- a complete llama / qwen2 GGUF file (weights, hyper-parameters,
  a tiny byte-level BPE vocabulary, a ChatML template) written with ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

# Every tensor type llcinfer runs (llcinfer.gguf_file.SUPPORTED_TYPES).
FLOAT_TYPES = ("F32", "F16", "BF16")
LEGACY_QUANTS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")  # blocks of 32
K_QUANTS = ("Q4_K", "Q6_K")  # blocks of 256
QUANT_TYPES = LEGACY_QUANTS + K_QUANTS
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES

# ---------------------------------------------------------------------------- weights
# Rough std of the dequantized value per unit of the block scale d, used to pick d so the
# weights come out with std ~ amp:  Q4_0 (nibble-8), Q4_1 nibble (+m), Q5_0 (q5-16),
# Q8_0 int8, Q4_K 6-bit scale * nibble, Q6_K int8 scale * (q6-32).
_UNIT_STD = {"Q4_0": 4.6, "Q4_1": 4.6, "Q5_0": 9.2, "Q8_0": 74.0, "Q4_K": 280.0, "Q6_K": 1369.0}


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """float values -> [..., 2] uint8 (little-endian f16)."""
    return np.ascontiguousarray(values.astype("<f2")).view(np.uint8).reshape(*values.shape, 2)


def random_quant_bytes(rng: np.random.Generator, qtype: str, rows: int, cols: int, amp: float = 1.0) -> np.ndarray:
    """[rows, cols / block * type_size] uint8: random GGML blocks of ``qtype``.

    The quantized fields are uniformly random; the f16 scales are set to finite values
    (d uniform in [0.5, 1.5] x amp / unit std) so dequantized weights have std ~ ``amp``.
    """
    q = QT[qtype]
    block, type_size = GGML_QUANT_SIZES[q]
    if cols % block:
        raise ValueError(f"{qtype}: cols {cols} is not a multiple of the block size {block}")
    nb = cols // block
    raw = rng.integers(0, 256, size=(rows, nb, type_size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, size=(rows, nb)) * amp / _UNIT_STD[qtype]
    if qtype in ("Q4_0", "Q5_0", "Q8_0"):  # [d][...]
        raw[..., 0:2] = _f16_bytes(d)
    elif qtype == "Q4_1":  # [d][m][qs]: x = nibble * d + m, centred: m ~ -7.5 d
        raw[..., 0:2] = _f16_bytes(d)
        raw[..., 2:4] = _f16_bytes(-7.5 * d * rng.uniform(0.8, 1.2, size=d.shape))
    elif qtype == "Q4_K":  # [d][dmin][scales:12][qs:128]: x = d*sc*q - dmin*mn, centred: dmin ~ 7.5 d
        raw[..., 0:2] = _f16_bytes(d)
        raw[..., 2:4] = _f16_bytes(7.5 * d * rng.uniform(0.8, 1.2, size=d.shape))
    elif qtype == "Q6_K":  # [ql:128][qh:64][scales:16][d]
        raw[..., 208:210] = _f16_bytes(d)
    else:  # pragma: no cover
        raise ValueError(qtype)
    out = raw.reshape(rows, nb * type_size)
    return out


def random_weight(rng: np.random.Generator, qtype: str, rows: int, cols: int, amp: float = 1.0) -> np.ndarray:
    """A [rows, cols] weight in the storage form GGUFWriter.add_tensor takes for ``qtype``:

    F32 -> float32 [rows, cols]; F16 -> float16 [rows, cols]; BF16 -> uint8 [rows, 2 cols]
    (little-endian bf16); quantized -> uint8 [rows, row_bytes] (see random_quant_bytes;
    zero blocks for types llcinfer does not support, e.g. Q5_1 or Q2_K).
    Pass ``raw_dtype=QT[qtype]`` for BF16 and the quantized types.
    """
    if qtype in QUANT_TYPES:
        return random_quant_bytes(rng, qtype, rows, cols, amp)
    if qtype not in ALL_TYPES and qtype in QT.__members__:  # a type llcinfer refuses: zero blocks
        block, type_size = GGML_QUANT_SIZES[QT[qtype]]
        return np.zeros((rows, cols // block * type_size), np.uint8)
    w = rng.standard_normal((rows, cols)) * amp
    if qtype == "F32":
        return w.astype(np.float32)
    if qtype == "F16":
        return w.astype(np.float16)
    if qtype == "BF16":
        bits = (w.astype(np.float32).view(np.uint32) + 0x8000) >> 16  # round to nearest
        return np.ascontiguousarray(bits.astype("<u2")).view(np.uint8).reshape(rows, 2 * cols)
    raise ValueError(f"no generator for tensor type {qtype}")


@dataclass(frozen=True)
class FakeTensor:
    """Stand-in for ``llcinfer.gguf_file.TensorInfo`` (what ``Linear`` reads)."""

    name: str
    qtype: QT
    shape: tuple
    data: np.ndarray

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


def fake_tensor(rng: np.random.Generator, qtype: str, rows: int, cols: int, amp: float = 1.0,
                name: str | None = None) -> FakeTensor:
    """A random weight laid out as GGUFFile presents it: read-only, uint8 [rows, row_bytes]
    for quantized types and BF16, float32 / float16 [rows, cols] for F32 / F16."""
    w = np.ascontiguousarray(random_weight(rng, qtype, rows, cols, amp))
    w.setflags(write=False)  # the memory map is read-only: same numba signature as real files
    return FakeTensor(name or f"w_{qtype}_{rows}x{cols}", QT[qtype], (rows, cols), w)


@contextlib.contextmanager
def isolated_runtime(home):
    """Point LLCINFER_HOME at ``home`` (GGUFFile caches parsed headers there: throw-away test
    files must not pile up in the user's cache) and restore numba's thread count afterwards
    (``LLM(threads=1)`` changes it for the whole process)."""
    import numba

    threads = numba.get_num_threads()
    old = os.environ.get("LLCINFER_HOME")
    os.environ["LLCINFER_HOME"] = os.fspath(home)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LLCINFER_HOME", None)
        else:
            os.environ["LLCINFER_HOME"] = old
        numba.set_num_threads(threads)


# ---------------------------------------------------------------------------- tokenizer
def byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character standing for each byte 0..255."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return chars


CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ in", "Ġ a", "o r", "e r", "Ġ s", "Ġ h", "l l", "Ġh e", "l o"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges): 3 control tokens, the 256 byte tokens, 13 merged tokens."""
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = CONTROL_TOKENS + byte_chars() + merged
    types = [3] * len(CONTROL_TOKENS) + [1] * (256 + len(merged))
    return tokens, types, list(MERGES)


VOCAB_SIZE = len(tiny_vocab()[0])  # 272
EOS_ID = CONTROL_TOKENS.index("<|im_end|>")
BOS_ID = CONTROL_TOKENS.index("<|endoftext|>")

# ---------------------------------------------------------------------------- model file
_VT = GGUFValueType


def _infer_vtype(value):
    if isinstance(value, bool):
        return _VT.BOOL
    if isinstance(value, (int, np.integer)):
        return _VT.UINT32 if value >= 0 else _VT.INT32
    if isinstance(value, (float, np.floating)):
        return _VT.FLOAT32
    if isinstance(value, str):
        return _VT.STRING
    if isinstance(value, (list, tuple)):
        return _VT.ARRAY
    raise TypeError(f"cannot store metadata value {value!r}")


def write_tiny_model(path, arch: str = "llama", qtype: str = "Q8_0", n_layer: int = 2, d_model: int | None = None,
                     n_head: int = 4, n_kv_head: int = 2, d_ff: int | None = None, vocab: int | None = None,
                     seed: int = 0, tied: bool = True, extra_metadata: dict | None = None,
                     skip_tensors=(), tensor_type_override: dict | None = None, rope_freqs: bool = False,
                     n_ctx: int = 256, embd_qtype: str | None = None, extra_tensors: dict | None = None):
    """Write a tiny random ``arch`` model whose matrices are all of tensor type ``qtype``.

    d_model / d_ff default to 256 / 512 for K-quants (block 256) and 64 / 96 otherwise;
    head_dim = d_model / n_head.  ``vocab`` defaults to the tiny vocabulary's size (272);
    a different value gives an embedding that does not match the vocabulary (refused by read_config).
    ``tensor_type_override`` maps tensor names to types; ``skip_tensors`` leaves names out;
    ``extra_metadata`` adds or replaces keys (value None deletes the key); ``extra_tensors``
    maps names to (array, raw_dtype or None).  ``rope_freqs`` adds a llama3-style
    rope_freqs.weight [head_dim/2].  Returns ``path``.
    """
    kq = any(GGML_QUANT_SIZES[QT[t]][0] > 32
             for t in (qtype, embd_qtype or qtype, *(tensor_type_override or {}).values()))
    d_model = d_model or (256 if kq else 64)
    d_ff = d_ff or (512 if kq else 96)
    head_dim = d_model // n_head
    tokens, types, merges = tiny_vocab()
    n_vocab = vocab or len(tokens)
    rng = np.random.default_rng(seed)
    override = dict(tensor_type_override or {})
    skip = set(skip_tensors)
    amp = 1.5 / np.sqrt(d_model)  # weights ~ amp: activations O(1), logits std ~ 1.5 per unit rms

    meta = {
        f"{arch}.block_count": (n_layer, _VT.UINT32),
        f"{arch}.context_length": (n_ctx, _VT.UINT32),
        f"{arch}.embedding_length": (d_model, _VT.UINT32),
        f"{arch}.feed_forward_length": (d_ff, _VT.UINT32),
        f"{arch}.attention.head_count": (n_head, _VT.UINT32),
        f"{arch}.attention.head_count_kv": (n_kv_head, _VT.UINT32),
        f"{arch}.rope.freq_base": (10000.0, _VT.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-6, _VT.FLOAT32),
        f"{arch}.rope.dimension_count": (head_dim, _VT.UINT32),
        "general.name": ("tiny-" + arch + "-" + qtype, _VT.STRING),
        "tokenizer.ggml.model": ("gpt2", _VT.STRING),
        "tokenizer.ggml.pre": ("qwen2" if arch == "qwen2" else "smollm", _VT.STRING),
        "tokenizer.ggml.tokens": (tokens, _VT.ARRAY),
        "tokenizer.ggml.token_type": (types, _VT.ARRAY),
        "tokenizer.ggml.merges": (merges, _VT.ARRAY),
        "tokenizer.ggml.bos_token_id": (BOS_ID, _VT.UINT32),
        "tokenizer.ggml.eos_token_id": (EOS_ID, _VT.UINT32),
        "tokenizer.ggml.add_bos_token": (False, _VT.BOOL),
        "tokenizer.chat_template": (CHATML_TEMPLATE, _VT.STRING),
    }
    arch_name = arch
    for key, value in (extra_metadata or {}).items():
        if key == "general.architecture":
            arch_name = value
        elif value is None:
            meta.pop(key, None)
        else:
            meta[key] = (value, _infer_vtype(value))

    w = GGUFWriter(os.fspath(path), arch_name)
    for key, (value, vtype) in meta.items():
        w.add_key_value(key, value, vtype)

    def add(name, rows, cols, default_type, scale=amp):
        if name in skip:
            return
        t = override.get(name, default_type)
        arr = random_weight(rng, t, rows, cols, scale)
        w.add_tensor(name, arr, raw_dtype=None if t in ("F32", "F16") else QT[t])

    def add_vector(name, values):
        if name in skip:
            return
        t = override.get(name, "F32")
        if t not in ("F32", "F16"):
            raise ValueError(f"{name}: 1-D tensors are written as F32 or F16, not {t}")
        w.add_tensor(name, np.asarray(values, np.float16 if t == "F16" else np.float32))

    dq, dkv = n_head * head_dim, n_kv_head * head_dim
    add("token_embd.weight", n_vocab, d_model, embd_qtype or qtype, scale=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        add_vector(p + "attn_norm.weight", rng.uniform(0.8, 1.2, d_model))
        add(p + "attn_q.weight", dq, d_model, qtype)
        add(p + "attn_k.weight", dkv, d_model, qtype)
        add(p + "attn_v.weight", dkv, d_model, qtype)
        if arch == "qwen2":
            add_vector(p + "attn_q.bias", rng.normal(0, 0.3, dq))
            add_vector(p + "attn_k.bias", rng.normal(0, 0.3, dkv))
            add_vector(p + "attn_v.bias", rng.normal(0, 0.3, dkv))
        add(p + "attn_output.weight", d_model, dq, qtype)
        add_vector(p + "ffn_norm.weight", rng.uniform(0.8, 1.2, d_model))
        add(p + "ffn_gate.weight", d_ff, d_model, qtype)
        add(p + "ffn_up.weight", d_ff, d_model, qtype)
        add(p + "ffn_down.weight", d_model, d_ff, qtype, scale=1.5 / np.sqrt(d_ff))
    add_vector("output_norm.weight", rng.uniform(0.8, 1.2, d_model))
    if not tied:
        add("output.weight", n_vocab, d_model, qtype)
    if rope_freqs:  # llama3 long-context factors: 1 for high frequencies, up to 8 for low ones
        add_vector("rope_freqs.weight", np.geomspace(1.0, 8.0, head_dim // 2))
    for name, (arr, raw) in (extra_tensors or {}).items():
        w.add_tensor(name, arr, raw_dtype=raw)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
