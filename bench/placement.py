"""``slurmhet bench placement``: slurmhet's planner against seed 001's algorithms and baselines.

Every policy runs in this process on the same PlanningInput; ``ratio`` is its
average JCT over the case's reference (the exact MILP optimum where it can be
solved, else the Lagrangian lower bound). See bench/README.md for the
throughput table and its provenance.

    .venv/bin/python -m bench.placement --json [--case tpds-k15 ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

from slurmhet.cluster import Inventory, parse_cluster_spec
from slurmhet.errors import InputError
from slurmhet.planner import exact, has, hetero, jps, optimus
from slurmhet.planner.bound import lower_bound
from slurmhet.planner.model import (
    Plan, PlanJob, PlanningInput, equal_share_seconds, jain_fairness, realised_run_seconds,
)
from slurmhet.planner.pipeline import Policy, build_problem, make_policy
from slurmhet.throughput import ThroughputTable

POLICY_KEYS = ("slurmhet", "has", "jps-20", "jps-40", "jps-60", "optimus", "optimus-lb", "exhaustive")
#: Wall-clock caps (s) for the slow baselines; past it a policy reports null and the cap.
CAP_S = {"tpds-example": 60.0, "tpds-k15": 60.0, "tpds-k30": 60.0, "k300-s50": 30.0}
#: Prediction errors of section VI-B and the rounds averaged per error level.
EPSILONS = (0.0, 0.1, 0.2, 0.3)
ROBUSTNESS_ROUNDS = 5
ROBUSTNESS_POLICIES = ("slurmhet", "jps-20", "optimus", "optimus-lb")
#: Links of the paper's simulator (section VI-A): 300 Gbps inside a node, 10 Gbps between nodes, in GB/s.
INTRA_GBPS, INTER_GBPS = 37.5, 1.25

#: Table III: model -> (dataset size, epochs, parameter MB for torchvision fp32 weights).
TABLE_III = {
    "ResNet-101": (50_000, 200, 170.5),
    "ResNet-18": (100_000, 200, 44.7),
    "VGG-19": (50_000, 200, 548.1),
    "AlexNet": (50_000, 100, 233.1),
}
#: Eq. (9), samples/s per GPU (the T4 and V100 columns; see README for how the garbled matrix is read).
EQ9 = {"ResNet-18": {"t4": 275.0, "v100": 644.0}, "VGG-19": {"t4": 884.0, "v100": 1754.0}}
#: Forward+backward GFLOPs per 224x224 image (torchvision model cards), to scale V100 rates to models eq. (9) lacks.
GFLOPS = {"ResNet-18": 1.82, "ResNet-101": 7.83, "AlexNet": 0.71, "VGG-19": 19.6}
#: Which Gavel workload's P100/V100 ratio, and which eq. (9) model's T4/V100 ratio, each model borrows.
BORROW = {
    "ResNet-18": ("ResNet-18 (batch size 64)", "ResNet-18"),
    "ResNet-101": ("ResNet-50 (batch size 64)", "ResNet-18"),
    "VGG-19": ("ResNet-50 (batch size 64)", "VGG-19"),
    "AlexNet": ("ResNet-18 (batch size 64)", "VGG-19"),
}


def workload(model: str) -> str:
    return f"{model} (batch size 64)"


def tpds_table() -> tuple[ThroughputTable, list[dict[str, Any]]]:
    """The V100/P100/T4 table of the TPDS cases and one provenance row per cell."""
    gavel = ThroughputTable.gavel()
    rates: dict[str, dict[str, float]] = {}
    rows = []
    for model, (gavel_key, t4_model) in BORROW.items():
        if model in EQ9:
            v100, v100_src = EQ9[model]["v100"], "eq. (9)"
        else:
            v100 = EQ9["ResNet-18"]["v100"] * GFLOPS["ResNet-18"] / GFLOPS[model]
            v100_src = f"eq. (9) ResNet-18 V100 x GFLOPs {GFLOPS['ResNet-18']}/{GFLOPS[model]}"
        if model in EQ9:
            t4, t4_src = EQ9[model]["t4"], "eq. (9)"
        else:
            ratio = EQ9[t4_model]["t4"] / EQ9[t4_model]["v100"]
            t4, t4_src = v100 * ratio, f"V100 x eq. (9) {t4_model} T4/V100 = {ratio:.3f}"
        p_ratio = gavel.rate(gavel_key, "p100") / gavel.rate(gavel_key, "v100")
        rates[workload(model)] = {"v100": v100, "p100": v100 * p_ratio, "t4": t4}
        rows.append({"model": model, "v100": round(v100, 1), "p100": round(v100 * p_ratio, 1), "t4": round(t4, 1),
                     "v100_source": v100_src, "t4_source": t4_src,
                     "p100_source": f"V100 x Gavel {gavel_key} P100/V100 = {p_ratio:.3f}"})
    return ThroughputTable.from_rates(rates, "bench/README.md (TPDS table)"), rows


def paper_job(job_id: str, model: str, scale: float = 1.0, comm: bool = True) -> PlanJob:
    """A Table III job; one all-reduce per epoch as in eq. (6)."""
    size, epochs, mb = TABLE_III[model]
    samples = size * scale
    return PlanJob(job_id, workload(model), samples * epochs, 64, mb if comm else 0.0, samples, samples,
                   max_gpus=32)


def _cluster(spec: str) -> Inventory:
    return replace(parse_cluster_spec(spec, gpus_per_node=5), intra_node_gbps=INTRA_GBPS, inter_node_gbps=INTER_GBPS)


@dataclass(frozen=True)
class Case:
    name: str
    inp: PlanningInput
    reference: str  # "exhaustive" or "bound"


def build_cases() -> dict[str, Callable[[], Case]]:
    table, _ = tpds_table()

    def example() -> Case:
        # Section IV-A: communication overlooked, as in the paper's 10,592 s optimum.
        rates = ThroughputTable.from_rates({workload(m): EQ9[m] for m in EQ9}, "eq. (9)")
        jobs = (paper_job("resnet18", "ResNet-18", comm=False), paper_job("vgg19", "VGG-19", comm=False))
        return Case("tpds-example", PlanningInput(jobs, _cluster("t4:2,v100:2"), rates), "exhaustive")

    def tpds(k: int) -> Case:
        jobs = tuple(paper_job(m.lower(), m) for m in TABLE_III)
        third = k // 3
        return Case(f"tpds-k{k}", PlanningInput(jobs, _cluster(f"v100:{third},p100:{third},t4:{third}"), table), "exhaustive")

    def k300() -> Case:
        rng = random.Random(300)
        models = sorted(TABLE_III)
        jobs = tuple(paper_job(f"job{i:02d}", rng.choice(models), rng.choice((0.25, 0.5, 1.0, 2.0)))
                     for i in range(50))
        return Case("k300-s50", PlanningInput(jobs, _cluster("v100:100,p100:100,t4:100"), table), "bound")

    return {"tpds-example": example, "tpds-k15": partial(tpds, 15), "tpds-k30": partial(tpds, 30), "k300-s50": k300}


def policies(cap_s: float) -> dict[str, Policy]:
    """The benchmark's policies: the registry's allocators, with this case's cap on the slow ones."""
    return {
        "slurmhet": make_policy("slurmhet", hetero.allocate),
        "has": make_policy("has", partial(has.has, cap_s=cap_s)),
        **{f"jps-{n}": make_policy(f"jps-{n}", jps.jps_policy(n, cap_s=cap_s)) for n in (20, 40, 60)},
        "optimus": make_policy("optimus", optimus.optimus, proportional=False),
        "optimus-lb": make_policy("optimus-lb", optimus.optimus_lb),
        "exhaustive": make_policy("exhaustive", exact.exact_milp),
    }


