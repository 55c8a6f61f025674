"""``slurmhet bench realcluster``: the example workload on the real dev cluster, slurmhet vs two plain baselines.

Runs examples/jobs.yaml (steps scaled by ``--scale``) in three arms on the running
dev cluster, with emulated GPU speed (``SLURMHET_EMULATE_THROUGHPUT=1``):

* **slurmhet**: ``slurmhet submit``, then ``slurmhet replan --once`` every
  ``replan_every_s`` until every job is final (what etc/demo does), own state dir;
* **naive**: what users do today: each job one plain typed batch job on its FIRST
  allowed GPU type with ``gpus.min`` GPUs, all submitted at once in file order, and
  Slurm queues them (priority FIFO + backfill);
* **slurm-chooses**: each job one plain batch job of ``--gpus=<gpus.min>`` with its
  allowed types as a ``--constraint`` OR-list (``v100|t4``; the dev cluster's node
  features are its GPU types), all submitted at once: Slurm picks the type.

With ``--background`` every arm runs a second time with other users' jobs arriving
(``devcluster noise``, the same seed for every arm, started before the arm and
stopped after it, its jobs cancelled), so the result compares each arm with and
without background load.

Every arm is measured from sacct (allocation rows, not steps): makespan = last end -
first submit, avg JCT = mean of (end - submit). A slurmhet job's submit is its store
time (``created_at``), since it may wait in the store before any sbatch. The
simulator predicts the slurmhet and naive arms from the same jobs, with the same emulated rates
(per-GPU samples/s from etc/throughput/devcluster.yaml), before they run: a probe
first runs two short copies of the workload's jobs on the idle cluster, and what
they take beyond their emulated time is every job's start-up cost in the prediction.

Run: ``.venv/bin/python -m bench.realcluster --json [--scale 0.3] [--background]`` (about
3 min per arm at 0.3) or ``slurmhet bench realcluster --json [--background]``. Needs the
dev cluster up, and root for ``--background``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import yaml

from slurmhet.cluster import Inventory, Node
from slurmhet.emit.render import render
from slurmhet.emit.requests import BatchRequest, Common, Launch, Materialized
from slurmhet.report import StoredJob, as_utc, fold
from slurmhet.runtime import emulation
from slurmhet.policies.default import SlurmhetReplanned
from slurmhet.sim import SimConfig, TraceJob, run_policies, simulate
from slurmhet.sim.contention import ContentionModel
from slurmhet.sim.rates import RateModel
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.parsers import AccountingRecord
from slurmhet.slurm.runner import SubprocessRunner
from slurmhet.spec import JobSpec, load_file

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "examples" / "jobs.yaml"
TABLE = REPO / "etc" / "throughput" / "devcluster.yaml"
#: The dev cluster (etc/devcluster/README.md): one GPU type per node.
DEV_CLUSTER = (("nodea", "v100", 4), ("nodeb", "t4", 4), ("nodec", "k80", 2))
#: Link speed that makes the simulator's communication negligible: tiny MLPs on loopback gloo.
NO_COMM_GBPS = 1e9
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
STORE_FINAL = {"COMPLETED", "FAILED", "CANCELLED"}
#: Seconds to wait before an arm for other users' jobs to leave the shared cluster.
IDLE_WAIT_S = 300.0
#: Seconds of emulated work in each probe job.
PROBE_S = 20.0
ARMS = ("slurmhet", "naive", "slurm-chooses")
DEVCLUSTER = REPO / "etc" / "devcluster" / "devcluster"
_STEPS_ARG = re.compile(r"^--steps=(\d+)$")


# ---------------------------------------------------------------- workload (pure)

def scaled_steps(steps: int, scale: float) -> int:
    return max(1, int(round(steps * scale)))


def scale_workload(data: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """The jobs file's mapping with every job's ``work.steps`` and its command's ``--steps`` scaled alike."""
    if not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"scale must be a positive number, not {scale!r}")
    out = copy.deepcopy(dict(data))
    for job in out.get("jobs", []):
        work = job.get("work") or {}
        if "steps" in work:
            work["steps"] = scaled_steps(int(work["steps"]), scale)
        command = [str(a) for a in job.get("command", [])]
        for i, arg in enumerate(command):
            if arg == "--steps" and i + 1 < len(command):
                command[i + 1] = str(scaled_steps(int(command[i + 1]), scale))
            elif _STEPS_ARG.match(arg):
                command[i] = f"--steps={scaled_steps(int(_STEPS_ARG.match(arg).group(1)), scale)}"  # type: ignore[union-attr]
        if "command" in job:
            job["command"] = command
    return out


def write_scaled_workload(source: Path, scale: float, dest: Path) -> Path:
    data = yaml.safe_load(source.read_text())
    dest.write_text(yaml.safe_dump(scale_workload(data, scale), sort_keys=False))
    return dest


def first_type(spec: JobSpec, inventory_types: Sequence[str]) -> str:
    """The naive baseline's GPU type: the first one the job allows (any type: the cluster's first)."""
    return spec.gpus.types[0] if spec.gpus.types else inventory_types[0]


