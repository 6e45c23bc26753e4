"""Options shared by the commands (sampling names and defaults as llama.cpp's)."""

from __future__ import annotations

import importlib

import click

from ..engine.sampling import SamplingParams
from ..errors import ConfigError, UsageError

_D = SamplingParams()


def model_options(f):
    f = click.option("--numerics", type=click.Choice(["llama.cpp", "f32"]), default="llama.cpp",
                     show_default=True,
                     help="Round activations and KV as llama.cpp does, or keep float32.")(f)
    f = click.option("--n-ctx", "-c", "n_ctx", type=int, default=None,
                     help="Context length in tokens (default: the model's).")(f)
    f = click.option("--threads", "-t", type=int, default=None,
                     help="Kernel threads (default: physical cores).")(f)
    f = click.option("--model", "-m", default=None,
                     help="Catalog name or path to a .gguf file (default: smollm2-135m).")(f)
    return f


def kv_options(f):
    """KV cache options (separate from model_options so other commands opt in)."""
    f = click.option("--kv-budget-mb", type=float, default=None,
                     help="Most KV cache memory to commit, MiB (default: available RAM less the model).")(f)
    f = click.option("--kv-type", type=click.Choice(["f16", "int8", "f32"]), default=None,
                     help="KV cache storage (default: f16; f32 with --numerics f32).")(f)
    return f


def sparse_options(f):
    """Sparse attention for long contexts (LLM's sparse, sparse_top_k, sparse_indexers)."""
    f = click.option("--sparse-indexers", type=int, default=None,
                     help="Only this many sparse layers own an indexer, chosen on calibration loss (minutes, once "
                          "per model; default: all; needs --sparse).")(f)
    f = click.option("--sparse-top-k", type=int, default=None,
                     help="Tokens the sparse indexer picks (default: 1024, or 1/16 of the context where more; "
                          "needs --sparse).")(f)
    f = click.option("--sparse", is_flag=True,
                     help="Sparse attention on rows with at least the keys from which the planner predicts it "
                          "pays (indexer calibrated on first use).")(f)
    return f


def check_sparse(sparse: bool, sparse_top_k: int | None, sparse_indexers: int | None = None) -> None:
    """The sparse options' bad combinations, as the options' names (before a model loads)."""
    for name, value in (("--sparse-top-k", sparse_top_k), ("--sparse-indexers", sparse_indexers)):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be >= 1 (got {value})")
        if value is not None and not sparse:
            raise UsageError(f"{name} needs --sparse")


def spec_options(f):
    """Speculative decoding options (generate, chat)."""
    f = click.option("--spec-policy", type=click.Choice(["super-tree", "per-sequence"]), default="super-tree",
                     show_default=True, help="One verification budget ranked across sequences, or equal shares.")(f)
    f = click.option("--spec-budget", type=int, default=None,
                     help="Tokens per verification step for the whole batch (default: the measured knee).")(f)
    f = click.option("--spec", default="none", show_default=True,
                     help="Speculative decoding: none | ngram | suffix | draft:MODEL | auto (lossless).")(f)
    return f


def spec_kwargs(kw: dict) -> dict:
    """Pop the spec options into LLM's keyword arguments."""
    return {"speculative": kw.pop("spec"), "spec_budget": kw.pop("spec_budget"),
            "spec_policy": kw.pop("spec_policy")}


def sampling_options(f):
    opts = [
        click.option("--max-tokens", "-n", type=int, default=_D.max_tokens, show_default=True,
                     help="Tokens to generate at most."),
        click.option("--temp", "temperature", type=float, default=_D.temperature, show_default=True,
                     help="Temperature; 0 is greedy."),
        click.option("--top-k", type=int, default=_D.top_k, show_default=True, help="Top-k (0: off)."),
        click.option("--top-p", type=float, default=_D.top_p, show_default=True, help="Top-p, in (0, 1]."),
        click.option("--min-p", type=float, default=_D.min_p, show_default=True, help="Min-p, in [0, 1]."),
        click.option("--repeat-penalty", type=float, default=_D.repeat_penalty, show_default=True,
                     help="Repetition penalty (1.0: off)."),
        click.option("--repeat-last-n", type=int, default=_D.repeat_last_n, show_default=True,
                     help="Tokens the repetition penalty looks back (-1: all)."),
        click.option("--seed", "-s", type=int, default=None, help="Random seed (default: random)."),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def sampling_kwargs(kw: dict) -> dict:
    """Pick the SamplingParams fields out of click's keyword arguments."""
    keys = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
            "repeat_last_n", "seed", "ignore_eos")
    out = {k: kw[k] for k in keys}
    out["stop"] = tuple(kw.get("stop") or ())
    return out


ref_option = click.option("--ref", "refs", multiple=True,
                          help="NAME=module:attribute, an object a controller config's $ref may name (repeatable).")


def import_refs(specs) -> dict:
    """NAME=module:attribute pairs, imported, for the config's $ref values."""
    refs = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        module, colon, attr = target.partition(":")
        if not sep or not colon or not name or not module or not attr:
            raise UsageError(f"--ref takes NAME=module:attribute (got {spec!r})")
        try:
            refs[name] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"--ref {spec}: cannot import {target}: {e}") from None
    return refs
