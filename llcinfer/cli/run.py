"""``llcinfer run --controller FILE``: run a controller tree (majority vote, best-of-N, ...)
on a prompt and print the text it chose."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError
from .options import import_refs, kv_options, model_options, ref_option


@click.command()
@model_options
@kv_options
@click.option("--controller", "config", required=True, help="The controller config, YAML or JSON.")
@ref_option
@click.option("--chat", "use_chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--system", default=None, help="System message (with --chat).")
@click.option("--seed", "-s", type=int, default=None, help="Run seed: leaf i samples with seed + i.")
@click.option("--verbose", "-v", is_flag=True, help="Print every candidate with its answer and score on stderr.")
@click.argument("prompt", required=False)
def run(prompt, model, threads, n_ctx, numerics, kv_type, kv_budget_mb, config, refs, use_chat, system, seed,
        verbose):
    """Run the controller tree of --controller on PROMPT (- or none: read it from stdin)."""
    from ..controllers import from_config

    ctl = from_config(config, refs=import_refs(refs))  # a bad config fails before the model loads
    if prompt in (None, "-"):
        prompt = sys.stdin.read()
    if not prompt:
        raise UsageError("empty prompt")
    if use_chat:
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    from ..api import LLM

    llm = LLM(model, threads=threads, n_ctx=n_ctx, numerics=numerics, kv_type=kv_type, kv_budget_mb=kv_budget_mb,
              n_seq=min(ctl.n_leaves, 16))
    outcome = ctl.bind(llm).run(prompt, seed=seed)
    if verbose:
        _show(outcome, 0)
    click.echo(outcome.text)


def _show(o, depth: int) -> None:
    for i, c in enumerate(o.candidates):
        lp = "-" if c.mean_logprob is None else f"{c.mean_logprob:.3f}"
        score = "" if c.score is None else f" score {c.score:.3f}"
        text = c.text.strip().replace("\n", " ")
        click.echo(f"{'  ' * depth}[{i}] answer {c.answer!r} mean logprob {lp}{score}: {text[:100]}", err=True)
        _show(c, depth + 1)
    if depth == 0:
        click.echo(f"chosen: answer {o.answer!r}" + ("" if o.score is None else f", score {o.score:.3f}"), err=True)
