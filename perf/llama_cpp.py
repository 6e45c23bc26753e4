#!/usr/bin/env python3
"""Provision llama.cpp builds for side-by-side comparisons with llcinfer.

The logic lives in ``llcinfer.bench.llama_cpp`` (so that ``llcinfer bench`` can use it
from an installed package); this file re-exports it and keeps the command line::

    python perf/llama_cpp.py build [--config native|portable|all] [--jobs 2] [--force]
    python perf/llama_cpp.py path CONFIG TOOL
    python perf/llama_cpp.py list
"""

from __future__ import annotations

import sys
import time

from llcinfer.bench.llama_cpp import *  # noqa: F401,F403  (the public API)
from llcinfer.bench.llama_cpp import (  # noqa: F401  (names the CLI and old callers use)
    CONFIGS,
    LlamaCppError,
    _require_toolchain,
    bin_dir,
    binary,
    build,
    is_built,
    log_path,
)


# ------------------------------------------------------------------------------ CLI


def _main(argv: list[str] | None = None) -> int:
    import click

    @click.group()
    def cli() -> None:
        """Provision llama.cpp builds for side-by-side comparisons with llcinfer.

        They live under $LLCINFER_HOME/llama.cpp/ (perf/README.md, "llama.cpp builds")."""

    @cli.command("build")
    @click.option("--config", "config", type=click.Choice([*CONFIGS, "all"]), default="all", show_default=True)
    @click.option("--jobs", "-j", type=int, default=2, show_default=True)
    @click.option("--force", is_flag=True, help="rebuild even if binaries exist")
    def build_cmd(config: str, jobs: int, force: bool) -> None:
        """Build one config, or portable then native."""
        configs = ["portable", "native"] if config == "all" else [config]
        for c in configs:
            click.echo(f"building {c} (log: {log_path(c)}) ...", err=True)
            t0 = time.time()
            try:
                out = build(c, jobs=jobs, force=force)
            except LlamaCppError as exc:
                raise click.ClickException(str(exc)) from None
            click.echo(f"{c}: {out} ({time.time() - t0:.0f}s)")

    @cli.command("path")
    @click.argument("config", type=click.Choice(list(CONFIGS)))
    @click.argument("tool")
    def path_cmd(config: str, tool: str) -> None:
        """Print the path of TOOL in CONFIG (exit 1 if not built)."""
        p = binary(config, tool)
        if p is None:
            raise click.ClickException(f"{tool} not built for {config}; run: python perf/llama_cpp.py build --config {config}")
        click.echo(str(p))

    @cli.command("list")
    def list_cmd() -> None:
        """Show which configs are built."""
        for c in CONFIGS:
            click.echo(f"{c}: {'built ' + str(bin_dir(c)) if is_built(c) else 'not built'}")

    try:
        cli.main(args=argv, prog_name="llama_cpp.py", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
