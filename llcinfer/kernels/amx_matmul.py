"""Matmul of 16+ activation rows on AMX int8 tiles (amx.py), on the AVX-512 packed weights.

    y[m, n] = sum_blocks  dw[n, b] * dx[m, b] * (C_b[m, n] + bias * sx[m, b])   (+ Q4_1 mins)

where C_b = the int32 tile product of activation block b (int8, act_quant.py) and weight
block b as repack.py's unsigned bytes (W = 16: its 8 vectors of 64 bytes are a B tile as
they stand), and ``bias`` undoes the weights' offset as in vnni_matmul.py (Q8_0 -128,
Q4_0 -8, Q5_0 -16, Q4_1 0).  The float steps are those of vnni_matmul.py, in the same
order, so both paths give the same bits.

Types on AMX: Q8_0 (B tiles loaded straight from the packed weights), Q4_0, Q4_1, Q5_0
(each block decoded once to 512 bytes by vnni_blocks.dec32, then used by every row tile).
Q4_K and Q6_K stay on the VNNI kernels: their 16/32-value sub-block scales would need a
tile product per sub-block plus integer rescaling.

Loops: a thread takes one weight group (16 columns) at a time: LDTILECFG, then for each
block, for each 16-row tile of x: one tile product, its 16 x 16 int32 scaled into the
group's float accumulators [rows, 16]; TILERELEASE; results written out.  x is padded with
zero rows to a multiple of 16 (a tile loads 16 rows); N needs nothing (repack pads groups
with zero rows); K is a multiple of 32.

``EMULATE`` (tests) runs the same kernel on amx.py's software tiles.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .amx import TILE_CFG, amx_status, make_mode, tile_config, tile_dot, tile_release, vstore_at
from ..jit import kernel, parallel_kernel
from ..weights.repack import Q4_0, Q4_1, Q5_0, Q8_0
from .simd import addr, ldf, ldi, lanes, make_tag, vload, vload_f16, vloadf, vsplat, vstoref, vtag
from .simd_math import vadd, vcvt, vfma, vmul
from .vnni_blocks import block_bytes, dec32
from .vnni_matmul import _put

AMX_TYPES = (Q8_0, Q4_0, Q4_1, Q5_0)
MIN_ROWS = 16
EMULATE = False  # tests only: software tiles instead of AMX instructions


@kernel
def _bias(qt):
    if qt == Q8_0:
        return -128
    if qt == Q4_0:
        return -8
    if qt == Q5_0:
        return -16
    return 0


@kernel
def _group(qt, wp, g, xq, xd, xs, y, tag_array, mode, cfg):
    """y[:, 16g : 16g + 16] from the weight group wp; xq has whole 16-row tiles."""
    tag = vtag(tag_array)
    W = 16
    M = y.shape[0]
    Mp, K = xq.shape
    nb = K // 32
    bs = block_bytes(qt) * W
    bias = _bias(qt)
    n0 = g * W
    nv = min(W, y.shape[1] - n0)
    acc = np.zeros((Mp, W), np.float32)
    cbuf = np.empty(256, np.int32)  # the C tile
    bbuf = np.empty(512, np.uint8)  # a decoded B tile
    wa, xa, xda, xsa, ca = addr(wp), addr(xq), addr(xd), addr(xs), addr(cbuf)
    tile_config(mode, addr(cfg))
    for b in range(nb):
        o = b * bs
        if qt == Q8_0:
            bp = wa + o + 2 * W
        else:
            qs = dec32(qt, wa, o, tag)
            bp = addr(bbuf)
            for j in range(8):
                vstore_at(bp, 64 * j, qs[j])
        dw = vload_f16(wa, o, tag)
        for t in range(Mp // 16):
            tile_dot(mode, ca, xa + 16 * t * K + 32 * b, K, bp)
            for r in range(min(16, M - 16 * t)):
                m = 16 * t + r
                i = m * nb + b
                sx = ldi(xsa, i)
                dx = ldf(xda, i)
                ci = vadd(vload(ca, 64 * r, tag), vsplat(bias * sx, tag))
                a = vfma(vcvt(ci), vmul(dw, vsplat(dx, tag)), vloadf(acc, m * W, tag))
                if qt == Q4_1:
                    a = vfma(vload_f16(wa, o + 2 * W, tag), vsplat(dx * np.float32(sx), tag), a)
                vstoref(acc, m * W, a)
    tile_release(mode)
    ya, ny = addr(y), y.shape[1]
    for m in range(M):
        _put(ya, ny, m, n0, nv, vloadf(acc, m * W, tag), tag)


@parallel_kernel
def amx_matmul(xq, xd, xs, w, qt, y, tag, mode, cfg):
    """y  # [M, N] f32 = x @ W.T on tiles

    xq  # [ceil(M/16)*16, K] int8 (rows past M zero), xd  # [M, K/32] f32, xs  # [M, K/32] int32
    w   # [ceil(N/16), bytes] uint8, repack.py with W = 16;  mode: amx.HW or amx.EMU
    """
    for g in prange(w.shape[0]):
        _group(qt, w[g], g, xq, xd, xs, y, tag, mode, cfg)


def use_amx(rows: int, qtype: int, isa: str) -> bool:
    """Should Linear send this product to matmul()?  16+ rows, a type of AMX_TYPES, weights
    packed for 16 lanes (isa avx512vnni), and AMX usable in this process (amx.py)."""
    return rows >= MIN_ROWS and qtype in AMX_TYPES and isa != "generic" and lanes(isa) == 16 and amx_status()[0]


def _padded(q: np.ndarray) -> np.ndarray:
    M = q.shape[0]
    if M % 16 == 0:
        return q
    out = np.zeros((-(-M // 16) * 16, q.shape[1]), np.int8)
    out[:M] = q
    return out


def matmul(q: np.ndarray, d: np.ndarray, s: np.ndarray, packed: np.ndarray, qtype: int, out: np.ndarray) -> np.ndarray:
    """out = x @ W.T from quantize_activations_int's (q, d, s) and the 16-lane packed weights.
    Refuses (never SIGILL) to run the AMX instructions unless amx_status() says usable."""
    if not EMULATE:
        ok, why = amx_status()
        if not ok:
            raise RuntimeError(f"AMX kernel called while AMX is unusable: {why}")
    amx_matmul(_padded(q), d, s, packed, qtype, out, make_tag("avx512vnni"), make_mode(EMULATE), TILE_CFG)
    return out


def object_code(emulate: bool = False, qtype: int = Q8_0) -> bytes:
    """Compile, never run, amx_matmul (real tile instructions, or the twin) and return its
    machine code (ELF object).  Needs a fresh compile (LLCINFER_NUMBA_CACHE=0): a kernel
    loaded from numba's disk cache cannot be inspected."""
    import numba

    K, N, M = 64, 16, 16
    args = (np.zeros((M, K), np.int8), np.zeros((M, K // 32), np.float32), np.zeros((M, K // 32), np.int32),
            np.zeros((1, K // 32 * 34 * 16), np.uint8), qtype, np.zeros((M, N), np.float32),
            make_tag("avx512vnni"), make_mode(emulate), TILE_CFG)
    sig = tuple(numba.typeof(a) for a in args)
    amx_matmul.compile(sig)
    lib = amx_matmul.overloads[sig].library
    if getattr(lib, "_disable_inspection", False):
        raise RuntimeError("amx_matmul came from numba's disk cache: run with LLCINFER_NUMBA_CACHE=0")
    return lib._codegen._tm.emit_object(lib._final_module)


__all__ = ["AMX_TYPES", "MIN_ROWS", "amx_matmul", "matmul", "use_amx", "object_code"]
