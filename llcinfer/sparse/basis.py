"""Index-key bases: per layer and KV head, the top-r principal directions of the model's
post-RoPE keys (Loki's low-rank keys), calibrated once per model and cached on disk.

    C[l, h] = mean_t k[t, h] k[t, h]^T      (uncentred: q . k keeps the mean direction)
    basis[l, h] = the r eigenvectors of C[l, h] of largest eigenvalue, as rows
    index key  = basis[l, h] @ k;   index query of head q_h = basis[l, kvh(q_h)] @ q_h

Keys seen at positions 0 .. n of the calibration text are re-rotated to positions drawn
uniformly over the context (``rotate_to``): a RoPE pair of low frequency barely turns in a
few thousand tokens, so a basis fitted at the text's own positions would miss the
directions its keys take at depth.

The file lives beside the repacked weights, named by the GGUF's identity and the rank:

    $LLCINFER_HOME/repack/<gguf stem>-<sha256(realpath, size, mtime_ns)[:16]>-keys-r<r>-v<V>.npz
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

import numpy as np

from .. import paths

BASIS_VERSION = 1


def fit_basis(keys: list[np.ndarray], rank: int) -> np.ndarray:
    """keys: per layer # [n, KVH, D] f32 -> basis  # [L, KVH, rank, D] f32 (orthonormal rows)."""
    L = len(keys)
    _, KVH, D = keys[0].shape
    if not 1 <= rank <= D:
        raise ValueError(f"rank must be in 1 .. {D} (got {rank})")
    out = np.empty((L, KVH, rank, D), np.float32)  # [layer, kv_head, rank, D]
    for li, k in enumerate(keys):
        k64 = k.astype(np.float64)
        for h in range(KVH):
            cov = k64[:, h].T @ k64[:, h] / max(1, k64.shape[0])  # [D, D]
            vals, vecs = np.linalg.eigh(cov)  # ascending
            out[li, h] = vecs[:, ::-1][:, :rank].T
    return out


def rotate_to(keys: np.ndarray, pos: np.ndarray, new_pos: np.ndarray, inv_freq: np.ndarray,
              neox: bool) -> np.ndarray:
    """keys  # [n, KVH, D] rotated at ``pos``  # [n] -> the same keys rotated at ``new_pos``."""
    half = inv_freq.shape[0]
    ang = (new_pos.astype(np.float64) - pos.astype(np.float64))[:, None] * inv_freq[None, :]  # [n, D/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = keys.astype(np.float64).copy()
    ia = np.arange(half) if neox else 2 * np.arange(half)
    ib = ia + half if neox else ia + 1
    a, b = out[:, :, ia].copy(), out[:, :, ib].copy()
    out[:, :, ia] = a * c - b * s
    out[:, :, ib] = a * s + b * c
    return out.astype(np.float32)


def basis_file(gguf_path: str | os.PathLike, rank: int) -> Path:
    real = os.path.realpath(gguf_path)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return paths.repack_dir() / f"{Path(real).stem}-{key}-keys-r{rank}-v{BASIS_VERSION}.npz"


def load_basis(path: Path, n_layer: int, n_kv_head: int, head_dim: int, rank: int) -> np.ndarray | None:
    """The cached basis, or None when absent or of another shape."""
    try:
        with np.load(path) as f:
            b = f["basis"]
    except (OSError, KeyError, ValueError):
        return None
    if b.shape != (n_layer, n_kv_head, rank, head_dim) or b.dtype != np.float32 or not np.isfinite(b).all():
        return None
    return b


def save_basis(path: Path, basis: np.ndarray) -> None:
    """Atomic write (temporary file, os.replace); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
        np.savez(tmp, basis=basis)
        os.replace(tmp, path)
    except OSError:
        pass


def stdlib_text(n_chars: int, reverse: bool = False) -> str:
    """Real long text: CPython's standard library sources (top-level modules, sorted by
    name), concatenated up to ``n_chars``.  Calibration reads them in order, evaluation
    (``reverse``) from the other end, so the two do not share text until both are long."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"), reverse=reverse)
    parts, n = [], 0
    for p in files:
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(t)
        n += len(t)
        if n >= n_chars:
            break
    return "".join(parts)[:n_chars]
