"""Building the speculator a request for speculative decoding names: the mode's form
checked before any model is loaded, the drafter made (a draft model checked against the
target), "auto" resolved to a cached draft model or suffix lookup."""

from __future__ import annotations

from ..errors import UsageError
from ..model import catalog
from ..model.gguf_file import GGUFFile
from ..speculative import DraftModelDrafter, NgramDrafter, SuffixDrafter, check_draft_compatible
from .speculation import Speculator
from .transformer import Transformer

SPEC_MODES = "none | ngram | suffix | draft:MODEL | auto"


def check_spec_options(spec, budget: int | None = None, policy: str = "super-tree") -> None:
    """A one-line UsageError for a speculative mode, budget or policy of the wrong form
    (checked before any model is loaded; a draft model is checked when it is built)."""
    if spec is None or spec == "none":
        return
    draft = isinstance(spec, str) and spec.startswith("draft:") and len(spec) > 6
    if not (draft or spec in ("ngram", "suffix", "auto")):
        raise UsageError(f"speculative must be one of {SPEC_MODES} (got {spec!r})")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise UsageError(f"spec budget must be a positive integer (got {budget!r})")
    if policy not in ("super-tree", "per-sequence"):
        raise UsageError(f"spec policy must be 'super-tree' or 'per-sequence' (got {policy!r})")


def build_speculator(spec: str | None, target, tokenizer_vocab: list[str], n_ctx: int, n_seq: int,
                     budget: int | None = None, policy: str = "super-tree", progress: bool = True,
                     llama_rounding: bool = True, kv_type: str | None = None) -> Speculator | None:
    """The speculator ``spec`` names (``SPEC_MODES``); None for "none".  "auto" drafts with
    the smallest cached catalog model that shares the target's vocabulary, else by suffix
    lookup.  A draft model that cannot draft for the target is a one-line UsageError."""
    check_spec_options(spec, budget, policy)
    if spec is None or spec == "none":
        return None
    if kv_type == "int8":
        raise UsageError("speculative decoding needs an f16 or f32 KV cache (not int8)")
    if spec == "auto":
        draft_name = _auto_draft(target, tokenizer_vocab)
        spec = "suffix" if draft_name is None else f"draft:{draft_name}"
    if spec == "ngram":
        drafter = NgramDrafter()
    elif spec == "suffix":
        drafter = SuffixDrafter()
    else:  # draft:MODEL (its form checked above)
        name = spec[6:]
        path = catalog.resolve_model(name, progress=progress)
        gguf = GGUFFile(path)
        vocab = list(gguf.metadata.get("tokenizer.ggml.tokens", []))
        draft = Transformer(gguf, llama_rounding=llama_rounding)
        check_draft_compatible(draft.config, target.config, vocab, tokenizer_vocab, draft.weights.nbytes,
                               target.weights.nbytes, name)
        drafter = DraftModelDrafter(draft, n_ctx, n_seq)
    return Speculator(drafter, policy, budget)


def _auto_draft(target, vocab: list[str]) -> str | None:
    """The smallest cached catalog model with the target's vocabulary, smaller than it."""
    best = None
    for name in catalog.names():
        if not catalog.is_cached(name):
            continue
        path = catalog.cached_path(name)
        try:
            g = GGUFFile(path)
            same = list(g.metadata.get("tokenizer.ggml.tokens", [])) == vocab
            size = path.stat().st_size
        except Exception:  # noqa: BLE001 - a bad cached file is simply not a candidate
            continue
        if same and size < target.weights.nbytes * 0.7 and (best is None or size < best[0]):
            best = (size, name)
    return None if best is None else best[1]