def fairness(plan: Plan, inp: PlanningInput) -> float:
    """Eq. (33) against the equal shares of eq. (32)."""
    gpus = sum(sum(n.gpus.values()) for n in inp.inventory.nodes)
    types = inp.inventory.gpus_by_type()
    equal = {}
    for job in inp.jobs:
        all_rates = sum(inp.throughput.rate(job.workload, t) * c for t, c in types.items())
        equal[job.id] = equal_share_seconds(job, all_rates, gpus, len(inp.jobs), inp.inventory.inter_node_gbps)
    return jain_fairness({j.job_id: j.jct_s for j in plan.jobs}, equal)


def realised_avg_jct(plan: Plan, truth: PlanningInput) -> float:
    """Average JCT when the plan (made on predicted rates) meets the true rates."""
    jobs = {j.id: j for j in truth.jobs}
    total = 0.0
    for jp in plan.jobs:
        assert jp.allocation is not None, "benchmark cases admit every job"
        true_rates = {t: truth.throughput.rate(jobs[jp.job_id].workload, t) for t in jp.allocation.by_type()}
        total += realised_run_seconds(jobs[jp.job_id], jp.allocation, jp.shard_weights, true_rates, truth.inventory)
    return total / len(plan.jobs)


def robustness(case: Case, table: dict[str, Policy], reference: float) -> dict[str, Any]:
    """Section VI-B: plan on rates drawn from [(1-eps) rho, (1+eps) rho] per (workload, type); score on true rates."""
    out: dict[str, Any] = {"epsilons": list(EPSILONS), "rounds": ROBUSTNESS_ROUNDS, "policies": {}}
    cells = list(case.inp.throughput.entries)
    for key in ROBUSTNESS_POLICIES:
        ratios = []
        for eps in EPSILONS:
            values = []
            for r in range(ROBUSTNESS_ROUNDS if eps else 1):
                rng = random.Random(1000 * r + int(eps * 100))
                noisy = case.inp.throughput.scaled({c: rng.uniform(1 - eps, 1 + eps) for c in cells})
                plan = table[key](replace(case.inp, throughput=noisy))
                values.append(realised_avg_jct(plan, case.inp))
            ratios.append(round(sum(values) / len(values) / reference, 4))
        out["policies"][key] = {"ratio_by_eps": ratios}
    return out


