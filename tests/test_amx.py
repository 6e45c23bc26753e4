"""The AMX path (amx.py, amx_matmul.py), testable without AMX hardware.

- Detection and permission with a simulated kernel (amx.syscall replaced) and simulated
  CPU flags: every refusal falls back to the VNNI kernels with the same output; the
  permission is asked once per process, whatever the threads.
- The kernel's control flow (blocks, row tiles, scales, M and N edges) on the software
  tile twin, against a NumPy oracle of the same math and against the VNNI kernel.
- The real-tile build is only compiled (in a subprocess, perf/amx_asm.py) and its machine
  code checked.  Real tiles run only where amx_status() says usable (not on AMD here).
"""

import ctypes
import errno
import json
import os
import platform
import subprocess
import sys
import threading
import time
import zlib

import naive
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from llcinfer.errors import UsageError
from llcinfer.kernels import Linear, amx
from llcinfer.kernels import amx_matmul as am
from llcinfer.kernels import isa as isa_mod
from llcinfer.kernels.act_quant import ACT_Q8_0, quantize_activations, quantize_activations_int
from llcinfer.jit import kernel
from llcinfer.weights.repack import Q4_1, Q8_0, repack, unpack
from llcinfer.kernels.simd import addr, make_tag
from llcinfer.kernels.vnni_matmul import vnni_matmul

from tiny_models import LEGACY_QUANTS, fake_tensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMX_FLAGS = isa_mod.cpu_flags() | {"amx_tile", "amx_int8"}
NO_AMX_FLAGS = isa_mod.cpu_flags() - {"amx_tile", "amx_int8"}
BIAS = {"Q8_0": -128, "Q4_0": -8, "Q5_0": -16, "Q4_1": 0}

pytestmark = [
    pytest.mark.skipif("avx512vnni" not in isa_mod.supported_isas(), reason="the AMX path reads the AVX-512 layout"),
    pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64", reason="x86-64 Linux"),
]


class FakeKernel:
    """arch_prctl as a simulated Linux answers it: ``req`` and ``get`` are (rc, errno);
    a successful GET writes ``mask``.  Records every call."""

    def __init__(self, req=(0, 0), get=(0, 0), mask=0xE7 | 1 << 18, delay=0.0):
        self.req, self.get, self.mask, self.delay = req, get, mask, delay
        self.calls: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, nr, a, b):
        assert nr == amx.SYS_arch_prctl
        with self._lock:
            self.calls.append(a)
        time.sleep(self.delay)
        if a == amx.ARCH_REQ_XCOMP_PERM:
            assert b == amx.XFEATURE_XTILEDATA
            return self.req
        assert a == amx.ARCH_GET_XCOMP_PERM
        if self.get[0] == 0:
            ctypes.c_ulong.from_address(b).value = self.mask
        return self.get

    def count(self, code):
        return self.calls.count(code)


