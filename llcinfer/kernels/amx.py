"""AMX int8 tiles: whether they may be used, and the tile operations for numba kernels.

Usable only when all of these hold (``amx_status()`` says which one failed, in one line):
  - ``LLCINFER_AMX`` is not ``0`` (``1`` asks for AMX and warns when it falls back; unset
    means use it when usable);
  - Linux on x86-64, and the CPU flags ``amx_tile`` and ``amx_int8`` (isa.cpu_has_amx);
  - the kernel grants this process the tile data state: ``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)`` returns 0 and ``ARCH_GET_XCOMP_PERM`` then shows bit 18.  Linux
    before 5.16 answers EINVAL, a kernel or CPU without the feature EOPNOTSUPP.  Without
    the grant, the first tile instruction raises SIGILL.
The request is made once per process (under a lock, result cached): the grant covers
every thread of the process.  ``syscall`` is a module-level function so that tests can
replace it and simulate each kernel answer.

Every thread must also load a tile configuration (LDTILECFG) before its first tile
instruction.  The kernels do that at the start of each unit of work they run on a thread
(one weight group, amx_matmul.py) and TILERELEASE at its end, instead of tracking which
threads are configured: numba's pool and the executor's pinned threads are not ours to
hook, and LDTILECFG costs far less than one group's work (16 columns x M rows x K).

Tile operations are numba intrinsics taking a *mode*: an empty array whose dtype picks the
implementation at compile time (``make_mode``).  ``HW`` emits the instructions through
inline assembly, as ``.byte`` sequences (their encodings below, from GNU as, so LLVM's
assembler needs no AMX target feature) with every address pinned to the register the
encoding names; ``EMU`` is a software twin computing the same int32 tile in plain code, so
the kernels' control flow is tested on CPUs without AMX.  Tile shapes (``TILE_CFG``):

    tmm0  C  16 rows x 64 bytes   int32 [16 activation rows, 16 weight rows]
    tmm1  A  16 rows x 32 bytes   int8  activations: 16 rows, one 32-value block
    tmm2  B   8 rows x 64 bytes   uint8 weights, VNNI order: row j, bytes 4n..4n+3 =
                                  weight row n, values 4j..4j+3 (repack.py's vectors)

A tile product covers one 32-value block, not the 64 a tile row could hold, because
every block has its own scales, applied to the block's int32 sums.  The product is
TDPBSUD (signed A x unsigned B): the weights are the unsigned, biased bytes of the
AVX-512 layout (Q8_0 stores q + 128), whose bias the activation block sums remove exactly
as in vnni_matmul.py; AMX then needs no second copy of the weights.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import threading
import warnings

import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .. import settings
from ..errors import UsageError
from . import isa as _isa

SYS_arch_prctl = 158  # x86-64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

# Encodings of the exact operand forms used (GNU as 2.40, checked by objdump in the tests).
ENCODINGS = {
    "ldtilecfg (%rax)": bytes.fromhex("c4e2784900"),
    "tileloadd (%rax,%rcx,1), %tmm1": bytes.fromhex("c4e27b4b0c08"),
    "tileloadd (%rdx,%rsi,1), %tmm2": bytes.fromhex("c4e27b4b1432"),
    "tilezero %tmm0": bytes.fromhex("c4e27b49c0"),
    "tdpbsud %tmm2, %tmm1, %tmm0": bytes.fromhex("c4e26a5ec1"),
    "tilestored %tmm0, (%rdi,%rsi,1)": bytes.fromhex("c4e27a4b0437"),
    "tilerelease": bytes.fromhex("c4e27849c0"),
}

# LLVM aborts the process on inline assembly unless its assembly parser is initialised
# (numba initialises only the printer).
_llvm.initialize_native_asmparser()

TILE_M, TILE_N, TILE_K = 16, 16, 32  # rows of A and C, columns of C, bytes of A per row


def _tile_cfg() -> np.ndarray:
    """The 64-byte LDTILECFG operand: palette 1, colsb (u16) at 16 + 2i, rows at 48 + i."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for t, (rows, colsb) in enumerate([(TILE_M, 4 * TILE_N), (TILE_M, TILE_K), (TILE_K // 4, 4 * TILE_N)]):
        cfg[16 + 2 * t:18 + 2 * t] = np.array([colsb], "<u2").view(np.uint8)
        cfg[48 + t] = rows
    cfg.setflags(write=False)
    return cfg


