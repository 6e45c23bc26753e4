"""The ``llcinfer`` command line (click).

Every subcommand runs inside ``_run_cli``'s error boundary: an ``LLCInferError`` becomes one
line on stderr and its exit code (2 usage, 1 runtime); nothing reaches the user as a
traceback.
"""

from __future__ import annotations

import sys

import click

from .. import __version__
from ..errors import LLCInferError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llcinfer")
def cli():
    """llcinfer: cache-resident CPU inference for GGUF language models."""


def _register():
    from .generate import generate
    from .chat import chat
    from .models import models
    from .bench import bench
    from .plan import plan
    from .serve import serve
    from .run import run
    from .perplexity import perplexity

    cli.add_command(generate)
    cli.add_command(chat)
    cli.add_command(models)
    cli.add_command(bench)
    cli.add_command(plan)
    cli.add_command(serve)
    cli.add_command(run)
    cli.add_command(perplexity)


def main(argv=None):
    """Entry point of the ``llcinfer`` script."""
    _register()
    try:
        rc = cli.main(args=argv, prog_name="llcinfer", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # usage errors: bad option, missing argument
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except LLCInferError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except MemoryError:
        click.echo("error: out of memory", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(rc if isinstance(rc, int) else 0)
