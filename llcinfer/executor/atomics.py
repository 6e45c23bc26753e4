"""Atomic counters for numba code, emitted as LLVM atomics through llvmlite.

The executor's tasks synchronise on int64 counters: a producer adds 1 when a tile is
written (release), a consumer spins until the counter reaches its target (acquire).
Counters sit one per 64-byte line (``COUNTER_STRIDE`` int64s apart) so that two hot
counters never share a cache line.

    atomic_add(c, i, v)   old = c[i]; c[i] += v          (seq_cst read-modify-write)
    atomic_load(c, i)     c[i]                            (acquire)
    atomic_store(c, i, v) c[i] = v                        (release)
    cpu_relax()           x86 PAUSE (spin-loop hint), nothing elsewhere
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

COUNTER_STRIDE = 8  # int64 slots per counter: one cache line each

_I64 = ir.IntType(64)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _element_ptr(context, builder, arr_ty, arr, idx):
    data = context.make_array(arr_ty)(context, builder, arr).data
    return builder.gep(data, [idx])


def _check(arr):
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1):
        raise TypeError("atomic counters must be a 1-D int64 array")


@intrinsic
def atomic_add(typingctx, arr, i, v):
    """Atomically c[i] += v; returns the old value."""
    _check(arr)

    def codegen(context, builder, sig, args):
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        val = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", p, val, "seq_cst")

    return types.int64(arr, i, v), codegen


@intrinsic
def atomic_load(typingctx, arr, i):
    """c[i] read with acquire ordering."""
    _check(arr)

    def codegen(context, builder, sig, args):
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(p, "acquire", 8)

    return types.int64(arr, i), codegen


@intrinsic
def atomic_store(typingctx, arr, i, v):
    """c[i] = v with release ordering."""
    _check(arr)

    def codegen(context, builder, sig, args):
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        val = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(val, p, "release", 8)
        return context.get_dummy_value()

    return types.void(arr, i, v), codegen


@intrinsic
def cpu_relax(typingctx):
    """The spin-wait hint (PAUSE on x86): lets the sibling hyper-thread run, saves power."""

    def codegen(context, builder, sig, args):
        if _X86:
            fn = _declare(builder, "llvm.x86.sse2.pause", ir.FunctionType(ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


def _declare(builder, name, fnty):
    g = builder.module.globals.get(name)
    return g if g is not None else ir.Function(builder.module, fnty, name)


@intrinsic
def sched_yield(typingctx):
    """libc sched_yield(): a waiter that has spun long gives its core away (the producer
    may be preempted on a busy host).  Declared as an external symbol, resolved from the
    process at link time, so kernels that use it stay cacheable on disk."""

    def codegen(context, builder, sig, args):
        fn = _declare(builder, "sched_yield", ir.FunctionType(ir.IntType(32), []))
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def cycle_counter(typingctx):
    """The CPU's cycle counter (RDTSC on x86, llvm.readcyclecounter): cheap timestamps for
    profiling a step's operators (perf/step_profile.py)."""

    def codegen(context, builder, sig, args):
        fn = _declare(builder, "llvm.readcyclecounter", ir.FunctionType(ir.IntType(64), []))
        return builder.call(fn, [])

    return types.int64(), codegen