TILE_CFG = _tile_cfg()


# ------------------------------------------------------------------ may we use AMX?
_libc = None


def syscall(nr: int, a: int, b: int) -> tuple[int, int]:
    """The raw system call ``nr(a, b)`` -> (return value, errno).  Tests replace it."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(a), ctypes.c_ulong(b))
    return int(rc), ctypes.get_errno()


def _errname(err: int) -> str:
    return errno.errorcode.get(err, str(err))


def _request() -> tuple[bool, str]:
    rc, err = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    if rc != 0:
        if err == errno.EINVAL:
            return False, "kernel without AMX support (ARCH_REQ_XCOMP_PERM: EINVAL; Linux < 5.16?)"
        if err == errno.EOPNOTSUPP:
            return False, "kernel does not offer the tile state (ARCH_REQ_XCOMP_PERM: EOPNOTSUPP)"
        return False, f"tile permission refused (ARCH_REQ_XCOMP_PERM: {_errname(err)})"
    mask = ctypes.c_ulong(0)
    rc, err = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, ctypes.addressof(mask))
    if rc != 0:
        return False, f"tile permission unconfirmed (ARCH_GET_XCOMP_PERM: {_errname(err)})"
    if not (mask.value >> XFEATURE_XTILEDATA) & 1:
        return False, f"tile permission not granted (ARCH_GET_XCOMP_PERM mask {mask.value:#x} lacks bit 18)"
    return True, "AMX usable (amx_tile, amx_int8, tile state granted)"


_LOCK = threading.RLock()
_PERM: tuple[bool, str] | None = None  # the once-per-process answer of the kernel
_STATUS: tuple[bool, str] | None = None  # the decision (environment, CPU, permission)


def request_permission() -> tuple[bool, str]:
    """Ask the kernel for the tile state, once per process; later calls return the answer."""
    global _PERM
    with _LOCK:
        if _PERM is None:
            _PERM = _request()
        return _PERM


def _decide() -> tuple[bool, str]:
    env = settings.amx()
    if env == "0":
        return False, "disabled by LLCINFER_AMX=0"
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        status = (False, "not Linux on x86-64")
    elif not _isa.cpu_has_amx():
        status = (False, "CPU has no AMX (no amx_tile and amx_int8 flags)")
    else:
        status = request_permission()
    if env == "1" and not status[0]:
        warnings.warn(f"LLCINFER_AMX=1: {status[1]}; using the VNNI kernels", RuntimeWarning, stacklevel=3)
    return status


def amx_status() -> tuple[bool, str]:
    """(usable, reason): may the AMX kernels run in this process?  Decided once (logged at
    debug level)."""
    global _STATUS
    st = _STATUS
    if st is None:
        with _LOCK:
            if _STATUS is None:
                _STATUS = _decide()
                logging.getLogger(__name__).debug("AMX: %s", _STATUS[1])
            st = _STATUS
    return st


def amx_usable() -> bool:
    return amx_status()[0]


def reset_amx(forget_permission: bool = False) -> None:
    """Decide again (re-read LLCINFER_AMX and the CPU flags); ``forget_permission`` (tests
    only) also forgets the kernel's answer, so the next decision asks it again."""
    global _STATUS, _PERM
    with _LOCK:
        _STATUS = None
        if forget_permission:
            _PERM = None


# ------------------------------------------------------------------- tile operations
HW = np.empty(0, np.uint8)  # real AMX instructions
EMU = np.empty(0, np.int8)  # the software twin


def make_mode(emulate: bool) -> np.ndarray:
    return EMU if emulate else HW


def _emulated(mode) -> bool:
    if not (isinstance(mode, types.Array) and str(mode.dtype) in ("int8", "uint8")):
        raise TypeError("amx: the mode must be amx.HW or amx.EMU")
    return str(mode.dtype) == "int8"


def _asm(builder, lines, regs, args):
    """Inline assembly of ``lines`` (names of ENCODINGS) with ``args`` pinned to ``regs``."""
    text = "\n\t".join(".byte " + ",".join(f"0x{c:02x}" for c in ENCODINGS[ln]) + "  # " + ln for ln in lines)
    cons = ",".join([f"{{{r}}}" for r in regs] + ["~{memory}"])
    fty = ir.FunctionType(ir.VoidType(), [a.type for a in args])
    builder.asm(fty, text, cons, list(args), True)