def naive_request(job_id: int, spec: JobSpec, log_dir: str, launcher: Sequence[str],
                  env: Sequence[tuple[str, str]], inventory_types: Sequence[str] = ("v100",)) -> BatchRequest:
    """One plain typed batch job: ``gpus.min`` GPUs of the first allowed type, equal shards, no plan."""
    common = Common(job_id=job_id, name=spec.name, log_dir=log_dir, time_limit_min=spec.time_limit_min,
                    extra=spec.sbatch, store_tag="bench-realcluster-naive")
    launch = Launch(program=spec.command, launcher=tuple(launcher), env=tuple(env) + spec.env)
    return BatchRequest(common, launch, first_type(spec, inventory_types), spec.gpus.min, nodes=1)


def slurm_chooses_request(job_id: int, spec: JobSpec, log_dir: str, launcher: Sequence[str],
                          env: Sequence[tuple[str, str]], inventory_types: Sequence[str],
                          node_types: Mapping[str, str]) -> Materialized:
    """One plain batch job of ``--gpus=<gpus.min>`` on one node whose feature is any allowed type; Slurm picks.

    The type is not known before the job starts, so the ranks learn it from their
    node (``SLURMHET_NODE_GPU_TYPES``), as the emulation's pacer needs it.
    """
    types = list(spec.gpus.types) or list(inventory_types)
    n = spec.gpus.min
    common = Common(job_id=job_id, name=spec.name, log_dir=log_dir, time_limit_min=spec.time_limit_min,
                    extra=spec.sbatch, store_tag="bench-realcluster-slurm-chooses")
    opts = [*common.options(), f"--gpus={n}", "--nodes=1", f"--ntasks-per-node={n}", "--constraint=" + "|".join(types)]
    node_map = ",".join(f"{node}={gpu_type}" for node, gpu_type in sorted(node_types.items()))
    script = render("batch.sh.j2", job_id=job_id, name=spec.name, gpu_type=" or ".join(types) + ", chosen by Slurm",
                    tasks=n, env=(("SLURMHET_JOB_ID", str(job_id)), ("SLURMHET_NODE_GPU_TYPES", node_map),
                                  *env, *spec.env),
                    launcher=tuple(launcher), program=spec.command, modules=spec.modules, srun_options=())
    return Materialized(tuple(opts), script)


# ---------------------------------------------------------------- measurement (pure)

@dataclass(frozen=True)
class MeasuredJob:
    """One job of an arm: its Slurm allocations and, for slurmhet, when the store took it."""

    name: str
    slurm_ids: tuple[str, ...]
    submitted_at: datetime | None = None  # None: the earliest sacct Submit of its allocations
    samples: float = 0.0  # total samples (for the overhead diagnostic); 0: unknown
    predicted_jct_s: float | None = None  # slurmhet's plan at submission (StoredJob.predicted_jct_s)


def _last_allocation(records: Sequence[AccountingRecord]) -> dict[str, int]:
    """GPUs by type of the job's last allocation (het components start together)."""
    started = [r for r in records if r.start]
    if not started:
        return {}
    last = max(r.start for r in started if r.start)
    out: dict[str, int] = {}
    for r in started:
        if r.start and (last - r.start).total_seconds() <= 5:
            for gpu_type, count in r.gpus_by_type().items():
                out[gpu_type] = out.get(gpu_type, 0) + count
    return out


def measure(jobs: Sequence[MeasuredJob], records: Sequence[AccountingRecord],
            per_gpu_rate: Mapping[tuple[str, str], float] | None = None) -> dict[str, Any]:
    """Makespan and avg JCT of one arm from sacct rows (steps ignored); times relative to the first submit.

    ``per_gpu_rate[(job name, gpu type)]`` (samples/s), with each job's ``samples``,
    gives the emulated run time of its last allocation; ``overhead_s`` is what the
    run took beyond it (process start, rendezvous, CPU contention).
    """
    rows = []
    for index, job in enumerate(jobs):
        stored = StoredJob(id=index, name=job.name, owner="", weight=1.0, predicted_jct_s=None,
                           slurm_ids=tuple(job.slurm_ids), stored_at=job.submitted_at)
        folded = fold(stored, records)
        mine = [r for r in records if not r.id.is_step and r.id.job in job.slurm_ids]
        submit = as_utc(folded.submit) if folded.submit else None
        end = as_utc(folded.end) if folded.end else None
        start = as_utc(folded.start) if folded.start else None
        gpus = _last_allocation(mine)
        ideal = None
        if per_gpu_rate is not None and job.samples and gpus:
            rate = sum(n * per_gpu_rate.get((job.name, t), 0.0) for t, n in gpus.items())
            ideal = job.samples / rate if rate > 0 else None
        last_start = max((as_utc(r.start) for r in mine if r.start), default=None)
        rows.append({"name": job.name, "state": folded.state, "slurm_ids": sorted(set(job.slurm_ids)), "gpus": gpus,
                     "submit": submit, "start": start, "end": end, "last_start": last_start, "ideal_run_s": ideal,
                     "predicted_jct_s": job.predicted_jct_s})
    submits = [r["submit"] for r in rows if r["submit"]]
    origin = min(submits) if submits else None
    done = [r for r in rows if r["end"] and r["submit"] and r["state"] == "COMPLETED"]
    ends = [r["end"] for r in rows if r["end"]]
    out_jobs = []
    for r in rows:
        def rel(t: datetime | None) -> float | None:
            return round((t - origin).total_seconds(), 1) if t and origin else None

        jct = (r["end"] - r["submit"]).total_seconds() if r["end"] and r["submit"] else None
        run_last = (r["end"] - r["last_start"]).total_seconds() if r["end"] and r["last_start"] else None
        overhead = run_last - r["ideal_run_s"] if run_last is not None and r["ideal_run_s"] is not None else None
        out_jobs.append({"name": r["name"], "state": r["state"], "gpus": r["gpus"], "submit_s": rel(r["submit"]),
                         "start_s": rel(r["start"]), "end_s": rel(r["end"]),
                         "jct_s": round(jct, 1) if jct is not None else None,
                         "emulated_run_s": round(r["ideal_run_s"], 1) if r["ideal_run_s"] is not None else None,
                         "overhead_s": round(overhead, 1) if overhead is not None else None,
                         "predicted_jct_s": r["predicted_jct_s"], "slurm_ids": r["slurm_ids"]})
    jcts = [j["jct_s"] for j in out_jobs if j["jct_s"] is not None and j["state"] == "COMPLETED"]
    overheads = [j["overhead_s"] for j in out_jobs if j["overhead_s"] is not None]
    return {
        "origin": origin,
        "makespan_s": round((max(ends) - origin).total_seconds(), 1) if ends and origin else None,
        "avg_jct_s": round(sum(jcts) / len(jcts), 1) if jcts else None,
        "completed": len(done),
        "not_completed": [j["name"] for j in out_jobs if j["state"] != "COMPLETED"],
        "mean_overhead_s": round(sum(overheads) / len(overheads), 1) if overheads else None,
        "jobs": out_jobs,
    }


