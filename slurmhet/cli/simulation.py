"""Offline evaluation: simulate a trace under policies, and the benchmarks."""

from __future__ import annotations

import click
from rich.table import Table

from slurmhet.cli.app import _emit_json, _progress_bar, console, err_console, main
from slurmhet.cluster import cluster_option
from slurmhet.errors import InputError

#: ``slurmhet simulate``'s table: JSON key, header, scale, format (hours and milliseconds, so 80 columns hold it;
#: ``--json`` has every metric in seconds).
SIMULATE_COLUMNS = (("avg_jct", "JCT h", 1 / 3600, "{:,.2f}"), ("weighted_jct", "wJCT h", 1 / 3600, "{:,.0f}"),
                    ("makespan", "span h", 1 / 3600, "{:,.1f}"), ("utilization", "util", 1.0, "{:.3f}"),
                    ("avg_queue", "queue h", 1 / 3600, "{:,.2f}"), ("jain", "Jain", 1.0, "{:.3f}"),
                    ("plan_seconds", "plan ms", 1000.0, "{:,.1f}"))


@main.command()
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Gavel .trace or CSV (submit_time,gpus,workload,steps|duration)")
@click.option("--generate", "generate_n", type=click.IntRange(min=1), default=None, help="a seeded Gavel-style trace")
@click.option("--arrivals", type=click.Choice(["poisson", "zero"]), default="poisson", show_default=True)
@click.option("--cluster", "cluster_spec", required=True, help="v100:20,p100:20,k80:20 or a cluster YAML")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per server [Gavel traces: one server per GPU type, as Gavel's throughputs assume; else 4]")
@click.option("--policy", "policy_list", default="slurmhet", show_default=True, help="comma-separated policy keys")
@click.option("--round-s", type=float, default=360.0, show_default=True)
@click.option("--restart-s", type=float, default=None,
              help="checkpoint-restart cost of a move [Gavel traces: 0, as Gavel's simulator; else 10]")
@click.option("--start-s", type=float, default=0.0, show_default=True,
              help="start-up cost of a job's first start (measure it on your site)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-wait-h", type=click.FloatRange(min=0, min_open=True), default=None,
              help="a site's wait limit (config max_wait_h) for the slurmhet policies")
@click.option("--bound", "with_bound", is_flag=True,
              help="lower bounds on avg JCT, weighted JCT and makespan for this instance, and each policy's ratio")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, with every job's record under each policy")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None)
def simulate(trace_path: str | None, generate_n: int | None, arrivals: str, cluster_spec: str,
             gpus_per_node: int | None, policy_list: str, round_s: float, restart_s: float | None, start_s: float,
             seed: int, max_wait_h: float | None, with_bound: bool, as_json: bool, plot_dir: str | None) -> None:
    """Replay a trace on a simulated cluster under one or more policies (same planners as submit).

    A Gavel trace (``.trace`` or ``--generate``) runs in Gavel's set-up unless the flags say otherwise:
    one server per GPU type (Gavel's multi-GPU throughputs do not depend on placement) and free
    preemption (its simulator charges none), so its figures and ours compare.
    """
    from slurmhet import sim

    if (trace_path is None) == (generate_n is None):
        raise InputError("give exactly one of --trace and --generate", place="--trace/--generate",
                         hint="--generate 100 or --trace jobs.trace")
    gavel_setup = trace_path is None or not trace_path.lower().endswith(".csv")  # a CSV trace is not Gavel's
    if trace_path is not None:
        jobs = sim.load_gavel_trace(trace_path) if gavel_setup else sim.load_csv_trace(trace_path)
    else:
        jobs = sim.generate_trace(generate_n or 0, seed, arrivals)
    if gpus_per_node is None:
        gpus_per_node = sim.GAVEL_SERVER_GPUS if gavel_setup else 4
    if restart_s is None:
        restart_s = 0.0 if gavel_setup else 10.0
    inventory = cluster_option(cluster_spec, gpus_per_node)
    policies = [p.strip() for p in policy_list.split(",") if p.strip()]
    with _progress_bar("policies") as bar:
        task = bar.add_task("simulating", total=len(policies))

        def progress(name: str, index: int, total: int) -> None:
            bar.update(task, completed=index, description=f"simulating {name}")

        report = sim.simulate(jobs, inventory, None, policies, round_s=round_s, seed=seed, progress=progress,
                              restart_s=restart_s, start_s=start_s, bound=with_bound,
                              max_wait_s=None if max_wait_h is None else 3600 * max_wait_h)
    report.meta.update(setup="gavel" if gavel_setup else "slurmhet", gpus_per_node=gpus_per_node)
    if plot_dir:
        for path in sim.write_plots(report, plot_dir):
            err_console.print(f"wrote {path}", markup=False)
    data = report.to_json(jobs=as_json)
    if as_json:
        _emit_json(data)
        return
    table = Table(title=f"slurmhet simulate: {len(jobs)} jobs on {sum(inventory.gpus_by_type().values())} GPUs")
    table.add_column("policy", no_wrap=True)
    for _, header, _, _ in SIMULATE_COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    bound = data.get("bound")
    if bound:
        table.add_column("JCT/LB", justify="right", no_wrap=True)
        table.add_column("span/LB", justify="right", no_wrap=True)
    for name, metrics in data["policies"].items():
        cells = [form.format(metrics[key] * scale) if isinstance(metrics.get(key), (int, float)) else "-"
                 for key, _, scale, form in SIMULATE_COLUMNS]
        ratio = metrics.get("ratio_to_bound") or {}
        extra = [f"{ratio[k]:.3f}" if ratio.get(k) is not None else "-" for k in ("avg_jct", "makespan")] if bound else []
        table.add_row(name, *cells, *extra)
    if bound:
        table.add_row("lower bound", *(form.format(bound[key] * scale) if key in bound else ""
                                       for key, _, scale, form in SIMULATE_COLUMNS), "1", "1")
    console.print(table)


@main.group()
def bench() -> None:
    """Benchmarks that print JSON with ratios against baselines and bounds."""


@bench.command("placement")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--case", "cases", multiple=True, help="only these cases")
def bench_placement(as_json: bool, cases: tuple[str, ...]) -> None:
    """Sizing + placement vs HAS/JPS/Optimus and the exact optimum or LP bound (seed 001)."""
    from bench import placement

    _emit_json(placement.run(list(cases) or None))


@bench.command("reproduce")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--case", "cases", multiple=True, help="only these cases")
@click.option("--quick", is_flag=True, help="scaled-down instances")
def bench_reproduce(as_json: bool, cases: tuple[str, ...], quick: bool) -> None:
    """The papers' simulations (Hare, Hadar/HadarE, SJF-BCO, Gavel traces, scale)."""
    from bench import reproduce

    _emit_json(reproduce.run(list(cases) or None, quick))


@bench.command("emit")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--jobs", type=click.IntRange(min=1), default=1000, show_default=True)
def bench_emit(as_json: bool, jobs: int) -> None:
    """Submissions per second to the real slurmctld: one array vs one sbatch per job."""
    from bench import emit

    _emit_json(emit.run(jobs))


@bench.command("chaos")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--minutes", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="the run's length; faults during its first 70 %%, then the workload finishes")
@click.option("--seed", type=int, default=1, show_default=True, help="the workload's and the fault injector's seed")
def bench_chaos(as_json: bool, minutes: float, seed: int) -> None:
    """Faults injected into a mixed workload on the dev cluster; the invariants held (root, pgcluster up)."""
    from bench import chaos

    _emit_json(chaos.run(minutes, seed))


@bench.command("realcluster")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="multiply every job's steps (0.3: about 3 minutes per arm)")
@click.option("--replan-every", "replan_every_s", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="seconds between `slurmhet replan --once` in the slurmhet arm")
@click.option("--background", is_flag=True, help="run every arm again with other users' jobs arriving "
              "(devcluster noise; needs root)")
@click.option("--noise-rate", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="background jobs per minute")
@click.option("--noise-seed", type=int, default=1, show_default=True, help="background seed, the same for every arm")
def bench_realcluster(as_json: bool, scale: float, replan_every_s: float, background: bool, noise_rate: float,
                      noise_seed: int) -> None:
    """examples/jobs.yaml on the live dev cluster: slurmhet vs naive first-type FIFO vs Slurm choosing the type."""
    from bench import realcluster

    load = realcluster.Background(noise_rate, noise_seed) if background else None
    _emit_json(realcluster.run(scale, replan_every_s, load))
