"""Kernel interface used by the forward pass.

The model code only sees ``Linear`` (a weight matrix bound to the kernel for its tensor
type) and the functions re-exported here.  Swapping in faster kernels (the SIMD issue)
means changing what ``Linear`` dispatches to, not the model code.
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType as QT

from ..errors import ModelFileError
from ..model.gguf_file import dequantize_tensor
from . import amx_matmul
from ..dtypes import ACT_F32, ACT_KIND
from .act_quant import quantize_activations, quantize_activations_int
from .activation import swiglu
from .float_matmul import f32_matmul, half_get_rows, half_matmul
from .isa import current_isa
from ..jit import default_threads, set_threads
from .norm import rms_norm
from .quant_matmul import QUANT_BLOCK, quant_matmul, quant_matmul3
from ..weights.repack import SUPPORTED as _REPACK_TYPES
from ..weights.repack_cache import packed as _packed_weights
from .dequant import quant_get_rows
from .fused import rope_append_rows, rope_table
from .simd import lanes, make_tag
from .tables import BF16_TO_F32, F16_TO_F32
from .vnni_matmul import vnni_matmul, vnni_matmul3


__all__ = [
    "Linear", "linear_many", "rms_norm", "rope_append_rows", "rope_table", "swiglu", "set_threads", "default_threads",
]


class Linear:
    """A weight matrix W [rows=N, cols=K] from a GGUF tensor; ``lin(x)`` is x @ W.T.

    The raw bytes stay in the memory map; shapes were validated by GGUFFile, and are checked
    again here against what the caller expects before a kernel sees them.

    With ``llama_rounding`` a quantized matrix runs on the integer dot-product kernels
    (vnni_matmul.py) of the ISA path chosen at construction (isa.py, ``LLCINFER_ISA``): its
    weights are repacked into a row-interleaved copy on first use (``prepare()``).  Without
    it, or on the 'generic' path, the float kernels read the memory map directly.
    """

    def __init__(self, info, expect_shape: tuple[int, int] | None = None, isa: str | None = None):
        if len(info.shape) != 2:
            raise ModelFileError(f"tensor {info.name}: expected a matrix, got shape {info.shape}")
        self.name = info.name
        self.qtype = info.qtype
        self.rows, self.cols = (int(s) for s in info.shape)
        if expect_shape is not None and (self.rows, self.cols) != tuple(expect_shape):
            raise ModelFileError(
                f"tensor {info.name}: shape {(self.rows, self.cols)} does not match the model's {tuple(expect_shape)}"
            )
        self.info = info
        self.act_kind = ACT_KIND[self.qtype] if self.qtype in ACT_KIND else ACT_F32
        code = int(self.qtype)
        if code in QUANT_BLOCK:
            block, type_size = QUANT_BLOCK[code]
            self._w = info.data  # [N, row_bytes] uint8 view into the map
            if self._w.shape != (self.rows, self.cols // block * type_size) or not self._w.flags.c_contiguous:
                raise ModelFileError(f"tensor {info.name}: unexpected data layout {self._w.shape}")
            self._kind = "quant"
            self.isa = current_isa() if isa is None else isa
            self._simd = self.isa != "generic" and code in _REPACK_TYPES
            self._packed = None  # [groups, bytes] repacked weights, made by prepare()
        elif self.qtype == QT.F32:
            self._w = np.asarray(info.data, dtype=np.float32).reshape(self.rows, self.cols)
            self._kind = "f32"
        elif self.qtype in (QT.F16, QT.BF16):
            self._w = np.ascontiguousarray(info.data).view(np.uint16).reshape(self.rows, self.cols)
            self._lut = F16_TO_F32 if self.qtype == QT.F16 else BF16_TO_F32
            self._kind = "half"
        else:  # GGUFFile.tensor() refuses these first; kept as a guard
            raise ModelFileError(f"tensor {info.name}: no kernel for {self.qtype.name}")

    @property
    def nbytes(self) -> int:
        return int(self.info.n_bytes)

    @property
    def simd(self) -> bool:
        """True when llama_rounding products run on the integer SIMD kernels."""
        return self._kind == "quant" and self._simd

    def prepare(self) -> np.ndarray | None:
        """Repack the weights for the SIMD path (once); returns the packed array (read-only)
        or None.  Weights of a GGUF file come from the on-disk cache of repack_cache.py,
        readable at once (a background thread moves them onto 2 MiB pages in place)."""
        if not self.simd:
            return None
        if self._packed is None:
            self._packed = _packed_weights(self._w, self.name, int(self.qtype), self.cols, lanes(self.isa))
        return self._packed

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None, llama_rounding: bool = False) -> np.ndarray:
        """x  # [M, K] f32 contiguous  ->  out  # [M, N] f32

        ``llama_rounding``: first round x as llama.cpp does for this weight type.
        """
        if x.ndim != 2 or x.shape[1] != self.cols or x.dtype != np.float32:
            raise ValueError(f"{self.name}: activation shape {x.shape} {x.dtype}, expected [M, {self.cols}] float32")
        x = np.ascontiguousarray(x)
        if out is None:
            out = np.empty((x.shape[0], self.rows), np.float32)
        elif out.shape != (x.shape[0], self.rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"{self.name}: output buffer {out.shape} {out.dtype}, expected [{x.shape[0]}, {self.rows}] float32")
        if llama_rounding and self.simd:
            q, d, s = quantize_activations_int(x, self.act_kind)
            if amx_matmul.use_amx(x.shape[0], int(self.qtype), self.isa):  # 16+ rows on AMX tiles
                return amx_matmul.matmul(q, d, s, self.prepare(), int(self.qtype), out)
            vnni_matmul(q, d, s, self.prepare(), int(self.qtype), out, make_tag(self.isa))
            return out
        if llama_rounding:
            x = quantize_activations(x, self.act_kind)
        if self._kind == "quant":
            quant_matmul(x, self._w, int(self.qtype), F16_TO_F32, out)
        elif self._kind == "f32":
            f32_matmul(x, self._w, out)
        else:
            half_matmul(x, self._w, self._lut, out)
        return out

    def get_rows(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ids of W as float32 [T, K] (embedding lookup) into ``out`` (None: a new
        array); ids checked against N, ``out`` against [T, K] float32 C-contiguous."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.rows):
            raise ValueError(f"{self.name}: token id out of range [0, {self.rows})")
        if out is None:
            out = np.empty((ids.size, self.cols), np.float32)
        elif out.shape != (ids.size, self.cols) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"{self.name}: rows buffer {out.shape} {out.dtype}, expected [{ids.size}, {self.cols}] float32")
        if ids.size == 0:
            return out
        if self._kind == "half":
            half_get_rows(self._w, ids, self._lut, out)
        elif self._kind == "f32":
            np.take(self._w, ids, axis=0, out=out)
        else:
            quant_get_rows(self._w, ids, int(self.qtype), F16_TO_F32, out)
        return out

    def quant_rows_source(self):
        """(w  # [N, row bytes] uint8, a plain ndarray, GGML type) of a block-quantized
        matrix, for kernels that gather rows themselves; None for float matrices."""
        if self._kind != "quant":
            return None
        return np.asarray(self._w), int(self.qtype)

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32 [N, K] via gguf's reference dequantizers (oracle)."""
        return dequantize_tensor(self.info)


_NO_ROWS = np.zeros((0, 1), np.uint8)  # [0, 1] stand-in for an absent third weight
_NO_ROWS.setflags(write=False)


def linear_many(x: np.ndarray, linears: list[Linear], llama_rounding: bool = False) -> list[np.ndarray]:
    """[x @ W.T for W in linears] with one pool launch when all are quantized (2 or 3).

    ``llama_rounding`` as in ``Linear.__call__`` (rounded once per activation kind).
    """
    if (llama_rounding and 2 <= len(linears) <= 3 and all(lin.simd for lin in linears)
            and len({lin.isa for lin in linears}) == 1):
        return _linear_many_simd(x, linears)
    if 2 <= len(linears) <= 3 and all(lin._kind == "quant" for lin in linears):
        x = np.ascontiguousarray(x)
        M = x.shape[0]
        for lin in linears:
            if x.ndim != 2 or x.shape[1] != lin.cols or x.dtype != np.float32:
                raise ValueError(f"{lin.name}: activation shape {x.shape}, expected [M, {lin.cols}] float32")
        rounded: dict[int, np.ndarray] = {}
        xs = []
        for lin in linears:
            if llama_rounding and lin.act_kind not in rounded:
                rounded[lin.act_kind] = quantize_activations(x, lin.act_kind)
            xs.append(rounded[lin.act_kind] if llama_rounding else x)
        outs = [np.empty((M, lin.rows), np.float32) for lin in linears]
        ws = [lin._w for lin in linears]
        qs = [int(lin.qtype) for lin in linears]
        if len(linears) == 2:
            xs.append(xs[0])
            ws.append(_NO_ROWS)
            qs.append(0)
            y2 = np.empty((M, 0), np.float32)
        else:
            y2 = outs[2]
        quant_matmul3(xs[0], ws[0], qs[0], outs[0], xs[1], ws[1], qs[1], outs[1],
                      xs[2], ws[2], qs[2], y2, F16_TO_F32)
        return outs
    return [lin(x, llama_rounding=llama_rounding) for lin in linears]


def _linear_many_simd(x: np.ndarray, linears: list[Linear]) -> list[np.ndarray]:
    """linear_many on the integer SIMD kernels: x quantized once per activation kind."""
    x = np.ascontiguousarray(x)
    M = x.shape[0]
    for lin in linears:
        if x.ndim != 2 or x.shape[1] != lin.cols or x.dtype != np.float32:
            raise ValueError(f"{lin.name}: activation shape {x.shape}, expected [M, {lin.cols}] float32")
    acts: dict[int, tuple] = {}
    args = []
    outs = []
    for lin in linears:
        if lin.act_kind not in acts:
            acts[lin.act_kind] = quantize_activations_int(x, lin.act_kind)
        y = np.empty((M, lin.rows), np.float32)
        outs.append(y)
        args += [*acts[lin.act_kind], lin.prepare(), int(lin.qtype), y]
    if len(linears) == 2:
        args += [*args[0:3], _NO_GROUPS, 0, np.empty((M, 0), np.float32)]
    vnni_matmul3(*args, make_tag(linears[0].isa))
    return outs


_NO_GROUPS = np.zeros((0, 1), np.uint8)  # [0 groups, 1] stand-in for an absent third weight
