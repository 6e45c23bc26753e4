"""``llcinfer plan``: the resource-domain plan for a model on this machine or a topology file."""

from __future__ import annotations

import dataclasses
import json

import click

from ..errors import UsageError
from .options import check_sparse, sparse_options


@click.command()
@click.option("--model", "-m", default=None,
              help="Catalog name or path to a .gguf file (default: smollm2-135m); only its header is read.")
@click.option("--ctx", "-c", type=int, default=4096, show_default=True, help="Context length (KV tokens per sequence).")
@click.option("--concurrency", type=int, default=1, show_default=True, help="Sequences decoded together.")
@click.option("--threads", "-t", type=int, default=None, help="Cores to plan for (default: all physical cores).")
@click.option("--topology", default=None,
              help="Plan for another machine: a shipped topology name or a topology JSON file.")
@click.option("--kv-type", type=click.Choice(["f16", "int8", "f32"]), default="f16", show_default=True,
              help="KV cache storage.")
@click.option("--sync", type=click.Choice(["handoff", "barrier"]), default="handoff", show_default=True,
              help="Predict with data-dependency hand-offs or operator barriers.")
@click.option("--probe/--no-probe", default=True, show_default=True,
              help="Measure this machine's read bandwidth if not cached (a few seconds, once).")
@click.option("--reprobe", is_flag=True, help="Measure the read bandwidth again and replace the cached curve.")
@click.option("--replicas", default=None,
              help="Also plan N model replicas (or 'auto': one per LLC instance / NUMA node), --concurrency "
                   "sequences each; shown by default when auto gives more than one.")
@sparse_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(model, ctx, concurrency, threads, topology, kv_type, sync, probe, reprobe, replicas, sparse, sparse_top_k,
         sparse_indexers, as_json):
    """Plan cores, cache residency and tiles for MODEL; print the predicted TPOT and why, and
    the TPOT observed where the plan was measured here."""
    from ..model import catalog
    from ..planner import Calibration, cache_key, detect_machine, load_topology, make_plan, workload_from_gguf
    from ..hw.bandwidth import curve_path, probe_curve, save_curve
    from ..planner.replicas import parse_replicas, plan_replicas, replica_core_sets
    from ..planner.sparse_policy import sparse_policy
    from ..planner.verify import explain_verify, predict_verify_cost
    from ..sparse import SparseConfig
    from ..planner.workload import KV_ITEMSIZE

    if ctx < 1 or concurrency < 1:
        raise UsageError(f"--ctx and --concurrency must be at least 1 (got {ctx}, {concurrency})")
    check_sparse(sparse, sparse_top_k, sparse_indexers)
    asked = None if replicas is None else parse_replicas(replicas)
    if topology is not None:
        machine = load_topology(topology)
    else:
        machine = detect_machine()
        if reprobe or (probe and machine.bandwidth_source == "estimated"):
            if not as_json:
                click.echo(f"measuring read bandwidth (cached in {curve_path(machine)})", err=True)
            machine.bandwidth, machine.bandwidth_source = probe_curve(machine), "measured"
            save_curve(machine, machine.bandwidth)
    path = catalog.resolve_model(model, progress=not as_json)
    work = workload_from_gguf(path, ctx=ctx, concurrency=concurrency, kv_itemsize=KV_ITEMSIZE[kv_type],
                              name=model if model and not str(model).endswith(".gguf") else None)
    best = make_plan(machine, work, threads=threads, sync=sync)
    cal = Calibration.load(cache_key(machine))
    verify, _ = predict_verify_cost(best, machine, work, cal)
    policy = None
    if sparse:
        config = SparseConfig.from_options(sparse_top_k, sparse_indexers).for_context(ctx)
        policy = sparse_policy(best, machine, work, config, cal)
    shown = asked if asked is not None else ("auto" if len(replica_core_sets(machine, "auto")) > 1 else None)
    rp = None if shown is None else plan_replicas(machine, work, shown, sync=sync)
    if as_json:
        d = best.to_dict()
        d["verify"] = verify.to_dict()
        if policy is not None:
            d["sparse"] = dataclasses.asdict(policy)
        if asked is not None:
            d["replicas"] = rp.to_dict()
        click.echo(json.dumps(d, indent=1))
        return
    click.echo(best.explain())
    click.echo(explain_verify(verify))
    if policy is not None:
        click.echo(policy.explain())
    if rp is not None:
        click.echo("\n" + rp.explain())
    if machine.bandwidth_source == "estimated":
        click.echo("note: bandwidth curve estimated, not measured", err=True)
    if topology is None and not _kernels_measured(machine, work):
        click.echo("note: this machine's kernel rates for this model are not measured yet (the first LLM "
                   "load or `llcinfer run` measures them); defaults used", err=True)


def _kernels_measured(machine, work) -> bool:
    from ..planner import Calibration, cache_key

    cal = Calibration.load(cache_key(machine))
    return {f"{q}@4" for q in work.qtypes.values()} <= set(cal.matmul_stream_gbs)
