#!/usr/bin/env python3
"""Merge the ``--json`` files of several ``llcinfer bench`` runs into one table and plot.

    python perf/bench_report.py perf/results/bench-*.json --plot perf/results/bench.png

Prints the markdown table (as ``llcinfer bench`` does) and writes the merged JSON with
``--json``.  Used for the must-show table, which runs one invocation per model.
"""

from __future__ import annotations

import sys

import click

from llcinfer.bench import report
from llcinfer.bench.plot import plot_tpot


@click.command(help=__doc__.split("\n\n")[0])
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--plot", "plot_path", default=None, help="Write a TPOT-vs-depth PNG here.")
@click.option("--json", "json_path", default=None, help="Write the merged JSON here.")
def main(files, plot_path, json_path):
    records: list[report.Record] = []
    head: dict = {}
    for f in files:
        meta, recs = report.read_json(f)
        head = head or meta
        records += recs
    report.mark_anchors(records)
    click.echo(report.markdown_table(records))
    if json_path:
        report.write_json(json_path, head.get("machine", {}), head.get("versions", {}),
                          {"merged_from": list(files)}, records)
    if plot_path:
        plot_tpot(records, plot_path, title=f"{head.get('machine', {}).get('cpu_model', '')}: llcinfer vs llama.cpp")
        click.echo(f"wrote {plot_path}", err=True)


if __name__ == "__main__":
    sys.exit(main())
