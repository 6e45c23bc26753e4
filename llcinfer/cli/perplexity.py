"""``llcinfer perplexity``: llama-perplexity's measurement on a text file, and the KL divergence
against base logits (llama-perplexity's ``--kl-divergence-base`` file, or one this command
saved with ``--save-logits``).

    llcinfer perplexity -m smollm2-135m -f text.txt [-c 512] [--chunks 20] [--save-logits base.kld]
    llcinfer perplexity -m smollm2-135m --kl-divergence-base base.kld [--chunks 20]
    llcinfer perplexity -m smollm2-135m -f long.txt -c 8192 --sparse [--sparse-top-k 1024]

With ``--sparse`` the rows with at least the planner's ``min_context`` keys (the context
from which sparse is predicted to pay on this machine; the first line says it) attend
sparsely (prompt rows too), so the positions scored past that are the sparse path's.
"""

from __future__ import annotations

import time

import click

from ..engine.sparse_setup import NEVER
from ..errors import UsageError
from .options import check_sparse, kv_options, model_options, sparse_options


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start})") from None


def _sparse_note(llm, ctx: int) -> str:
    """``, sparse top-k K ...`` for the first line when sparse attention is on."""
    sp = llm.engine.sparse
    if sp is None:
        return ""
    c = sp.config
    if c.min_context >= NEVER:
        return f", sparse attention top-k {c.top_k} (predicted never to pay on this machine: every row dense)"
    reach = "" if ctx - 1 >= c.min_context else f"; no scored row has that many at -c {ctx}"
    return f", sparse attention top-k {c.top_k} (rows with >= {c.min_context} keys{reach})"


@click.command()
@model_options
@kv_options
@sparse_options
@click.option("--file", "-f", "text_file", default=None, help="The text to score (UTF-8).")
@click.option("--chunks", type=int, default=None, help="Score at most this many chunks (default: all).")
@click.option("--save-logits", default=None, help="Write this run's log-probabilities as a base file.")
@click.option("--kl-divergence-base", "base_file", default=None,
              help="Compare with this base file (its tokens are scored; no --file needed).")
def perplexity(model, threads, n_ctx, numerics, kv_type, kv_budget_mb, sparse, sparse_top_k, sparse_indexers, text_file,
               chunks, save_logits, base_file):
    """Perplexity of MODEL on --file in chunks of -c tokens (default 512; the second half of
    each is scored), as llama-perplexity computes it; with --kl-divergence-base, also the KL
    divergence and top-token agreement against the base (whose -c it takes)."""
    from ..bench.kld_base import read_base
    from ..bench.perplexity import check_inputs, perplexity as score
    from ..model.model_file import ModelFile

    check_sparse(sparse, sparse_top_k, sparse_indexers)
    if (text_file is None) == (base_file is None):
        raise UsageError("give either --file TEXT or --kl-divergence-base FILE")
    if base_file is not None and save_logits is not None:
        raise UsageError("--save-logits writes a base from --file; it cannot be combined with --kl-divergence-base")
    if chunks is not None and chunks < 1:
        raise UsageError(f"--chunks must be >= 1 (got {chunks})")
    base = read_base(base_file) if base_file else None
    text = _read_text(text_file) if text_file else None
    ctx = base.n_ctx if base is not None else (n_ctx or 512)
    if base is not None and n_ctx not in (None, ctx):
        raise UsageError(f"{base_file} was computed with -c {ctx}, not {n_ctx}")
    from ..api import LLM

    source = ModelFile(model, progress=False)
    tokens = base.tokens if base is not None else source.tokenize(text)
    check_inputs(len(tokens), ctx, source.config.vocab_size, base)  # before the kernels are built
    llm = LLM(source, threads=threads, n_ctx=ctx, numerics=numerics, kv_type=kv_type,
              kv_budget_mb=kv_budget_mb, n_seq=2, progress=False, sparse=sparse, sparse_top_k=sparse_top_k,
              sparse_indexers=sparse_indexers)
    try:
        t0 = time.perf_counter()

        def progress(i, result):
            if i == 0:
                click.echo(f"perplexity: {len(tokens)} tokens, chunks of {ctx}, threads {llm.threads}"
                           f"{_sparse_note(llm, ctx)}", err=True)
            click.echo(f"[{i + 1}]{result.running_ppl()[-1]:.4f},", nl=False)

        result = score(llm, tokens, ctx, chunks, base, save_logits, progress)
        click.echo("")
        ppl, err = result.ppl
        n_scored = sum(len(c.nll) for c in result.chunks)
        click.echo(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}  ({len(result.chunks)} chunks, {n_scored} "
                   f"positions, {time.perf_counter() - t0:.1f} s)")
        if base is not None:
            ppl_base, err_base = result.ppl_base
            kld, kld_err = result.kld
            pct = result.kld_percentiles()
            click.echo(f"Mean PPL(base)    : {ppl_base:.4f} +/- {err_base:.5f}")
            click.echo(f"Mean PPL / base   : {ppl / ppl_base:.6f}")
            click.echo(f"Mean KLD          : {kld:.6f} +/- {kld_err:.6f}")
            click.echo(f"KLD median / 99 % / max: {pct['50']:.6f} / {pct['99']:.6f} / {pct['max']:.6f}")
            click.echo(f"Same top token    : {100 * result.same_top:.3f} %")
        if save_logits:
            click.echo(f"wrote {save_logits}", err=True)
    finally:
        llm.close()
