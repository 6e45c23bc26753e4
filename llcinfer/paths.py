"""Where llcinfer keeps its files, all under ``$LLCINFER_HOME`` (default ~/.cache/llcinfer):

    models/        catalog models (assembled GGUF files)
    repack/        repacked weights, one file per model and vector width
    numba/         compiled kernels, one folder per hash of the kernel sources
    gguf-index/    parsed GGUF headers
    machine/       measured machine facts (bandwidth curves)
    llama.cpp/     llama.cpp builds for the comparisons
"""

from __future__ import annotations

from pathlib import Path

from . import settings


def home() -> Path:
    return settings.home()


def models_dir() -> Path:
    return home() / "models"


def repack_dir() -> Path:
    return home() / "repack"


def numba_dir() -> Path:
    return home() / "numba"


def gguf_index_dir() -> Path:
    return home() / "gguf-index"


def machine_dir() -> Path:
    return home() / "machine"


def llama_cpp_dir() -> Path:
    return home() / "llama.cpp"