def run_case(case: Case, with_robustness: bool) -> dict[str, Any]:
    cap = CAP_S[case.name]
    table = policies(cap)
    results: dict[str, dict[str, Any]] = {}
    plans: dict[str, Plan] = {}
    for key in POLICY_KEYS:
        start = time.perf_counter()
        try:
            plans[key] = table[key](case.inp)
        except InputError as exc:  # a cap or a size limit: report null, as the issue asks
            results[key] = {"avg_jct": None, "ratio": None, "seconds": None, "fairness": None,
                            "note": exc.cause, "cap_s": cap}
            continue
        results[key] = {"avg_jct": plans[key].avg_jct, "seconds": round(time.perf_counter() - start, 6),
                        "fairness": round(fairness(plans[key], case.inp), 4)}
    problem = build_problem(case.inp)
    if case.reference == "exhaustive" and "exhaustive" in plans:
        reference = plans["exhaustive"].avg_jct
    else:
        start = time.perf_counter()
        bound = lower_bound(problem)
        reference = bound.value / len(problem.jobs)
        results["bound"] = {"avg_jct": reference, "seconds": round(time.perf_counter() - start, 3),
                            "iterations": bound.iterations, "gap": bound.gap}
    for key, res in results.items():
        if res.get("avg_jct") is not None and key != "bound":
            res["avg_jct"] = round(res["avg_jct"], 3)
            res["ratio"] = round(res["avg_jct"] / reference, 6)
    bound_info = results.pop("bound", None)
    out: dict[str, Any] = {
        "name": case.name, "jobs": len(case.inp.jobs), "gpus": int(problem.capacity.sum()),
        "reference": "exact MILP optimum (exhaustive)" if case.reference == "exhaustive" else "Lagrangian lower bound",
        "reference_avg_jct": round(reference, 3), "policies": results,
    }
    if bound_info:
        out["bound"] = bound_info
    if case.name == "tpds-example" and "exhaustive" in plans:
        out["placement"] = {key: {jp.job_id: [f"{n}:{t}x{c}" for n, t, c in jp.allocation.slots]  # type: ignore[union-attr]
                                  for jp in plan.jobs} for key, plan in plans.items()}
    if with_robustness and case.reference == "exhaustive" and case.name != "tpds-example":
        out["robustness"] = robustness(case, table, reference)
    sj, j60 = results["slurmhet"].get("seconds"), results["jps-60"].get("seconds")
    if sj and j60:
        out["speedup_vs_jps60"] = round(j60 / sj, 1)
    return out


def run(cases: list[str] | None = None, with_robustness: bool = True) -> dict[str, Any]:
    """Run the named cases (all by default) and return ``{"cases": [...], "throughput_table": [...]}``; prints nothing."""
    builders = build_cases()
    names = cases or list(builders)
    unknown = [n for n in names if n not in builders]
    if unknown:
        raise InputError(f"unknown case {unknown[0]!r}", place="--case", hint=" | ".join(builders))
    return {"cases": [run_case(builders[n](), with_robustness) for n in names], "throughput_table": tpds_table()[1]}


def print_text(result: dict[str, Any]) -> None:
    for case in result["cases"]:
        print(f"{case['name']}: {case['jobs']} jobs on {case['gpus']} GPUs, reference {case['reference_avg_jct']:.1f} s")
        for key, res in case["policies"].items():
            ratio = "null" if res["ratio"] is None else f"{res['ratio']:.4f}"
            secs = "null" if res["seconds"] is None else f"{res['seconds']:.4f}"
            print(f"  {key:11s} ratio {ratio:>8s}  seconds {secs:>9s}  fairness {res['fairness']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--case", action="append", help="run only this case (repeatable)")
    parser.add_argument("--no-robustness", action="store_true", help="skip the prediction-error rounds")
    args = parser.parse_args(argv)
    try:
        result = run(args.case, not args.no_robustness)
    except InputError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
