"""Reproductions of the papers' comparisons: ``python -m bench.reproduce --json [--case NAME] [--quick]``.

Every case runs all its policies in one process on the same jobs and cluster and
reports their metrics plus ratios against slurmhet's default (policy / slurmhet).
The set-ups and every number we had to choose are in bench/README.md (Reproductions).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from slurmhet.cluster import Inventory, Node, parse_cluster_spec
from slurmhet.errors import InputError
from slurmhet.planner.registry import POLICIES
from slurmhet.policies.base import ClusterView, JobState
from slurmhet.policies.default import SlurmhetForking, SlurmhetRelaxed
from slurmhet.policies.registry import TIME_POLICIES
from slurmhet.policies.sjf_bco import SjfBco
from slurmhet.sim import (
    GAVEL_SERVER_GPUS,
    SimConfig,
    bounds_for,
    default_throughputs,
    generate_trace,
    load_gavel_trace,
    run_policies,
)
from slurmhet.sim.contention import ContentionModel
from slurmhet.sim.engine import capacity_of
from slurmhet.sim.rates import RateModel, ThroughputSource
from slurmhet.sim.traces import TraceJob, resolve_steps

TRACES = Path(__file__).resolve().parent.parent / "slurmhet" / "data" / "gavel" / "traces"
#: GPU types Gavel did not measure, as (measured type, speed factor); see bench/README.md.
DERIVED_TYPES = {"t4": ("p100", 0.8), "m60": ("k80", 1.1)}


class DerivedThroughputs:
    """Adds T4 and M60 to Gavel's table by scaling a measured type (same factor for every job)."""

    def __init__(self, base: ThroughputSource) -> None:
        self.base = base

    def throughput(self, job_type: str, gpu_type: str, scale: int, consolidated: bool = True) -> float:
        source, factor = DERIVED_TYPES.get(gpu_type, (gpu_type, 1.0))
        return self.base.throughput(job_type, source, scale, consolidated) * factor

    def colocated(self, job_type: str, partner: str, gpu_type: str) -> tuple[float, float] | None:
        """Measured pairs of the source type, scaled by the same factor."""
        source, factor = DERIVED_TYPES.get(gpu_type, (gpu_type, 1.0))
        measured = getattr(self.base, "colocated", None)
        pair = measured(job_type, partner, source) if measured else None
        return (pair[0] * factor, pair[1] * factor) if pair else None

    def job_types(self) -> set[str]:
        return self.base.job_types()


class FixedRates:
    """Synthetic per-iteration times (seed 004's set-up): ``k / tau_j`` worker-steps/s on any GPU."""

    def __init__(self, tau: dict[str, float]) -> None:
        self.tau = tau

    def throughput(self, job_type: str, gpu_type: str, scale: int, consolidated: bool = True) -> float:
        return scale / self.tau[job_type]

    def job_types(self) -> set[str]:
        return set(self.tau)