@pytest.fixture
def simulate(monkeypatch):
    """simulate(kernel, flags): this process as if on a CPU with ``flags`` under ``kernel``."""
    monkeypatch.delenv("LLCINFER_AMX", raising=False)

    def install(kern, flags=AMX_FLAGS):
        monkeypatch.setattr(isa_mod, "cpu_flags", lambda: set(flags))
        monkeypatch.setattr(amx, "syscall", kern)
        amx.reset_amx(forget_permission=True)
        return kern

    yield install
    amx.reset_amx(forget_permission=True)  # the next decision sees the real machine again


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls Linear makes to the AMX kernel."""
    calls = []
    real = am.matmul

    def wrapped(*a):
        calls.append(a[0].shape[0])
        return real(*a)

    monkeypatch.setattr(am, "matmul", wrapped)
    return calls


def _lin(rng, qtype, N, K):
    t = fake_tensor(rng, qtype, N, K)
    return t, Linear(t, (N, K), isa="avx512vnni")


def _vnni(lin, x):
    q, d, s = quantize_activations_int(x, ACT_Q8_0)
    y = np.empty((x.shape[0], lin.rows), np.float32)
    vnni_matmul(q, d, s, lin.prepare(), int(lin.qtype), y, make_tag("avx512vnni"))
    return y


# ------------------------------------------------------------------ detection and fallback
def test_this_machine_without_amx_asks_nothing_and_runs_vnni(monkeypatch, spy):
    if isa_mod.cpu_has_amx():
        pytest.skip("this CPU has AMX")
    kern = FakeKernel()
    monkeypatch.setattr(amx, "syscall", kern)
    monkeypatch.delenv("LLCINFER_AMX", raising=False)
    amx.reset_amx(forget_permission=True)
    try:
        usable, reason = amx.amx_status()
        assert not usable and reason.startswith("CPU has no AMX")
        assert kern.calls == []  # no permission asked on a CPU without AMX
        rng = np.random.default_rng(1)
        _, lin = _lin(rng, "Q8_0", 33, 128)
        x = rng.standard_normal((32, 128)).astype(np.float32)
        assert np.array_equal(lin(x, llama_rounding=True), _vnni(lin, x)) and spy == []
        with pytest.raises(RuntimeError, match="unusable"):  # the kernel refuses: never SIGILL
            am.matmul(*quantize_activations_int(x, ACT_Q8_0), lin.prepare(), Q8_0, np.empty((32, 33), np.float32))
    finally:
        amx.reset_amx(forget_permission=True)


REFUSALS = {
    "refused EPERM": (FakeKernel(req=(-1, errno.EPERM)), "refused (ARCH_REQ_XCOMP_PERM: EPERM)"),
    "linux < 5.16": (FakeKernel(req=(-1, errno.EINVAL)), "kernel without AMX support"),
    "no tile state": (FakeKernel(req=(-1, errno.EOPNOTSUPP)), "EOPNOTSUPP"),
    "get without bit 18": (FakeKernel(mask=0xE7), "lacks bit 18"),
    "get fails": (FakeKernel(get=(-1, errno.EINVAL)), "unconfirmed"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_fall_back_to_vnni(simulate, spy, case):
    proto, why = REFUSALS[case]
    kern = simulate(FakeKernel(proto.req, proto.get, proto.mask))
    usable, reason = amx.amx_status()
    assert not usable and why in reason
    assert kern.count(amx.ARCH_REQ_XCOMP_PERM) == 1
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    for qtype in LEGACY_QUANTS:
        _, lin = _lin(rng, qtype, 17, 96)
        x = rng.standard_normal((33, 96)).astype(np.float32)
        assert np.array_equal(lin(x, llama_rounding=True), _vnni(lin, x))
    assert spy == []
    assert kern.count(amx.ARCH_REQ_XCOMP_PERM) == 1  # asked once, not per call


def test_granted_dispatches_16_rows_to_amx(simulate, spy, monkeypatch):
    kern = simulate(FakeKernel())
    assert amx.amx_status() == (True, "AMX usable (amx_tile, amx_int8, tile state granted)")
    assert kern.calls == [amx.ARCH_REQ_XCOMP_PERM, amx.ARCH_GET_XCOMP_PERM]
    monkeypatch.setattr(am, "EMULATE", True)  # never real tiles on this machine
    rng = np.random.default_rng(7)
    for qtype in LEGACY_QUANTS:
        _, lin = _lin(rng, qtype, 33, 256)
        for M in (15, 16, 40):
            x = rng.standard_normal((M, 256)).astype(np.float32)
            n = len(spy)
            assert np.array_equal(lin(x, llama_rounding=True), _vnni(lin, x))
            assert len(spy) == n + (M >= 16)
    _, lin = _lin(rng, "Q4_K", 17, 256)  # K-quants stay on VNNI
    lin(rng.standard_normal((32, 256)).astype(np.float32), llama_rounding=True)
    t = fake_tensor(rng, "Q8_0", 17, 64)  # 8-lane layout: not AMX's
    Linear(t, (17, 64), isa="avxvnni")(rng.standard_normal((32, 64)).astype(np.float32), llama_rounding=True)
    assert len(spy) == 8


def test_environment(simulate, monkeypatch):
    kern = simulate(FakeKernel())
    monkeypatch.setenv("LLCINFER_AMX", "0")
    amx.reset_amx()
    assert amx.amx_status() == (False, "disabled by LLCINFER_AMX=0") and kern.calls == []
    assert not am.use_amx(64, Q8_0, "avx512vnni")
    monkeypatch.setenv("LLCINFER_AMX", "1")
    simulate(kern, NO_AMX_FLAGS)
    with pytest.warns(RuntimeWarning, match="LLCINFER_AMX=1: CPU has no AMX"):
        assert amx.amx_status()[0] is False
    assert kern.calls == []
    monkeypatch.setenv("LLCINFER_AMX", "yes")
    amx.reset_amx()
    with pytest.raises(UsageError, match="LLCINFER_AMX"):
        amx.amx_status()
    monkeypatch.setenv("LLCINFER_AMX", "1")
    simulate(kern)
    assert amx.amx_status()[0] and kern.count(amx.ARCH_REQ_XCOMP_PERM) == 1


def test_permission_requested_once_across_threads(simulate):
    kern = simulate(FakeKernel(delay=0.02))
    n = 16
    barrier = threading.Barrier(n)
    seen = []

    def worker():
        barrier.wait()
        seen.append(amx.amx_status())

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == n and all(s[0] for s in seen)
    assert kern.count(amx.ARCH_REQ_XCOMP_PERM) == 1 and kern.count(amx.ARCH_GET_XCOMP_PERM) == 1
    amx.reset_amx()  # a new decision (environment, flags) keeps the kernel's answer
    assert amx.amx_status()[0] and amx.request_permission()[0]
    assert len(kern.calls) == 2


def test_real_syscall_wrapper_is_harmless():
    mask = ctypes.c_ulong(0)
    rc, err = amx.syscall(amx.SYS_arch_prctl, amx.ARCH_GET_XCOMP_PERM, ctypes.addressof(mask))
    assert rc == 0 or err == errno.EINVAL  # EINVAL: Linux < 5.16
    if rc == 0 and not isa_mod.cpu_has_amx():
        assert not (mask.value >> 18) & 1
        rc, err = amx.syscall(amx.SYS_arch_prctl, amx.ARCH_REQ_XCOMP_PERM, amx.XFEATURE_XTILEDATA)
        assert rc == -1 and err in (errno.EINVAL, errno.EOPNOTSUPP)


# ------------------------------------------------------------------------ tiles and kernel
def test_tile_config_bytes():
    c = amx.TILE_CFG
    assert c.shape == (64,) and c[0] == 1 and not c[1:16].any()
    colsb = c[16:48].view("<u2")
    assert list(colsb[:3]) == [64, 32, 64] and not colsb[3:].any()
    assert list(c[48:51]) == [16, 16, 8] and not c[51:].any()


@kernel
def _one_tile(c, a, lda, b, mode):
    amx.tile_dot(mode, addr(c), addr(a), lda, addr(b))


def test_emulated_tile_is_tdpbsud():
    rng = np.random.default_rng(3)
    lda = 40  # a row stride other than the tile's 32 bytes
    a = rng.integers(-128, 128, (16, lda), dtype=np.int8)
    b = rng.integers(0, 256, 512, dtype=np.uint8)
    c = np.full((16, 16), 7, np.int32)
    _one_tile(c, a, lda, b, amx.EMU)
    bk = b.reshape(8, 16, 4).transpose(0, 2, 1).reshape(32, 16)  # [k, n]: row k//4, bytes 4n + k%4
    assert np.array_equal(c, a[:, :32].astype(np.int32) @ bk.astype(np.int32))


def _tile_operands(packed, qt, K):
    """What the kernel reads, in NumPy: unsigned tile bytes [Np, K] (= value - bias), the
    per-block f16 scales dw and Q4_1 mins mw [Np, nb] (unpack() with d := 1, m := 0)."""
    G, nb = packed.shape[0], K // 32
    b = packed.reshape(G, nb, -1).copy()

    def halves(o):
        return b[..., o:o + 32].copy().view(np.float16).astype(np.float32).transpose(0, 2, 1).reshape(16 * G, nb)

    dw, mw = halves(0), (halves(32) if qt == Q4_1 else None)
    b[..., 0:32] = np.ones((G, nb, 16), np.float16).view(np.uint8)
    if qt == Q4_1:
        b[..., 32:64] = 0
    return unpack(b.reshape(G, -1), qt, 16 * G, K, 16).astype(np.int32), dw, mw


def _oracle(q, d, s, u, bias, dw, mw):
    """The kernel's math in NumPy: per block, int32 tile products (A s8 x B u8), the bias
    times the block sums, then the scales in float32."""
    M, K = q.shape
    acc = np.zeros((M, u.shape[0]), np.float32)
    for b in range(K // 32):
        k = slice(32 * b, 32 * b + 32)
        c = q[:, k].astype(np.int32) @ u[:, k].T + bias * s[:, b:b + 1]
        acc = acc + c.astype(np.float32) * (dw[None, :, b] * d[:, b:b + 1])
        if mw is not None:
            acc = acc + mw[None, :, b] * (d[:, b] * s[:, b].astype(np.float32))[:, None]
    return acc


@pytest.mark.parametrize("qtype", LEGACY_QUANTS)
@pytest.mark.parametrize("N", (1, 3, 17, 33))
def test_emulated_kernel_matches_oracle(qtype, N):
    rng = np.random.default_rng(zlib.crc32(f"amx-{qtype}-{N}".encode()))
    qt = int(QT[qtype])
    for K in (32, 96, 4096):
        t = fake_tensor(rng, qtype, N, K)
        packed = repack(t.data, qt, K, 16)
        w64 = naive.weight(t)
        u, dw, mw = _tile_operands(packed, qt, K)
        u = u - BIAS[qtype]
        assert u.min() >= 0 and u.max() <= 255
        for M in (16, 17, 33, 129):
            x = (rng.standard_normal((M, K)) * rng.uniform(0.1, 3.0, (M, 1))).astype(np.float32)
            q, d, s = quantize_activations_int(x, ACT_Q8_0)
            xr = quantize_activations(x, ACT_Q8_0).astype(np.float64)
            ref, terms = xr @ w64.T, np.abs(xr) @ np.abs(w64).T
            want = _oracle(q, d, s, u, BIAS[qtype], dw, mw)[:, :N]
            assert np.all(np.abs(want - ref) <= 4e-6 * terms + 1e-30), "oracle vs float reference"
            y = np.full((M, N), np.nan, np.float32)
            am.amx_matmul(am._padded(q), d, s, packed, qt, y, make_tag("avx512vnni"), amx.EMU, amx.TILE_CFG)
            assert np.all(np.abs(y - want) <= 4e-6 * terms + 1e-30), f"kernel vs oracle M={M} K={K}"
            y2 = np.empty_like(y)
            vnni_matmul(q, d, s, packed, qt, y2, make_tag("avx512vnni"))
            assert np.array_equal(y, y2), "same float steps as the VNNI kernel: same bits"


def test_compiled_kernel_has_the_tile_instructions():
    """perf/amx_asm.py compiles (never runs) the real-tile kernel in a fresh process."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "perf", "amx_asm.py")], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert all(n >= 1 for n in s["encodings_in_kernel"].values()), s["encodings_in_kernel"]
    assert not any(s["encodings_in_emulated_kernel"].values())
    if isinstance(s["objdump_tile_lines"], list):
        text = "\n".join(s["objdump_tile_lines"])
        for ins in ("ldtilecfg (%rax)", "tileloadd (%rax,%rcx,1),%tmm1", "tileloadd (%rdx,%rsi,1),%tmm2",
                    "tilezero %tmm0", "tdpbsud %tmm2,%tmm1,%tmm0", "tilestored %tmm0,(%rdi,%rsi,1)", "tilerelease"):
            assert ins in text
    if not isa_mod.cpu_has_amx():
        assert s["detection"]["amx_usable"] is False and s["detection"]["reason"].startswith("CPU has no AMX")


@pytest.mark.skipif(not amx.amx_usable(), reason="AMX not usable here: " + amx.amx_status()[1])
def test_real_tiles_match_emulation():
    rng = np.random.default_rng(11)
    for qtype in LEGACY_QUANTS:
        qt = int(QT[qtype])
        t = fake_tensor(rng, qtype, 33, 512)
        packed = repack(t.data, qt, 512, 16)
        q, d, s = quantize_activations_int(rng.standard_normal((37, 512)).astype(np.float32), ACT_Q8_0)
        ys = [np.empty((37, 33), np.float32) for _ in range(2)]
        for y, mode in zip(ys, (amx.HW, amx.EMU)):
            am.amx_matmul(am._padded(q), d, s, packed, qt, y, make_tag("avx512vnni"), mode, amx.TILE_CFG)
        assert np.array_equal(ys[0], ys[1])