def plan_error(measured: Mapping[str, Any]) -> dict[str, Any]:
    """slurmhet's own predictions (the plan's JCT per job at submission) against the measured JCTs.

    ``error_avg_jct``: |mean predicted - mean measured| / mean measured, over the
    completed jobs that have a prediction; ``mean_job_error``: the mean of each such
    job's |predicted - measured| / measured (``slurmhet report``'s plan error).
    """
    pairs = [(j["predicted_jct_s"], j["jct_s"]) for j in measured["jobs"]
             if j["state"] == "COMPLETED" and j.get("predicted_jct_s") is not None and j["jct_s"]]
    if not pairs:
        return {"jobs": 0, "avg_jct_predicted_s": None, "avg_jct_measured_s": None, "error_avg_jct": None,
                "mean_job_error": None}
    predicted = sum(p for p, _ in pairs) / len(pairs)
    actual = sum(a for _, a in pairs) / len(pairs)
    return {"jobs": len(pairs), "avg_jct_predicted_s": round(predicted, 1), "avg_jct_measured_s": round(actual, 1),
            "error_avg_jct": round(abs(predicted - actual) / actual, 4),
            "mean_job_error": round(sum(abs(p - a) / a for p, a in pairs) / len(pairs), 4)}


def arm_ratios(arms: Mapping[str, Mapping[str, Any]], of: str = "slurmhet") -> dict[str, dict[str, float | None]]:
    """``of``'s makespan and avg JCT over each other arm's (below 1: ``of`` is better); null over a missing metric."""
    out: dict[str, dict[str, float | None]] = {}
    for other, arm in arms.items():
        if other == of:
            continue
        out[f"{of}/{other}"] = {}
        for key, name in (("makespan_s", "makespan"), ("avg_jct_s", "avg_jct")):
            a, b = arms[of].get(key), arm.get(key)
            out[f"{of}/{other}"][name] = round(a / b, 4) if a is not None and b else None
    return out


# ---------------------------------------------------------------- simulator prediction (pure)

class SpecRates:
    """Per-job rates for the simulator: job type = job name; ``scale`` GPUs x the per-GPU samples/s.

    A type the job may not use has rate 0, so every policy keeps the job's
    ``gpus.types`` (the naive arm passes only the first type). Units: one worker-step
    is one sample, so a trace job's steps are its samples (steps x global batch).
    """

    def __init__(self, per_gpu: Mapping[str, Mapping[str, float]]) -> None:
        self.per_gpu = {k: dict(v) for k, v in per_gpu.items()}

    def throughput(self, job_type: str, gpu_type: str, scale: int, consolidated: bool = True) -> float:
        return scale * self.per_gpu.get(job_type, {}).get(gpu_type, 0.0)

    def job_types(self) -> set[str]:
        return set(self.per_gpu)


def table_rates(specs: Sequence[JobSpec], types: Sequence[str], table: Path = TABLE) -> dict[tuple[str, str], float]:
    """(job name, GPU type) -> the emulated per-GPU samples/s the pacer will deliver (emulation.table_rate)."""
    cache: dict[tuple[str, str], float] = {}
    out = {}
    for spec in specs:
        for gpu_type in types:
            key = (spec.workload.model, gpu_type)
            if key not in cache:
                cache[key] = emulation.table_rate(table, spec.workload.model, gpu_type)
            out[(spec.name, gpu_type)] = cache[key]
    return out


