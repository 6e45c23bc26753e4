"""``llcinfer generate``: stream a completion to stdout."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError, check_prompt_fits
from ..engine.sampling import SamplingParams
from .options import (kv_options, model_options, sampling_kwargs, sampling_options, sparse_options, spec_kwargs,
                      spec_options)


@click.command()
@model_options
@kv_options
@sparse_options
@spec_options
@sampling_options
@click.option("--chat", "use_chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--verbose", "-v", is_flag=True, help="Print prompt and generation speed on stderr.")
@click.option("--prompt", "-p", "prompt_option", default=None, help="The prompt (llama.cpp's -p), instead of PROMPT.")
@click.argument("prompt", required=False)
def generate(prompt, prompt_option, model, threads, n_ctx, numerics, kv_type, kv_budget_mb, sparse, sparse_top_k,
             sparse_indexers, use_chat, system, verbose, **kw):
    """Complete PROMPT (or -p PROMPT; use - to read it from stdin) and stream the text to stdout."""
    if (prompt is None) == (prompt_option is None):
        raise UsageError("give the prompt once: as the PROMPT argument or with -p/--prompt")
    prompt = prompt if prompt_option is None else prompt_option
    spec = spec_kwargs(kw)
    SamplingParams(**sampling_kwargs(kw)).validate()  # bad values fail before loading
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt:
        raise UsageError("empty prompt")
    from ..api import LLM
    from ..model.model_file import ModelFile

    source = ModelFile(model)
    if use_chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    ctx = source.config.n_ctx_train if n_ctx is None else n_ctx
    if ctx >= 1:  # a prompt that cannot fit fails before the kernels are built (LLM rejects a bad -c)
        check_prompt_fits(len(source.prompt_ids(messages if use_chat else prompt)), ctx)
    llm = LLM(source, threads=threads, n_ctx=n_ctx, numerics=numerics, kv_type=kv_type,
              kv_budget_mb=kv_budget_mb, sparse=sparse, sparse_top_k=sparse_top_k, sparse_indexers=sparse_indexers,
              **spec)
    if use_chat:
        pieces = llm.chat(messages, stream=True, **sampling_kwargs(kw))
    else:
        pieces = llm.stream(prompt, **sampling_kwargs(kw))
    out = sys.stdout
    for piece in pieces:
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    if verbose:
        s = llm.last_stats
        click.echo(
            f"[{llm.model_path.name} | threads {llm.threads}] {s.summary()}", err=True
        )
        if llm.spec_stats is not None:
            click.echo(f"[{llm.model_path.name}] {llm.spec_stats.summary()}", err=True)