def _report(report: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out = report.to_json()
    out["ratios_vs_slurmhet"] = report.ratios("slurmhet")
    out.update(extra or {})
    return out


def _policies(names: list[str], round_s: float, seed: int = 0) -> dict[str, Any]:
    return {n: TIME_POLICIES[n](seed=seed, round_s=round_s) for n in names}


def case_hare(quick: bool) -> dict[str, Any]:
    """Seed 000 section 7.3: 160 GPUs of V100/T4/K80/M60, 200 jobs of the 8 workload types."""
    n_jobs, per_type = (40, 8) if quick else (200, 40)
    types = ["ResNet-18 (batch size 128)", "ResNet-50 (batch size 64)", "ResNet-50 (batch size 32)",
             "Transformer (batch size 32)", "Transformer (batch size 128)", "LM (batch size 20)",
             "Recommendation (batch size 512)", "Recommendation (batch size 1024)"]
    rng = random.Random(7)
    jobs = [replace(j, weight=float(rng.randint(1, 4)))
            for j in generate_trace(n_jobs, 7, "poisson", mean_interarrival_s=30.0, job_types=types)]
    inventory = parse_cluster_spec(",".join(f"{t}:{per_type}" for t in ("v100", "t4", "k80", "m60")), 8)
    rates = RateModel(DerivedThroughputs(default_throughputs()), ContentionModel(inventory.inter_node_gbps))
    jobs = resolve_steps(jobs, lambda t, k: rates.type_rate(t, k, "v100"))
    # Hare's jobs are scale-fixed but may run on fewer GPUs (relaxed synchronisation): so may slurmhet's.
    policies = {"slurmhet": SlurmhetRelaxed(round_s=360.0),
                **_policies(["hare", "gavel-fifo", "srtf", "sched-homo", "sched-allox"], 360.0)}
    report = run_policies(jobs, inventory, rates, policies, SimConfig(restart_s=1.0))
    return _report(report)


def hadar_jobs(n: int, rates: RateModel, seed: int = 3) -> list[TraceJob]:
    """Seed 003 IV-A: GPU-hour classes S/M/L/XL mapped to Table III's models, all at t=0.

    Class frequencies are Philly-like (most jobs small: 72/20/6/2%), which puts the
    total work near the paper's scale (Hadar's TTD of about 40 h on 60 GPUs).
    """
    classes = [((0.0, 1.0), ["ResNet-18 (batch size 128)"]), ((1.0, 10.0), ["CycleGAN"]),
               ((10.0, 50.0), ["LM (batch size 20)", "Transformer (batch size 128)"]),
               ((60.0, 100.0), ["ResNet-50 (batch size 64)"])]
    rng = random.Random(seed)
    jobs = []
    for job_id in range(n):
        (low, high), models = rng.choices(classes, weights=(72, 20, 6, 2))[0]
        model = rng.choice(models)
        gpus = 1 if model == "CycleGAN" else rng.choices((1, 2, 4, 8), weights=(70, 10, 15, 5))[0]
        gpu_hours = rng.uniform(max(low, 0.05), high)
        steps = gpu_hours * 3600 / gpus * rates.type_rate(model, gpus, "v100")
        jobs.append(TraceJob(job_id, model, gpus, 0.0, steps))
    return jobs


def _hadar_cluster() -> tuple[Inventory, RateModel]:
    """Seed 003 section IV's cluster: 15 nodes x 4 GPUs (20 V100, 20 P100, 20 K80)."""
    inventory = parse_cluster_spec("v100:20,p100:20,k80:20", 4)
    return inventory, RateModel(default_throughputs(), ContentionModel(inventory.inter_node_gbps))


HADAR_POLICIES = ["slurmhet", "hadar", "gavel-mmf", "tiresias", "yarn-cs"]


def case_hadar(quick: bool) -> dict[str, Any]:
    """Seed 003 section IV: 480 jobs at t=0 on the 60-GPU cluster, rounds 6 min, restart 10 s."""
    inventory, rates = _hadar_cluster()
    jobs = hadar_jobs(96 if quick else 480, rates)
    report = run_policies(jobs, inventory, rates, _policies(HADAR_POLICIES, 360.0),
                          SimConfig(round_s=360.0, restart_s=10.0))
    return _report(report)


#: Trace seeds of ``hadar-seeds``: the ``hadar`` case's own (3) and four more.
HADAR_SEEDS = (1, 2, 3, 4, 5)
SEED_METRICS = ("makespan", "avg_jct", "utilization")


def median_over_seeds(per_seed: dict[str, dict[str, dict[str, float]]], reference: str = "slurmhet") -> dict[str, Any]:
    """Per policy the median of each metric over the seeds, the policies in order of median TTD, and the
    medians' ratios against ``reference``."""
    names = list(next(iter(per_seed.values())))
    median = {n: {k: statistics.median(run[n][k] for run in per_seed.values()) for k in SEED_METRICS} for n in names}
    return {"median": median, "ttd_order_of_medians": sorted(names, key=lambda n: median[n]["makespan"]),
            "median_ratios_vs_" + reference: {n: {k: round(v / median[reference][k], 4) for k, v in median[n].items()}
                                               for n in names}}


def case_hadar_seeds(quick: bool) -> dict[str, Any]:
    """The ``hadar`` case on several trace seeds: where one long job lands sets a TTD, so one draw decides
    the order of the type-blind baselines; the median over seeds is the measurement (bench/README.md)."""
    inventory, rates = _hadar_cluster()
    seeds = HADAR_SEEDS[:2] if quick else HADAR_SEEDS
    per_seed: dict[str, dict[str, dict[str, float]]] = {}
    for seed in seeds:
        report = run_policies(hadar_jobs(96 if quick else 480, rates, seed), inventory, rates,
                              _policies(HADAR_POLICIES, 360.0), SimConfig(round_s=360.0, restart_s=10.0))
        bound = report.bound
        per_seed[str(seed)] = {n: {**{k: round(getattr(m, k), 3) for k in SEED_METRICS},
                                   "ratio_to_bound": bound.ratios(m.avg_jct, m.makespan, m.weighted_jct) if bound else None}
                               for n, m in report.metrics.items()}
    return {"seeds": list(seeds), "per_seed": per_seed, **median_over_seeds(per_seed)}


def case_hadare(quick: bool) -> dict[str, Any]:
    """Seed 003 VI-B: the AWS cluster (1 V100, 2 K80, 2 T4 single-GPU nodes), mixes M-1..M-12."""
    inventory = Inventory(tuple(Node(f"n{i}-{t}", {t: 1}) for i, t in enumerate(("v100", "k80", "k80", "t4", "t4"))))
    rates = RateModel(DerivedThroughputs(default_throughputs()), ContentionModel(inventory.inter_node_gbps))
    model = {"IC": "ResNet-18 (batch size 128)", "LM": "LM (batch size 20)", "LT": "Transformer (batch size 64)",
             "RS": "Recommendation (batch size 1024)", "MM": "ResNet-50 (batch size 32)"}
    mixes = {"M-1": ["MM"], "M-3": ["LT", "MM", "MM"], "M-4": ["IC", "LM", "LT", "MM"],
             "M-5": ["IC", "LM", "LT", "RS", "MM"], "M-8": ["IC", "LM", "LT", "RS"] + ["MM"] * 4,
             "M-10": ["IC", "LM", "LT", "RS"] + ["MM"] * 6, "M-12": ["IC", "LM", "LT", "RS"] + ["MM"] * 8}
    if quick:
        mixes = {k: mixes[k] for k in ("M-1", "M-5")}
    out: dict[str, Any] = {}
    for mix, members in mixes.items():
        jobs = [TraceJob(i, model[m], 1, 0.0, 1200.0 * rates.type_rate(model[m], 1, "v100"))
                for i, m in enumerate(members)]
        policies = {"slurmhet": SlurmhetForking(round_s=180.0), **_policies(["hadare", "hadar", "gavel-mmf"], 180.0)}
        report = run_policies(jobs, inventory, rates, policies,
                              SimConfig(round_s=180.0, restart_s=10.0, consolidate_s=10.0))
        out[mix] = _report(report)
    return {"mixes": out}


def case_sjfbco(quick: bool) -> dict[str, Any]:
    """Seed 004 section 7: 160 jobs, F_j in [1000, 6000], 20 servers of 4/8/16/32 GPUs, T = 1200."""
    rng = random.Random(4)
    sizes = [1] * 80 + [2] * 14 + [4] * 26 + [8] * 30 + [16] * 8 + [32] * 2
    servers = [rng.choice((4, 8, 16, 32)) for _ in range(20)]
    if quick:
        sizes, servers = sizes[::4], servers[:5]
    inventory = Inventory(tuple(Node(f"s{i}", {"gpu": c}) for i, c in enumerate(servers)))
    tau = {f"rar-{j}": rng.uniform(0.01, 0.05) for j in range(len(sizes))}
    # Gradient size so that one uncontended cross-server all-reduce adds ~10% to an iteration (<= 15%).
    model_gb = {name: 0.1 * t * 1.25 / 2.0 for name, t in tau.items()}
    rates = RateModel(FixedRates(tau), ContentionModel(1.25, xi1=1.0, xi2=0.001, alpha=0.1), model_gb)
    jobs = [TraceJob(j, f"rar-{j}", g, 0.0, rng.randint(1000, 6000) * g) for j, g in enumerate(sizes)]
    names = ["slurmhet", "sjf-bco", "ff", "ls", "rand"]
    report = run_policies(jobs, inventory, rates, _policies(names, 360.0), SimConfig(restart_s=0.0))
    sweep = {}
    for kappa in sorted(set(sizes)):
        policy = SjfBco()
        policy.kappa = kappa
        run = run_policies(jobs, inventory, rates, {"sjf-bco": policy}, SimConfig(restart_s=0.0), with_bound=False)
        sweep[str(kappa)] = round(run.metrics["sjf-bco"].makespan, 3)
    return _report(report, {"kappa_sweep_makespan": sweep, "T": 1200})


#: Gavel's own simulator on its own traces (avg JCT s, makespan s): stanford-futuredata/gavel at c4fa400, unchanged,
#: run as ``python scripts/drivers/simulate_scheduler_with_trace.py -t traces/physical_cluster/<trace>.trace
#: -p <policy> --seed 0 -c 8:16:24 --num_gpus_per_server 1:1:1 --solver ECOS --time_per_iteration 360
#: --throughputs_file simulation_throughputs.json`` from its scheduler/ folder (bench/README.md, "Gavel, faithfully").
GAVEL_OWN: dict[str, dict[str, tuple[float, float]]] = {
    "max_min_fairness": {"gavel-mmf": (14622.820, 63944.529), "gavel-fifo": (19526.854, 72319.858)},
    "minimize_makespan": {"gavel-fifo": (40257.935, 90701.292), "gavel-mmf": (35658.966, 68521.823),
                          "gavel-mtd": (63774.726, 64720.835)},
}


def gavel_setup(spec: str) -> Inventory:
    """Gavel's set-up of its traces: one server per GPU type (its multi-GPU throughputs ignore placement)."""
    return parse_cluster_spec(spec, GAVEL_SERVER_GPUS)


def _against_gavel(traces: dict[str, tuple[Path, dict[str, tuple[float, float]]]], quick_jobs: int,
                   quick: bool) -> dict[str, Any]:
    """Each trace on 8 V100 + 16 P100 + 24 K80 in Gavel's set-up (free preemption, one server per type) under
    slurmhet and Gavel's policies, with their figures against Gavel's own (``_versus_gavel``) on the full traces."""
    inventory = gavel_setup("v100:8,p100:16,k80:24")
    rates = RateModel(default_throughputs(), ContentionModel(inventory.inter_node_gbps))
    out = {}
    for name, (path, own) in traces.items():
        jobs = load_gavel_trace(path, rates.source.job_types())
        jobs = jobs[:quick_jobs] if quick else jobs
        report = run_policies(jobs, inventory, rates,
                              _policies(["slurmhet", "gavel-mmf", "gavel-fifo", "gavel-mtd"], 360.0),
                              SimConfig(round_s=360.0, restart_s=0.0))
        out[name] = _report(report, {} if quick else _versus_gavel(report, own))
    return {"traces": out}


def case_gavel_trace(quick: bool) -> dict[str, Any]:
    """Gavel's physical-cluster traces, each against Gavel's own simulator (``GAVEL_OWN``)."""
    return _against_gavel({name: (TRACES / f"{name}.trace", own) for name, own in GAVEL_OWN.items()}, 24, quick)


#: Gavel's own simulator on 120 jobs made by its own generator (Poisson arrivals, multi-GPU jobs, seed 0) at 0.5,
#: 1 and 3 jobs/hour on 8 V100 + 16 P100 + 24 K80 (light load, ~90% of capacity, overload); the traces ship in
#: slurmhet/data/gavel/traces/generated and bench/gavel_original/ holds the scripts that made and ran them.
GAVEL_OWN_GENERATED: dict[str, dict[str, tuple[float, float]]] = {
    "gen-0.5": {"gavel-mmf": (57928.498, 1495934.710), "gavel-fifo": (57333.244, 1495896.928),
                "gavel-mtd": (59863.175, 1495971.021)},
    "gen-1.0": {"gavel-mmf": (61078.289, 1073562.499), "gavel-fifo": (64525.745, 1058587.117),
                "gavel-mtd": (65983.357, 1026757.137)},
    "gen-3.0": {"gavel-mmf": (76693.936, 857003.471), "gavel-fifo": (109547.102, 926591.067),
                "gavel-mtd": (105006.837, 749359.089)},
}


def _versus_gavel(report: Any, own: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Our Gavel policies over Gavel's own figures, and Gavel's own figures over slurmhet's (> 1: slurmhet better)."""
    ours = report.metrics["slurmhet"]
    return {"gavel_own": {p: {"avg_jct": a, "makespan": m} for p, (a, m) in own.items()},
            "vs_gavel_own": {p: {"avg_jct": round(report.metrics[p].avg_jct / a, 4),
                                 "makespan": round(report.metrics[p].makespan / m, 4)} for p, (a, m) in own.items()},
            "gavel_own_vs_slurmhet": {p: {"avg_jct": round(a / ours.avg_jct, 4),
                                          "makespan": round(m / ours.makespan, 4)} for p, (a, m) in own.items()}}


def case_gavel_generated(quick: bool) -> dict[str, Any]:
    """Continuous arrivals from Gavel's own generator, light load to overload, each against Gavel's own simulator
    on the same jobs (``GAVEL_OWN_GENERATED``)."""
    return _against_gavel({name: (TRACES / "generated" / f"{name}.trace", own)
                           for name, own in GAVEL_OWN_GENERATED.items()}, 30, quick)


#: (jobs, GPUs) of ``scale-10k``: the issue's measured sizes and its two targets (10,000 x 10,000 under 5 s,
#: 20,000 x 10,000 under 10 s per decision).
SCALE_SIZES = ((2048, 1024), (8192, 1024), (2048, 8192), (8192, 8192), (20000, 8192), (10000, 10000), (20000, 10000))


def case_scale_10k(quick: bool) -> dict[str, Any]:
    """One decision of the default policy at the largest sites' sizes (4 GPU types, 8 GPUs per node, all jobs
    queued at t=0): wall seconds, and the plan's predicted avg JCT over the instance's lower bound
    (``sim.bounds``, valid for any schedule of those jobs on that cluster)."""
    rows = []
    for n_jobs, gpus in (((256, 128), (512, 1024)) if quick else SCALE_SIZES):
        per_type = gpus // 4
        inventory = parse_cluster_spec(",".join(f"{t}:{per_type}" for t in ("v100", "p100", "t4", "k80")), 8)
        rates = RateModel(DerivedThroughputs(default_throughputs()), ContentionModel(inventory.inter_node_gbps))
        trace = resolve_steps(generate_trace(n_jobs, 11, "zero"), lambda t, k: rates.type_rate(t, k, "v100"))
        jobs = [JobState(j.job_id, j.job_type, j.gpus, j.weight, 0.0, j.total_steps or 0.0, j.total_steps or 0.0)
                for j in trace]
        view = ClusterView(0.0, capacity_of(inventory), jobs, rates, tuple(n.name for n in inventory.nodes))
        policy = TIME_POLICIES["slurmhet"]()
        started = time.perf_counter()
        plan = POLICIES["slurmhet"](policy.planning_input(view))
        seconds = time.perf_counter() - started
        bound = bounds_for(trace, inventory, rates, [policy])
        rows.append({"jobs": n_jobs, "gpus": gpus, "seconds": round(seconds, 3),
                     "ratio_to_bound": round(plan.avg_jct / bound.avg_jct, 4) if bound.avg_jct > 0 else None,
                     "placed": sum(1 for jp in plan.jobs if jp.allocation is not None)})
    return {"rows": rows, "types": ["v100", "p100", "t4", "k80"], "gpus_per_node": 8}


CASES: dict[str, Callable[[bool], dict[str, Any]]] = {
    "hare": case_hare, "hadar": case_hadar, "hadar-seeds": case_hadar_seeds, "hadare": case_hadare, "sjfbco": case_sjfbco,
    "gavel-trace": case_gavel_trace, "gavel-generated": case_gavel_generated, "scale-10k": case_scale_10k,
}


def run(cases: list[str] | None, quick: bool = False) -> dict[str, Any]:
    """Run the named cases (all when None); returns ``{"cases": {name: result}}``."""
    names = cases or list(CASES)
    unknown = [c for c in names if c not in CASES]
    if unknown:
        raise InputError(f"unknown case {unknown[0]!r}", place="--case", hint=" | ".join(CASES))
    out: dict[str, Any] = {}
    for name in names:
        started = time.perf_counter()
        out[name] = CASES[name](quick)
        out[name]["wall_seconds"] = round(time.perf_counter() - started, 2)
    return {"quick": quick, "solver": solver_versions(), "cases": out}


def solver_versions() -> dict[str, str]:
    """The LP stack a run used: Hare's relaxation is degenerate, and the vertex HiGHS returns decides its
    order (``hare`` weighted JCT 43.71 M s with highspy 1.15.1, 38.65 M s with 1.16.0; bench/README.md)."""
    return {name: importlib.metadata.version(name) for name in ("highspy", "pulp")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.case, args.quick)
    json.dump(result, sys.stdout, indent=2 if not args.json else None)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