def dev_inventory(cluster: Sequence[tuple[str, str, int]] = DEV_CLUSTER) -> Inventory:
    return Inventory(tuple(Node(name, {gpu_type: count}) for name, gpu_type, count in cluster),
                     intra_node_gbps=NO_COMM_GBPS, inter_node_gbps=NO_COMM_GBPS)


def build_trace(specs: Sequence[JobSpec]) -> list[TraceJob]:
    """All jobs at t=0 in file order, ``gpus.min`` GPUs, steps = samples (steps x global batch)."""
    return [TraceJob(job_id=i, job_type=spec.name, gpus=spec.gpus.min, arrival=0.0,
                     total_steps=float(spec.total_samples), weight=spec.weight) for i, spec in enumerate(specs)]


def build_rates(specs: Sequence[JobSpec], rates: Mapping[tuple[str, str], float], types: Sequence[str],
                first_only: bool) -> SpecRates:
    per_gpu: dict[str, dict[str, float]] = {}
    for spec in specs:
        allowed = [first_type(spec, types)] if first_only else (list(spec.gpus.types) or list(types))
        per_gpu[spec.name] = {t: rates[(spec.name, t)] for t in allowed if (spec.name, t) in rates}
    return SpecRates(per_gpu)


def predict(specs: Sequence[JobSpec], rates: Mapping[tuple[str, str], float], round_s: float = 5.0,
            cluster: Sequence[tuple[str, str, int]] = DEV_CLUSTER,
            start_s: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Simulated makespan / avg JCT of both arms; ``start_s[arm]``: each job's start-up cost (``probe``).

    slurmhet arm: the shipped planner at every replan tick (``round_s``), running jobs
    pinned, as ``slurmhet replan`` does. Naive arm: the naive jobs each hold one GPU
    type and the dev cluster has one type per node, so Slurm's FIFO + backfill queues
    are independent per type (a job for t4 never delays one for v100; within a type,
    10-minute limits leave backfill nothing to slip in ahead of the head job). That is
    yarn-cs (FIFO, non-preemptive, head-of-line blocking) run on each type's node with
    that type's jobs; yarn-cs on the whole cluster would wrongly block, say, a t4 job
    behind a v100 one.
    """
    start_s = start_s or {}
    types = [t for _, t, _ in cluster]
    trace = build_trace(specs)
    contention = ContentionModel(inter_gbps=NO_COMM_GBPS, xi2=0.0)
    out: dict[str, Any] = {}
    config = SimConfig(round_s=round_s, restart_s=10.0, start_s=start_s.get("slurmhet", 0.0))
    inventory = dev_inventory(cluster)
    report = run_policies(trace, inventory, RateModel(build_rates(specs, rates, types, False), contention),
                          {"slurmhet": SlurmhetReplanned(round_s=round_s)}, config)
    m = report.metrics["slurmhet"]
    out["slurmhet"] = {"policy": f"slurmhet, decisions every {round_s:g} s, running jobs pinned",
                       "start_s": config.start_s, "makespan_s": round(m.makespan, 1),
                       "avg_jct_s": round(m.avg_jct, 1), "restarts": m.restarts}
    naive_rates = build_rates(specs, rates, types, True)
    naive_start = start_s.get("naive", 0.0)
    finishes: list[float] = []
    jct_sum = 0.0
    for node, gpu_type, count in cluster:
        mine = [(i, s) for i, s in enumerate(specs) if first_type(s, types) == gpu_type]
        if not mine:
            continue
        part = [TraceJob(j, s.name, s.gpus.min, 0.0, float(s.total_samples), s.weight) for j, (_, s) in enumerate(mine)]
        sub = simulate(part, dev_inventory([(node, gpu_type, count)]), naive_rates, ["yarn-cs"], round_s=round_s,
                       seed=0, contention=contention, start_s=naive_start).metrics["yarn-cs"]
        finishes.append(sub.makespan)
        jct_sum += sub.avg_jct * len(mine)
    whole = simulate(trace, inventory, naive_rates, ["yarn-cs"], round_s=round_s, seed=0,
                     contention=contention, start_s=naive_start).metrics["yarn-cs"]
    out["naive"] = {"policy": "yarn-cs per GPU type (first allowed type, gpus.min)", "start_s": naive_start,
                    "makespan_s": round(max(finishes), 1), "avg_jct_s": round(jct_sum / len(specs), 1),
                    "whole_cluster_yarn_cs": {"makespan_s": round(whole.makespan, 1),
                                              "avg_jct_s": round(whole.avg_jct, 1)}}
    return out


def add_errors(predicted: dict[str, Any], measured: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    for arm, pred in predicted.items():
        for key, name in (("makespan_s", "error_makespan"), ("avg_jct_s", "error_avg_jct")):
            real = (measured.get(arm) or {}).get(key)
            pred[name] = round(abs(pred[key] - real) / real, 4) if real and pred.get(key) is not None else None
    return predicted


# ---------------------------------------------------------------- the cluster arms

def _venv_bin() -> Path:
    venv = REPO / ".venv" / "bin"
    return venv if (venv / "python").exists() else Path(sys.executable).parent


def arm_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(PATH=f"{_venv_bin()}:{env.get('PATH', '/usr/bin:/bin')}", SLURMHET_STATE_DIR=str(state_dir),
               SLURMHET_THROUGHPUT_TABLE=str(TABLE), SLURMHET_EMULATE_THROUGHPUT="1")
    return env


def _cli(env: Mapping[str, str], *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(_venv_bin() / "python"), "-m", "slurmhet", *args], env=dict(env), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _log(message: str) -> None:
    print(f"[realcluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _wait_accounting(client: SlurmCli, ids: Sequence[str], timeout_s: float) -> list[AccountingRecord]:
    """sacct rows of ``ids`` once every allocation row is final (sacct lags squeue)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = client.accounting(list(ids)) if ids else []
        rows = [r for r in records if not r.id.is_step]
        seen = {r.id.job for r in rows}
        if set(ids) <= seen and all(r.state.split()[0] in FINAL for r in rows):
            return records
        if time.monotonic() > deadline:
            return records
        time.sleep(3)


def _store_jobs(env: Mapping[str, str]) -> list[tuple[str, datetime, tuple[str, ...], str, float | None]]:
    from slurmhet.config import load_settings
    from slurmhet.store import Database, list_jobs

    db = Database(load_settings(dict(env)).database_url)
    with db.transaction() as session:
        return [(j.name, j.created_at, tuple(p.slurm_job_id for p in j.slurm_jobs), j.state.value, j.predicted_jct_s)
                for j in list_jobs(session)]


def run_slurmhet_arm(spec_file: Path, state_dir: Path, samples: Mapping[str, float], replan_every_s: float,
                     timeout_s: float, client: SlurmCli) -> tuple[list[MeasuredJob], dict[str, Any]]:
    env = arm_env(state_dir)
    info: dict[str, Any] = {"replans": 0, "timed_out": False}
    start = time.monotonic()
    submitted = _cli(env, "submit", str(spec_file))
    info["submit_rc"] = submitted.returncode
    if submitted.returncode not in (0, 1):
        raise SystemExit(f"slurmhet submit failed ({submitted.returncode}): {submitted.stderr.strip()}")
    _log(f"slurmhet arm: submitted ({submitted.returncode}); replanning every {replan_every_s:g} s")
    try:
        while True:
            jobs = _store_jobs(env)
            left = [name for name, _, _, state, _ in jobs if state not in STORE_FINAL]
            if not left:
                break
            if time.monotonic() - start > timeout_s:
                info["timed_out"] = True
                _log(f"slurmhet arm: timeout with {len(left)} job(s) left: {left}")
                break
            pause = replan_every_s - (time.monotonic() - start) % replan_every_s
            time.sleep(pause)
            replanned = _cli(env, "replan", "--once")
            info["replans"] += 1
            if replanned.returncode != 0:
                _log(f"slurmhet arm: replan rc {replanned.returncode}: {replanned.stderr.strip()[-300:]}")
    finally:
        if info["timed_out"]:
            live = [i for _, _, ids, state, _ in _store_jobs(env) if state not in STORE_FINAL for i in ids]
            client.cancel(sorted(set(live)))
    info["wall_s"] = round(time.monotonic() - start, 1)
    jobs = _store_jobs(env)
    return [MeasuredJob(name, ids, created, samples.get(name, 0.0), predicted)
            for name, created, ids, _, predicted in jobs], info


def run_plain_arm(specs: Sequence[JobSpec], state_dir: Path, timeout_s: float, client: SlurmCli,
                  arm: str = "naive") -> tuple[list[MeasuredJob], dict[str, Any]]:
    """The naive or the slurm-chooses arm: one plain batch job per spec, all submitted at once, then wait."""
    env = arm_env(state_dir)
    log_dir = state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    nodes = client.nodes()
    types = [t for n in nodes for t in n.gpus]
    addrs = ",".join(f"{n.name}={n.addr}" for n in nodes if n.addr)
    job_env = [("SLURMHET_PROGRESS_DIR", str(state_dir / "progress")), ("SLURMHET_SIGNAL_LEAD_S", "120"),
               ("SLURMHET_EMULATE_THROUGHPUT", "1"), ("SLURMHET_THROUGHPUT_TABLE", str(TABLE))]
    if addrs:
        job_env.append(("SLURMHET_NODE_ADDRS", addrs))
    node_types = {n.name: next(iter(n.gpus)) for n in nodes if len(n.gpus) == 1}
    launcher = (str(_venv_bin() / "python"), "-m", "slurmhet", "run", "--")
    submitter = SlurmCli(SubprocessRunner(timeout=60, base_env=env), timeout=60)
    info: dict[str, Any] = {"timed_out": False}
    start = time.monotonic()
    ids: list[str] = []
    out: list[MeasuredJob] = []
    try:
        for index, spec in enumerate(specs, start=1):
            m = (naive_request(index, spec, str(log_dir), launcher, job_env, types).materialize() if arm == "naive"
                 else slurm_chooses_request(index, spec, str(log_dir), launcher, job_env, types, node_types))
            slurm_id = submitter.submit(m.argv, m.script)
            ids.append(slurm_id)
            out.append(MeasuredJob(spec.name, (slurm_id,), None, float(spec.total_samples)))
        _log(f"{arm} arm: {len(ids)} jobs submitted ({ids[0]}..{ids[-1]})")
        while True:
            live = [q for q in client.queue(ids) if q.state not in FINAL]
            if not live:
                break
            if time.monotonic() - start > timeout_s:
                info["timed_out"] = True
                _log(f"{arm} arm: timeout with {len(live)} job(s) left")
                break
            time.sleep(3)
    finally:
        if info["timed_out"] or len(ids) < len(specs):
            client.cancel(ids)
    info["wall_s"] = round(time.monotonic() - start, 1)
    return out, info


def write_probe_workload(source: Path, rates: Mapping[tuple[str, str], float], dest: Path,
                         seconds: float = PROBE_S) -> Path:
    """Two short copies of the workload's own jobs (its first 1-GPU and first multi-GPU job), ``seconds`` of work each.

    What they take beyond their emulated run time is the site's start-up cost per
    job: sbatch to start, python + torch import, rendezvous, teardown.
    """
    data = yaml.safe_load(source.read_text())
    specs = load_file(source)
    picks = [next(s for s in specs if s.gpus.min == 1), next(s for s in specs if s.gpus.min > 1)]
    jobs = []
    for spec in picks:
        raw = next(j for j in data["jobs"] if j.get("name") == spec.name)
        rate = spec.gpus.min * rates[(spec.name, first_type(spec, ("v100",)))]
        job = scale_workload({"jobs": [raw]}, seconds * rate / spec.total_samples)["jobs"][0]
        job["name"] = f"probe-{spec.name}"
        jobs.append(job)
    dest.write_text(yaml.safe_dump({"jobs": jobs}, sort_keys=False))
    return dest


def start_costs(measured: Mapping[str, Any]) -> list[float]:
    """Per probe job: JCT beyond its emulated run time (seconds)."""
    return [j["jct_s"] - j["emulated_run_s"] for j in measured["jobs"]
            if j["jct_s"] is not None and j["emulated_run_s"] is not None]


def run_probe(source: Path, rates: Mapping[tuple[str, str], float], work: Path, client: SlurmCli) -> dict[str, Any]:
    """Start-up cost per job (probe jobs on the idle cluster) and the wall time of one ``slurmhet replan --once``.

    ``rates`` are ``table_rates`` of the jobs in ``source``.
    """
    specs = load_file(write_probe_workload(source, rates, work / "probe.yaml"))
    probe_rates = table_rates(specs, [t for _, t, _ in DEV_CLUSTER])
    jobs, _ = run_plain_arm(specs, work / "probe", 300.0, client)
    records = _wait_accounting(client, sorted({i for j in jobs for i in j.slurm_ids}), 120)
    measured = measure(jobs, records, probe_rates)
    costs = start_costs(measured)
    began = time.monotonic()
    replanned = _cli(arm_env(work / "probe-replan"), "replan", "--once")
    replan_s = time.monotonic() - began
    if not costs or replanned.returncode != 0:
        raise RuntimeError(f"probe failed: {measured['not_completed']} not completed, replan rc "
                           f"{replanned.returncode}: {replanned.stderr.strip()[-300:]}")
    return {"start_s": round(sum(costs) / len(costs), 1), "replan_s": round(replan_s, 1),
            "jobs": [{k: j[k] for k in ("name", "gpus", "jct_s", "emulated_run_s")} for j in measured["jobs"]]}


def _wait_idle(client: SlurmCli, timeout_s: float) -> int:
    """Wait until no Slurm job is pending or running (others' tests share the cluster); returns how many are left."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = [q for q in client.queue() if q.state not in FINAL]
        if not busy or time.monotonic() > deadline:
            return len(busy)
        time.sleep(5)


def foreign_usage(records: Sequence[AccountingRecord], ours: set[str], start: datetime,
                  end: datetime) -> dict[str, float]:
    """Other users' jobs inside an arm's window: how many, and the GPU-seconds they held there."""
    jobs, gpu_s = set(), 0.0
    for r in records:
        if r.id.is_step or r.id.job in ours or not r.start:
            continue
        overlap = (min(as_utc(r.end or end), end) - max(as_utc(r.start), start)).total_seconds()
        if overlap > 0:
            jobs.add(r.id.job)
            gpu_s += overlap * sum(r.gpus_by_type().values())
    return {"jobs": len(jobs), "gpu_s": round(gpu_s, 1)}


def _foreign(client: SlurmCli, arm: Mapping[str, Any], began: datetime, ours: set[str]) -> dict[str, float] | None:
    """foreign_usage over the arm's window (first submit .. last end), read from sacct."""
    times = [t for j in arm["jobs"] for t in (j["submit_s"], j["end_s"]) if t is not None]
    origin = arm.get("origin")
    if not times or origin is None:
        return None
    try:
        records = client.accounting(None, since=began)
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None
    return foreign_usage(records, ours, origin, origin + timedelta(seconds=max(times)))


@dataclass(frozen=True)
class Background:
    """Other users' jobs during an arm: ``devcluster noise`` with these settings (etc/devcluster/README.md)."""

    rate_per_min: float = 2.0
    seed: int = 1
    max_queued: int = 8
    #: Seconds between starting the noise and the arm's first submit, so foreign jobs already hold GPUs.
    warmup_s: float = 30.0

    def start_argv(self) -> list[str]:
        return [str(DEVCLUSTER), "noise", "start", "--rate", f"{self.rate_per_min:g}", "--seed", str(self.seed),
                "--max-queued", str(self.max_queued)]


def _devcluster(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=330, check=False)


@contextmanager
def background_load(load: Background | None) -> Iterator[None]:
    """Noise on (and warmed up) for the body, then off with its jobs cancelled, so the next arm starts quiet."""
    if load is None:
        yield
        return
    started = _devcluster(load.start_argv())
    if started.returncode != 0:
        raise SystemExit(f"devcluster noise start failed ({started.returncode}): {started.stderr.strip()}")
    try:
        time.sleep(load.warmup_s)
        yield
    finally:
        _devcluster([str(DEVCLUSTER), "noise", "stop", "--cancel"])


def run_arms(spec_file: Path, specs: Sequence[JobSpec], rates: Mapping[tuple[str, str], float], work: Path,
             replan_every_s: float, timeout_s: float, client: SlurmCli, load: Background | None,
             busy_before: dict[str, int]) -> tuple[dict[str, Any], set[str]]:
    """The three arms one after the other, each on a cluster left idle by the previous one; measured from sacct."""
    samples = {s.name: float(s.total_samples) for s in specs}
    label = "background" if load else "quiet"
    arms: dict[str, Any] = {}
    ours: set[str] = set()
    for arm in ARMS:
        busy_before[f"{label}/{arm}"] = _wait_idle(client, IDLE_WAIT_S)
        with background_load(load):
            if arm == "slurmhet":
                jobs, info = run_slurmhet_arm(spec_file, work / label / arm, samples, replan_every_s, timeout_s, client)
            else:
                jobs, info = run_plain_arm(specs, work / label / arm, timeout_s, client, arm)
        ids = {i for j in jobs for i in j.slurm_ids}
        ours |= ids
        records = _wait_accounting(client, sorted(ids), 120)
        arms[arm] = {**measure(jobs, records, rates), **info}
        _log(f"{label} {arm} arm: makespan {arms[arm]['makespan_s']} s, avg JCT {arms[arm]['avg_jct_s']} s")
    return arms, ours


def run(scale: float = 1.0, replan_every_s: float = 5.0, background: Background | None = None) -> dict[str, Any]:
    """The three arms on the live dev cluster (and again under ``background`` load), and the simulator's prediction.

    ``summary[load]``: per arm makespan and avg JCT, slurmhet's ratios over the other
    arms, slurmhet's plan-versus-actual error and the simulator's error, for the load
    ``quiet`` and, with ``background``, ``background``; ``arms[load][arm]``: every job.
    """
    client = SlurmCli(SubprocessRunner(timeout=60), timeout=60)
    if background is not None and _devcluster([str(DEVCLUSTER), "noise", "status"]).returncode == 0:
        raise SystemExit("a devcluster noise loop is already running (someone else's?): the background arms "
                         "need their own; `etc/devcluster/devcluster noise status`")
    work = Path(tempfile.mkdtemp(prefix="slurmhet-bench-realcluster-"))
    os.chmod(work, 0o755)
    spec_file = write_scaled_workload(WORKLOAD, scale, work / "jobs.yaml")
    specs = load_file(spec_file)
    types = [t for _, t, _ in DEV_CLUSTER]
    rates = table_rates(specs, types)
    notes: list[str] = []
    timeout_s = 600.0 + 1500.0 * scale
    began = datetime.now(timezone.utc)
    _log(f"workload {spec_file} (scale {scale:g}); work dir {work}")
    busy_before: dict[str, int] = {"probe": _wait_idle(client, IDLE_WAIT_S)}
    probe = run_probe(spec_file, rates, work, client)
    _log(f"probe: start-up {probe['start_s']} s per job, one replan {probe['replan_s']} s")
    try:  # predicted before the arms run, from the probe alone
        predicted = predict(specs, rates, round_s=replan_every_s,
                            start_s={"naive": probe["start_s"], "slurmhet": probe["start_s"] + probe["replan_s"]})
    except Exception as exc:  # noqa: BLE001 - the cluster runs are still worth reporting
        predicted = {}
        notes.append(f"simulator failed: {type(exc).__name__}: {exc}")
    loads: dict[str, dict[str, Any]] = {}
    ours: set[str] = set()
    for label, load in (("quiet", None), ("background", background)):
        if label == "background" and load is None:
            continue
        loads[label], mine = run_arms(spec_file, specs, rates, work, replan_every_s, timeout_s, client, load,
                                      busy_before)
        ours |= mine
    foreign_notes = []
    summary: dict[str, Any] = {}
    for label, arms in loads.items():
        for name, arm in arms.items():
            arm["foreign"] = _foreign(client, arm, began, ours)
            arm.pop("origin", None)
            if arm["foreign"] and arm["foreign"]["jobs"] and label == "quiet":
                foreign_notes.append(f"quiet {name} arm: {arm['foreign']['jobs']} other Slurm job(s) ran on the shared "
                                     f"cluster inside its window, holding {arm['foreign']['gpu_s']:.0f} GPU-seconds; "
                                     "they competed for GPUs and CPU")
            if arm.get("timed_out"):
                notes.append(f"the {label} {name} arm hit its timeout; its unfinished jobs were cancelled and are "
                             "left out of avg JCT")
        measured = {k: {"makespan_s": v["makespan_s"], "avg_jct_s": v["avg_jct_s"]} for k, v in arms.items()}
        summary[label] = {
            "arms": measured, "ratios": arm_ratios(measured), "plan_error": plan_error(arms["slurmhet"]),
            "simulator_error": {arm: {k: v for k, v in pred.items() if k.startswith("error_")}
                                for arm, pred in add_errors(copy.deepcopy(predicted), measured).items()}}

    notes += [
        "GPU speed is EMULATED (SLURMHET_EMULATE_THROUGHPUT=1): every rank sleeps to deliver its GPU type's "
        "samples/s from etc/throughput/devcluster.yaml; the 'GPUs' are fake devices on one CPU-only host.",
        "The host has 2 CPU cores shared with other engineers' work: process start-up (python + torch import), "
        "gloo rendezvous, the slurmhet CLI itself and CPU contention make measured times longer than the "
        "emulated rates predict (see each arm's mean_overhead_s: run time beyond the emulated time).",
        "slurm-chooses arm: each job one batch job of --gpus=<gpus.min> on one node with "
        "--constraint=<allowed types joined by |>, all submitted at once; Slurm picks the type (its ranks learn "
        "it from SLURMHET_NODE_GPU_TYPES). Not simulated.",
        "plan_error: slurmhet's predicted JCT per job, stored by `slurmhet submit` (not updated by replans), "
        "against the measured JCT from the job's store time.",
        "Simulator (predicted before the arms run): same jobs at t=0, gpus = gpus.min, steps = samples "
        "(steps x global batch), per-GPU rates from the table, n GPUs = n x per-GPU rate, communication ~ 0; "
        "every job's first start costs the probe's start-up (naive) or start-up + one replan (slurmhet). It "
        "knows nothing of background load: its error under 'background' is what other users' jobs cost.",
        "Simulated slurmhet arm: the shipped planner at every replan tick with running jobs pinned, each job "
        "restricted to its gpus.types. Not modelled: MPS packs (the live planner co-locates the coloc-* jobs, "
        "each member at its share of the GPU; the simulator gives each its own GPU), gpus.max (the live "
        "planner may give more than gpus.min), and the per-step CPU cost of many ranks on the 2-core host "
        "(collectives wait for descheduled ranks), which grows with the number of ranks running at once.",
        "Simulated naive arm: yarn-cs (FIFO, non-preemptive, head-of-line blocking) on each GPU type separately "
        "with the jobs whose first type it is; Slurm's per-type queues are independent because each naive job "
        "holds one type and each node one type (whole_cluster_yarn_cs: yarn-cs blocking across types, for "
        "reference).",
    ] + foreign_notes
    if background is not None:
        notes.append(f"background: `devcluster noise` at {background.rate_per_min:g} job(s)/min, seed "
                     f"{background.seed} for every arm, at most {background.max_queued} pending, started "
                     f"{background.warmup_s:g} s before each arm's first submit and stopped (its jobs cancelled) "
                     "after the arm; each arm's 'foreign' counts those jobs and any others inside its window.")
    for arm, busy in busy_before.items():
        if busy:
            notes.append(f"{busy} other job(s) still held or waited for GPUs when the {arm} arm started "
                         f"(waited {IDLE_WAIT_S:g} s for an idle cluster)")
    return {
        "workload": str(WORKLOAD.relative_to(REPO)),
        "probe": probe,
        "scale": scale,
        "replan_every_s": replan_every_s,
        "background": None if background is None else {
            "rate_per_min": background.rate_per_min, "seed": background.seed, "max_queued": background.max_queued,
            "warmup_s": background.warmup_s},
        "summary": summary,
        "arms": loads,
        "simulator": predicted,
        "notes": notes,
        "work_dir": str(work),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every job's steps (0.3: ~3 min per arm)")
    parser.add_argument("--replan-every", type=float, default=5.0, help="seconds between `slurmhet replan --once`")
    parser.add_argument("--background", action="store_true",
                        help="run every arm again with `devcluster noise` on (needs root)")
    parser.add_argument("--noise-rate", type=float, default=2.0, help="background jobs per minute")
    parser.add_argument("--noise-seed", type=int, default=1, help="background seed, the same for every arm")
    parser.add_argument("--json", action="store_true", help="one JSON object (the default output is JSON too)")
    args = parser.parse_args()
    if not args.scale > 0:
        parser.error("--scale must be positive")
    if not args.noise_rate > 0:
        parser.error("--noise-rate must be positive")
    load = Background(args.noise_rate, args.noise_seed) if args.background else None
    print(json.dumps(run(args.scale, args.replan_every, load), indent=1, default=str))


if __name__ == "__main__":
    main()
