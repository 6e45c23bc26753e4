"""``llcinfer bench``: TPOT side by side with llama.cpp (llama-bench's tests and method).

    llcinfer bench -m smollm2-135m --threads 2 -p 512 -n 128 --depth 0,4096 -r 5 \\
        --vs llama.cpp --json out.json --plot out.png
    llcinfer bench -m smollm2-135m -p 0 -n 64 --depth 8192,16384 --sparse [--sparse-top-k 1024]
    llcinfer bench -m qwen2.5-coder-1.5b --spec ngram,draft:qwen2.5-coder-0.5b -n 192 -r 2 --vs llama.cpp

With ``--spec`` it measures effective TPOT (wall time per generated token) of each
drafter against plain decoding on chat workloads instead (bench/spec.py).  With ``--sparse``
our pp/tg run sparse attention (rows with at least the keys from which the planner predicts
it pays) and the report says so.
"""

from __future__ import annotations

import time

import click

from ..errors import UsageError
from .options import check_sparse, sparse_options

DEFAULT_MODEL = "smollm2-135m"


def _int_list(value: str, what: str, minimum: int) -> list[int]:
    try:
        out = [int(x) for x in str(value).replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UsageError(f"{what} must be a comma-separated list of integers (got {value!r})") from None
    if not out or min(out) < minimum:
        raise UsageError(f"{what} must be integers >= {minimum} (got {value!r})")
    return list(dict.fromkeys(out))


@click.command()
@click.option("--model", "-m", "models", multiple=True, help="Catalog name or .gguf path (repeatable).")
@click.option("--threads", "-t", default="2", show_default=True, help="Thread counts, e.g. 1,2.")
@click.option("--n-prompt", "-p", type=int, default=512, show_default=True, help="Prompt test tokens (0: skip pp).")
@click.option("--n-gen", "-n", type=int, default=128, show_default=True, help="Generation test tokens (0: skip tg).")
@click.option("--depth", "-d", default="0", show_default=True, help="KV depths for tg, e.g. 0,4096,8192.")
@click.option("--repetitions", "-r", type=int, default=5, show_default=True, help="Timed repetitions per test.")
@click.option("--vs", type=click.Choice(["llama.cpp", "none"]), default="none", show_default=True,
              help="Engine to compare with.")
@click.option("--llama-bench", "llama_bench_path", default=None, help="Use this llama-bench binary instead of ours.")
@click.option("--build-llama-cpp", is_flag=True, help="Build llama.cpp (native, portable) first if missing.")
@click.option("--alternate", type=click.Choice(["rep", "block"]), default="rep", show_default=True,
              help="rep: A B A B per repetition; block: all of ours, then llama-bench -r R.")
@click.option("--fill", type=click.Choice(["auto", "real", "synthetic"]), default="auto", show_default=True,
              help="How our KV depth is filled (auto: real unless it would exceed --fill-limit).")
@click.option("--fill-limit", type=float, default=1200.0, show_default=True,
              help="Seconds a real depth fill may take in auto mode before it turns synthetic.")
@click.option("--ctx", "-c", "n_ctx", type=int, default=None,
              help="Our context length (default: the model's, as LLM uses); the plan is made for it.")
@click.option("--spec", default=None,
              help="Speculative modes to measure instead of pp/tg, e.g. ngram,suffix,draft:MODEL: effective TPOT "
                   "of -n greedy chat tokens against plain decoding (and llama.cpp's with --vs llama.cpp).")
@click.option("--spec-workload", default="code-edit,free-chat", show_default=True,
              help="Workloads for --spec: code-edit (a stdlib function to rename in), free-chat.")
@sparse_options
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
@click.option("--plot", "plot_path", default=None, help="Write a TPOT-vs-depth PNG here (needs matplotlib).")
def bench(models, threads, n_prompt, n_gen, depth, repetitions, vs, llama_bench_path, build_llama_cpp,
          alternate, fill, fill_limit, n_ctx, spec, spec_workload, sparse, sparse_top_k, sparse_indexers, json_path,
          plot_path):
    """Measure prompt (ppP) and generation (tgN @ dD) speed, optionally against llama.cpp."""
    from ..bench import llama_bench, report
    from ..hw import cpu as machine
    from ..bench.compare import BenchSettings, log, run_bench

    thread_list = _int_list(threads, "--threads", 1)
    check_sparse(sparse, sparse_top_k, sparse_indexers)
    if sparse and spec is not None:
        raise UsageError("--sparse measures pp/tg; it does not combine with --spec")
    if spec is not None:
        _spec_bench(list(models) or [DEFAULT_MODEL], thread_list, spec, spec_workload, n_gen, repetitions,
                    vs == "llama.cpp", json_path, log)
        return
    depths = _int_list(depth, "--depth", 0)
    if n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
        raise UsageError("-p and -n must be >= 0 and not both 0")
    if repetitions < 1:
        raise UsageError("-r must be >= 1")
    if plot_path:
        from ..bench.plot import require_matplotlib

        require_matplotlib()
    if (llama_bench_path or build_llama_cpp) and vs != "llama.cpp":
        vs = "llama.cpp"  # asking for a llama.cpp binary implies the comparison
    settings = BenchSettings(models=list(models) or [DEFAULT_MODEL], threads=thread_list, n_prompt=n_prompt,
                             n_gen=n_gen, depths=depths, reps=repetitions, alternate=alternate, fill=fill,
                             fill_limit_s=fill_limit, n_ctx=n_ctx, sparse=sparse, sparse_top_k=sparse_top_k,
                             sparse_indexers=sparse_indexers)
    if n_ctx is not None and n_ctx < settings.ctx_needed():
        raise UsageError(f"--ctx {n_ctx} is smaller than the deepest test needs ({settings.ctx_needed()} tokens)")
    builds = {}
    if vs == "llama.cpp":
        builds, notes = llama_bench.find_builds(llama_bench_path, build=build_llama_cpp, log=log)
        for note in notes:
            click.echo(f"note: {note}", err=True)
    info = machine.machine_info(thread_list)
    vers = llama_bench.versions(next(iter(builds.values()), None))
    vers["llama.cpp builds"] = {b: str(p) for b, p in builds.items()}
    meta = {**settings.__dict__, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    records: list = []
    interrupted = False
    try:
        run_bench(settings, builds, records)
    except KeyboardInterrupt:
        interrupted = True
        click.echo("interrupted: reporting the tests that finished", err=True)
    report.mark_anchors(records)
    if records:
        click.echo(report.markdown_table(records))
    if json_path:
        report.write_json(json_path, info, vers, meta, records, interrupted=interrupted)
        click.echo(f"wrote {json_path}", err=True)
    if plot_path and any(r.kind == "tg" and r.tpot_ms for r in records):
        from ..bench.plot import plot_tpot

        plot_tpot(records, plot_path, title=f"{info['cpu_model']}, llcinfer {vers['llcinfer']} vs llama.cpp")
        click.echo(f"wrote {plot_path}", err=True)
    if interrupted:
        raise KeyboardInterrupt


def _spec_bench(models, thread_list, spec, workloads, n_gen, reps, vs_llama, json_path, log) -> None:
    import json

    from ..bench import spec as spec_bench

    specs, wls = spec_bench.parse_specs(spec), spec_bench.parse_workloads(workloads)
    if n_gen < 2 or reps < 1:
        raise UsageError("--spec needs -n >= 2 and -r >= 1")
    out = []
    for model in models:
        for t in thread_list:
            rows = spec_bench.run_spec_bench(model, specs, wls, n_gen, t, reps, vs_llama, log)
            click.echo(spec_bench.markdown(rows, model, t, n_gen) + "\n")
            out.append({"model": model, "threads": t, "n": n_gen, "repetitions": reps, "rows": rows})
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
        click.echo(f"wrote {json_path}", err=True)
