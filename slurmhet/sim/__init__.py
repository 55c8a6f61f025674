"""Trace-driven discrete-event simulator that runs slurmhet's policies over time.

Public API: ``simulate`` (the pure function behind ``slurmhet simulate``), the trace
loaders ``load_gavel_trace`` / ``load_csv_trace``, ``generate_trace`` and ``write_plots``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError
from slurmhet.policies.base import TimePolicy
from slurmhet.policies.registry import TIME_POLICIES
from slurmhet.sim.bounds import InstanceBounds, instance_bounds
from slurmhet.sim.contention import ContentionModel
from slurmhet.sim.engine import Engine, PolicyStarved, SimConfig, SimulationError
from slurmhet.sim.generator import generate_trace
from slurmhet.sim.metrics import SimReport, summarize
from slurmhet.sim.rates import GavelThroughputs, RateModel, ThroughputSource
from slurmhet.sim.traces import TraceJob, load_csv_trace, load_gavel_trace, resolve_steps

__all__ = [
    "simulate", "run_policies", "load_gavel_trace", "load_csv_trace", "generate_trace", "write_plots", "default_throughputs",
    "SimReport", "SimConfig", "SimulationError", "TraceJob", "RateModel", "InstanceBounds", "bounds_for",
]

#: Gavel's set-up: a multi-GPU job's throughput is the table's consolidated cell wherever it runs, which the
#: simulator models as one server per GPU type (no gang ever spans servers) with this many GPUs.
GAVEL_SERVER_GPUS = 1_000_000

SHIPPED_TABLE = Path(__file__).resolve().parent.parent / "data" / "gavel" / "simulation_throughputs.json"


def default_throughputs() -> GavelThroughputs:
    """Gavel's measured throughputs as shipped with slurmhet."""
    return GavelThroughputs.from_json(SHIPPED_TABLE)


def write_plots(report: SimReport, directory: Path | str) -> list[Path]:
    from slurmhet.sim.plots import write_plots as _write

    return _write(report, directory)


def simulate(trace_jobs: Sequence[TraceJob], inventory: Inventory, table: ThroughputSource | None,
             policies: Sequence[str], round_s: float = 360.0, seed: int = 0,
             progress: Callable[[str, int, int], None] | None = None, *, restart_s: float = 10.0,
             consolidate_s: float = 10.0, start_s: float = 0.0,
             contention: ContentionModel | None = None, bound: bool = False,
             max_wait_s: float | None = None) -> SimReport:
    """Run every policy on the same jobs and cluster; ``progress(policy, index, total)`` is called per policy.

    ``start_s`` is what a job's first start costs a live cluster (start-up, rendezvous);
    the papers' set-ups charge nothing. ``bound``: add the instance's lower bounds (``sim.bounds``).
    ``max_wait_s``: a site's wait limit, for the policies that plan through slurmhet's planner.
    """
    unknown = [p for p in policies if p not in TIME_POLICIES]
    if unknown or not policies:
        raise InputError(f"unknown policy {unknown or policies}", place="--policy",
                         hint=f"one or more of {', '.join(TIME_POLICIES)}")
    if not 0 < round_s < float("inf"):  # NaN too
        raise InputError(f"round length must be a positive number of seconds, not {round_s}", place="--round-s",
                         hint="e.g. 360")
    for value, flag in ((restart_s, "--restart-s"), (start_s, "--start-s")):
        if not 0 <= value < float("inf"):
            raise InputError(f"{flag} must be a finite number of seconds >= 0, not {value}", place=flag, hint="e.g. 10")
    source = table or default_throughputs()
    contention = contention or ContentionModel(inter_gbps=inventory.inter_node_gbps)
    rates = RateModel(source, contention)
    jobs = resolve_steps(trace_jobs, lambda t, k: rates.type_rate(t, k, "v100"))
    usable = inventory.usable()
    for job in jobs:
        if not any(rates.type_rate(job.job_type, job.gpus, t) > 0 for t in usable.gpu_types):
            raise InputError(f"job {job.job_id} ({job.job_type}) has no throughput on any GPU type of the cluster",
                             place=job.place, hint="check the throughput table and the cluster's types")
    total = sum(usable.gpus_by_type().values())
    for job in jobs:
        if job.gpus > total:
            raise InputError(f"asks {job.gpus} GPUs; the cluster has {total}",
                             place=job.place, hint="a larger --cluster, or drop the job from the trace")
    config = SimConfig(round_s=round_s, restart_s=restart_s, consolidate_s=consolidate_s, start_s=start_s)
    if max_wait_s is not None and not 0 < max_wait_s:
        raise InputError(f"the wait limit must be a positive number of hours, not {max_wait_s / 3600}",
                         place="--max-wait-h", hint="e.g. 48")
    instances = {name: TIME_POLICIES[name](seed=seed, round_s=round_s) for name in policies}
    for policy in instances.values():
        policy.max_wait_s = max_wait_s
    try:
        report = run_policies(jobs, usable, rates, instances, config, progress, with_bound=bound)
    except PolicyStarved as exc:
        types = ", ".join(f"{t} {c}" for t, c in sorted(usable.gpus_by_type().items()))
        raise InputError(f"{exc} (GPUs per type: {types})", place=f"--policy {exc.policy}",
                         hint="this policy runs a job on GPUs of one type (or one server); give the cluster enough of "
                              "one type for the largest job, or leave the policy out") from exc
    report.meta.update(round_s=round_s, restart_s=restart_s, start_s=start_s, seed=seed,
                       max_wait_h=None if max_wait_s is None else max_wait_s / 3600)
    return report


def bounds_for(jobs: Sequence[TraceJob], inventory: Inventory, rates: RateModel, policies: Iterable[TimePolicy],
               start_s: float = 0.0) -> InstanceBounds:
    """The instance's lower bounds, valid for every one of ``policies`` (forking or co-locating if any does)."""
    chosen = list(policies)
    return instance_bounds(jobs, inventory.gpus_by_type(), rates, start_s=start_s,
                           forks=any(p.forks for p in chosen), colocates=any(p.colocates for p in chosen))


def run_policies(jobs: Sequence[TraceJob], inventory: Inventory, rates: RateModel, policies: Mapping[str, TimePolicy],
                 config: SimConfig, progress: Callable[[str, int, int], None] | None = None, *,
                 with_bound: bool = True) -> SimReport:
    """Run prepared policy instances on the same resolved jobs (steps known) and cluster, with the instance's
    lower bounds (``sim.bounds``) unless ``with_bound`` is false."""
    metrics, runs = {}, {}
    for index, (name, policy) in enumerate(policies.items()):
        if progress:
            progress(name, index, len(policies))
        run = Engine(list(jobs), inventory, rates, policy, config).run()
        runs[name], metrics[name] = run, summarize(run)
    if progress:
        progress("", len(policies), len(policies))
    meta: dict[str, Any] = {"jobs": len(jobs), "gpus": sum(inventory.gpus_by_type().values())}
    bound = bounds_for(jobs, inventory, rates, policies.values(), config.start_s) if with_bound else None
    return SimReport(metrics, runs, meta, bound)
