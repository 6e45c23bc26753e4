"""``llcinfer chat``: an interactive conversation with history.

/reset clears the history, /exit (or Ctrl-D) leaves, Ctrl-C stops the current reply.
"""

from __future__ import annotations

import sys

import click

from ..engine.sampling import SamplingParams
from .options import (kv_options, model_options, sampling_kwargs, sampling_options, sparse_options, spec_kwargs,
                      spec_options)

HELP = "commands: /reset (clear history), /exit (quit); Ctrl-C stops a reply, Ctrl-D exits"


@click.command()
@model_options
@kv_options
@sparse_options
@spec_options
@sampling_options
@click.option("--system", default=None, help="System message that opens the conversation.")
def chat(model, threads, n_ctx, numerics, kv_type, kv_budget_mb, sparse, sparse_top_k, sparse_indexers, system,
         **kw):
    """Chat with a model in the terminal."""
    spec = spec_kwargs(kw)
    sampling = sampling_kwargs(kw)
    SamplingParams(**sampling).validate()
    if sampling["max_tokens"] == SamplingParams().max_tokens:
        sampling["max_tokens"] = 512  # replies, not snippets
    from ..api import LLM

    llm = LLM(model, threads=threads, n_ctx=n_ctx, numerics=numerics, kv_type=kv_type,
              kv_budget_mb=kv_budget_mb, sparse=sparse, sparse_top_k=sparse_top_k, sparse_indexers=sparse_indexers,
              **spec)
    llm.apply_chat_template([{"role": "user", "content": "x"}])  # no template: fail now
    base = [{"role": "system", "content": system}] if system else []
    history = list(base)
    click.echo(f"llcinfer chat: {llm.model_path.name} ({llm.threads} threads). {HELP}", err=True)
    while True:
        try:
            line = input("> ") if sys.stdin.isatty() else _read_line()
        except EOFError:
            click.echo("", err=True)
            return
        except KeyboardInterrupt:
            click.echo("", err=True)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            history = list(base)
            llm.reset()
            click.echo("(history cleared)", err=True)
            continue
        if text.startswith("/"):
            click.echo(f"unknown command {text}; {HELP}", err=True)
            continue
        history.append({"role": "user", "content": line})
        reply = []
        try:
            for piece in llm.chat(history, stream=True, **sampling):
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [stopped]")
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": "".join(reply)})
        s = llm.last_stats
        click.echo(f"[{s.n_generated} tokens, {s.generation_tps:.1f} tok/s, "
                   f"prompt {s.n_prompt_evaluated} new tokens at {s.prompt_tps:.1f} tok/s]", err=True)


def _read_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")