def _load8(sign: bool):
    def impl(typingctx, a, off):
        def codegen(context, builder, sig, args):
            v = builder.load(builder.gep(builder.inttoptr(args[0], ir.IntType(8).as_pointer()), [args[1]]))
            return builder.sext(v, ir.IntType(32)) if sign else builder.zext(v, ir.IntType(32))

        return types.int32(a, off), codegen

    impl.__name__ = "_lds8" if sign else "_ldu8"
    return intrinsic(impl)


_lds8 = _load8(True)  # the byte at address a + off as int8, widened to int32
_ldu8 = _load8(False)  # ... as uint8


@intrinsic
def _st32(typingctx, a, off, v):
    """Store the int32 v at address a + off (bytes)."""

    def codegen(context, builder, sig, args):
        p = builder.gep(builder.inttoptr(args[0], ir.IntType(8).as_pointer()), [args[1]])
        builder.store(context.cast(builder, args[2], sig.args[2], types.int32),
                      builder.bitcast(p, ir.IntType(32).as_pointer()))
        return context.get_dummy_value()

    return types.none(a, off, v), codegen


@intrinsic
def vstore_at(typingctx, a, off, vec):
    """Store the vector ``vec`` (simd.Vec) at address a + off (bytes, unaligned)."""

    def codegen(context, builder, sig, args):
        p = builder.gep(builder.inttoptr(args[0], ir.IntType(8).as_pointer()), [args[1]])
        builder.store(args[2], builder.bitcast(p, args[2].type.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(a, off, vec), codegen


def _emu_dot(c, a, lda, b):
    """C = A x B as TDPBSUD on the tiles of TILE_CFG (C row stride 64 bytes, B's 64)."""
    for r in range(16):
        for n in range(16):
            s = np.int32(0)
            for k in range(32):
                s += _lds8(a, r * lda + k) * _ldu8(b, (k >> 2) * 64 + 4 * n + (k & 3))
            _st32(c, 64 * r + 4 * n, s)


@intrinsic
def tile_config(typingctx, mode, cfg):
    """LDTILECFG from the address cfg (TILE_CFG); nothing in emulation."""
    emu = _emulated(mode)

    def codegen(context, builder, sig, args):
        if not emu:
            _asm(builder, ["ldtilecfg (%rax)"], ["rax"], [args[1]])
        return context.get_dummy_value()

    return types.none(mode, cfg), codegen


@intrinsic
def tile_release(typingctx, mode):
    """TILERELEASE (the thread's tile state back to its initial, empty state)."""
    emu = _emulated(mode)

    def codegen(context, builder, sig, args):
        if not emu:
            _asm(builder, ["tilerelease"], [], [])
        return context.get_dummy_value()

    return types.none(mode), codegen


@intrinsic
def tile_dot(typingctx, mode, c, a, lda, b):
    """The int32 tile at address c (16 x 16, rows of 64 bytes) = A x B, A: 16 rows of 32
    int8 at address a, row stride lda; B: 8 rows of 64 uint8 at address b (VNNI order).
    tileloadd A, tileloadd B, tilezero C, tdpbsud, tilestored C: one asm block, so no tile
    register lives across LLVM's code."""
    emu = _emulated(mode)

    def codegen(context, builder, sig, args):
        if emu:
            return context.compile_internal(builder, _emu_dot, types.none(*sig.args[1:]), args[1:])
        i64 = ir.IntType(64)
        vals = [context.cast(builder, v, t, types.int64) for v, t in zip(args[1:], sig.args[1:])]
        c_, a_, lda_, b_ = vals
        _asm(builder, ["tileloadd (%rax,%rcx,1), %tmm1", "tileloadd (%rdx,%rsi,1), %tmm2", "tilezero %tmm0",
                       "tdpbsud %tmm2, %tmm1, %tmm0", "tilestored %tmm0, (%rdi,%rsi,1)"],
             ["rax", "rcx", "rdx", "rsi", "rdi"], [a_, lda_, b_, ir.Constant(i64, 64), c_])
        return context.get_dummy_value()

    return types.none(mode, c, a, lda, b), codegen


def find_instructions(code: bytes) -> dict[str, int]:
    """How often each encoding of ENCODINGS occurs in machine code ``code``."""
    return {name: code.count(enc) for name, enc in ENCODINGS.items()}
