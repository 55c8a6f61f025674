"""``slurmhet bench chaos``: a mixed workload on the dev cluster while a seeded injector breaks things, then the
promise of issue 17 checked: no job lost, none run twice at once, a fault costs at most a checkpoint interval.

The workload (examples/train.py, emulated GPU speed, ``--checkpoint-every``) mixes single-type jobs, a het job
that needs GPUs of two nodes, a forked local-SGD job and co-locatable small jobs (MPS packs when the plan packs
them). Jobs arrive over the first half of the run; ``slurmhet replan --once`` runs every 10 s, as cron would.
Until 70 % of the run the injector (``random.Random(seed)``) sets a node DOWN and drained then back, restarts
slurmd and slurmctld (``devcluster restart``), stops and starts PostgreSQL (``pgcluster down``/``start``; the
store is a private database on it) and SIGKILLs ``replan`` and ``submit`` at random moments. A job whose killed
``submit`` left no record is submitted again, by name, as its user would. After the last fault the run waits
for every job to end (at most the run's length again).

Invariants, from the store, sacct (``--duplicates``: every run, requeued ones too) and the progress records
sampled every second:

* ``all_completed``: every workload job is in the store exactly once, COMPLETED;
* ``no_orphan_slurm_jobs``: every Slurm job carrying this store's comment tag is recorded in it;
* ``no_record_without_slurm_job``: every recorded Slurm job is known to sacct;
* ``no_overlapping_runs``: no two runs of one job (batch, het, pack or requeued run of one, forked round)
  held GPUs at once; a round's copies run together by design, its consolidation trains nothing;
* ``progress_lost_within_checkpoint``: per job, the steps a fault took back (the best progress seen before a
  run started minus the step it resumed at; a forked round's copies' total minus what its consolidation kept)
  are at most the job's checkpoint interval; ``worst_progress_lost_s`` converts the worst into seconds at the
  job's own pace.

Run: ``slurmhet bench chaos --minutes 30 --seed 1 --json`` (root, the dev cluster and
``etc/devcluster/pgcluster up``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from slurmhet.runtime.progress import ProgressRecord, is_consolidation, job_steps, read_progress

REPO = Path(__file__).resolve().parent.parent
DEVCLUSTER = REPO / "etc" / "devcluster" / "devcluster"
PGCLUSTER = REPO / "etc" / "devcluster" / "pgcluster"
TRAIN = REPO / "examples" / "train.py"
TABLE = REPO / "etc" / "throughput" / "devcluster.yaml"
NODES = ("nodea", "nodeb", "nodec")
#: Seconds between two replans, as cron would run them.
REPLAN_EVERY_S = 10.0
#: Faults stop at this share of the run; the rest lets the workload finish.
FAULT_SHARE = 0.7
#: Steps between two checkpoints of every workload job.
CHECKPOINT_EVERY = 10
KINDS = ("node_down", "slurmd_restart", "slurmctld_restart", "postgres_restart", "kill_replan", "kill_submit")
STORE_FINAL = ("COMPLETED", "FAILED", "CANCELLED")


# --------------------------------------------------------------------------- the plan of the run (pure)


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    node: str = ""
    hold_s: float = 0.0  # how long the node or daemon stays down; for a kill, how long before the SIGKILL


@dataclass(frozen=True)
class WorkloadJob:
    name: str
    arrive_s: float
    spec: str  # the YAML of one job
    checkpoint_every: int


def fault_schedule(seed: int, minutes: float) -> list[Fault]:
    """Faults at Poisson times (every 25 s on average, denser in a short run so that each kind comes once)
    until FAULT_SHARE of the run, each kind in turn first, then at random."""
    rng = random.Random(seed)
    end, at, out = minutes * 60 * FAULT_SHARE, 15.0, []
    mean_gap_s = min(25.0, end / (2 * len(KINDS)))
    kinds = list(KINDS)
    rng.shuffle(kinds)
    while at < end:
        kind = kinds.pop() if kinds else rng.choice(KINDS)
        hold = {"node_down": rng.uniform(20, 45), "slurmd_restart": rng.uniform(3, 15),
                "slurmctld_restart": rng.uniform(3, 12), "postgres_restart": rng.uniform(3, 12),
                "kill_replan": rng.uniform(0.05, 3.0), "kill_submit": rng.uniform(0.05, 2.0)}[kind]
        out.append(Fault(round(at, 1), kind, rng.choice(NODES) if kind in ("node_down", "slurmd_restart") else "",
                         round(hold, 2)))
        at += rng.expovariate(1.0 / mean_gap_s) + hold
    return out


def _job(name: str, steps: int, gpus: str, checkpoint_root: Path, time_limit: int, extra: str = "",
         python: str = sys.executable) -> WorkloadJob:
    """One job of examples/train.py that checkpoints every CHECKPOINT_EVERY steps into its own directory."""
    command = [python, str(TRAIN), "--steps", str(steps), "--global-batch", "64", "--dataset-size", "1024",
               "--checkpoint-every", str(CHECKPOINT_EVERY)]
    spec = textwrap.dedent(f"""\
        name: {name}
        command: {json.dumps(command)}
        workload: {{model: mlp-small, batch_size: 64}}
        global_batch: 64
        model_size_mb: 0.01
        work: {{steps: {steps}}}
        gpus: {gpus}
        checkpoint_dir: {json.dumps(str(checkpoint_root / name))}
        time_limit: {time_limit}
        """) + extra
    return WorkloadJob(name, 0.0, spec, CHECKPOINT_EVERY)


def workload(seed: int, minutes: float, checkpoint_root: Path) -> list[WorkloadJob]:
    """A mixed workload that an undisturbed dev cluster finishes in about a third of the run."""
    rng = random.Random(seed + 1)
    scale = max(1.0, minutes / 5)  # a longer run: more jobs, not longer ones
    kinds = ["single"] * round(3 * scale) + ["het"] * round(scale) + ["forked"] * round(scale) \
        + ["colocate"] * round(2 * scale)
    rng.shuffle(kinds)
    jobs = []
    for i, kind in enumerate(kinds):
        steps = {"single": 240, "het": 160, "forked": 1600, "colocate": 160}[kind]
        gpus = {"single": f"{{min: 1, max: 2, types: [{rng.choice(['v100', 't4', 'k80'])}, t4]}}",
                "het": "{min: 6, max: 6, types: [v100, t4, k80]}", "forked": "{min: 1, max: 1}",
                "colocate": "{min: 1, max: 1}"}[kind]
        extra = {"forked": "sync: local-sgd\n", "colocate": "colocate: true\n"}.get(kind, "")
        job = _job(f"chaos-{i:02d}-{kind}", steps, gpus, checkpoint_root, max(10, round(minutes * 2)), extra)
        jobs.append(replace(job, arrive_s=round(rng.uniform(0, minutes * 60 * 0.5), 1)))
    return sorted(jobs, key=lambda j: j.arrive_s)


def extra_job(index: int, checkpoint_root: Path) -> WorkloadJob:
    """A small single-type job for a SIGKILLed submit once the workload has all arrived."""
    return _job(f"chaos-{index:02d}-extra", 120, "{min: 1, max: 1}", checkpoint_root, 30)


# --------------------------------------------------------------------------- invariants (pure)


@dataclass(frozen=True)
class Run:
    """One run of a Slurm job as ``sacct --duplicates`` tells it (a requeued job has one per run)."""

    slurm_id: str  # the job id, an array's task as A_k
    role: str
    start: float | None
    end: float | None
    round: int = 0  # a forked copy's round (its copies on several GPU types are several arrays)


def overlapping(runs: Sequence[Run]) -> list[tuple[str, str]]:
    """Pairs of runs of one job that held GPUs at once. A forked round's copies (an array per GPU type) run
    together by design and count as one run; a consolidation trains nothing."""
    units: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        if r.role == "consolidation" or r.start is None:
            continue
        unit = f"round {r.round}" if r.role == "array" else r.slurm_id
        units.setdefault(unit, []).append((r.start, r.end if r.end is not None else float("inf")))
    spans = sorted((s, e, u) for u, pieces in units.items() for s, e in _merged(pieces))
    out = []
    for i, (start, end, unit) in enumerate(spans):
        for other_start, _, other in spans[i + 1:]:
            if other_start >= end:
                break
            out.append((unit, other))
    return out


def _merged(pieces: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """One unit's runs as spans: an array's tasks overlap and merge; a requeued job's runs follow each other
    (Slurm never runs one id twice at once)."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(pieces):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@dataclass
class ProgressLog:
    """Every (job, Slurm job, rank, start step) record seen, at its furthest; a requeued run under one Slurm
    id overwrites its file, so the runs are told apart by the step they started at, and sampled often."""

    seen: dict[tuple[str, str, int, int], ProgressRecord] = field(default_factory=dict)
    first_seen: dict[tuple[str, str, int, int], float] = field(default_factory=dict)

    def sample(self, records: Sequence[ProgressRecord], now: float) -> None:
        for r in records:
            key = (r.job_id, r.slurm_job_id, r.rank, r.start_steps)
            if key not in self.seen or r.steps_done >= self.seen[key].steps_done:
                self.seen[key] = r
            self.first_seen.setdefault(key, now)

    def records(self, before: float | None = None, skip: Callable[[ProgressRecord], bool] = lambda r: False
                ) -> list[ProgressRecord]:
        """The records as job_steps wants them: each run its own ``slurm_job_id``."""
        return [ProgressRecord(**{**r.__dict__, "slurm_job_id": f"{k[1]}@{k[3]}"}) for k, r in self.seen.items()
                if (before is None or self.first_seen[k] < before) and not skip(r)]

    def lost_steps(self, job_id: str) -> int:
        """The most steps a fault took back from the job (0 when none)."""
        worst = 0
        mine = {k: r for k, r in self.seen.items() if k[0] == job_id}
        for key, r in mine.items():
            at = self.first_seen[key]
            if is_consolidation(r):  # what the round's copies reached vs what the average kept
                before = job_steps([x for x in self.records(at) if x.job_id == job_id
                                    and not is_consolidation(x)]).get(job_id, 0)
                worst = max(worst, before - r.steps_done)
            else:  # a run resumed at start_steps: what had been reached before it started
                before = job_steps([x for x in self.records(at) if x.job_id == job_id
                                    and x.start_steps < r.start_steps]).get(job_id, 0)
                worst = max(worst, before - r.start_steps)
        return worst

    def pace_s_per_step(self, job_id: str) -> float:
        """Seconds per step of the job's fastest run (what a lost step costs again at the least)."""
        paces = [(r.updated_at - r.started_at) / (r.steps_done - r.start_steps) for k, r in self.seen.items()
                 if k[0] == job_id and r.started_at and r.steps_done > r.start_steps and r.gpu_type is not None]
        return min(paces) if paces else 0.0


def invariants(names: Sequence[str], stored: Sequence[Mapping[str, Any]], tagged: set[str], known: set[str],
               recorded: set[str], runs: Mapping[int, Sequence[Run]], lost: Mapping[int, int],
               checkpoint_every: Mapping[int, int]) -> dict[str, bool]:
    """The promise, from what the store, Slurm and the progress records say (see the module's docstring)."""
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for row in stored:
        by_name.setdefault(row["name"], []).append(row)
    return {
        "all_completed": all(len(by_name.get(n, [])) == 1 and by_name[n][0]["state"] == "COMPLETED" for n in names),
        "no_orphan_slurm_jobs": tagged <= recorded,
        "no_record_without_slurm_job": recorded <= known,
        "no_overlapping_runs": not any(overlapping(r) for r in runs.values()),
        "progress_lost_within_checkpoint": all(lost[j] <= checkpoint_every[j] for j in lost),
    }


# --------------------------------------------------------------------------- the live run


class Chaos:
    """The run's state directory, store, clock and the commands it runs (all through argv lists)."""

    def __init__(self, root: Path, db_url: str, minutes: float, seed: int) -> None:
        self.root, self.db_url, self.minutes, self.seed = root, db_url, minutes, seed
        self.state = root / "state"
        self.env = {**os.environ, "SLURMHET_STATE_DIR": str(self.state), "SLURMHET_DB": db_url,
                    "SLURMHET_THROUGHPUT_TABLE": str(TABLE), "SLURMHET_EMULATE_THROUGHPUT": "1",
                    "SLURMHET_FORK_ROUND_S": "20", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        self.t0 = time.monotonic()
        self.counts: dict[str, int] = {k: 0 for k in KINDS}
        self.notes: list[str] = []
        self.progress = ProgressLog()
        self._threads: list[threading.Thread] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def slurmhet(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "slurmhet", *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    def killed_slurmhet(self, args: Sequence[str], after_s: float) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "slurmhet", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=self.env)
        try:
            proc.wait(timeout=after_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def background(self, what: Callable[[], None]) -> None:
        thread = threading.Thread(target=what, daemon=True)
        thread.start()
        self._threads.append(thread)

    def busy(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def settle(self) -> None:
        for thread in self._threads:
            thread.join()

    def inject(self, fault: Fault, submit_next: Callable[[float], bool]) -> None:
        """Start the fault (a node or daemon comes back in a background thread); counted when it happened."""
        if fault.kind == "kill_submit":  # the next job to arrive comes now, under a SIGKILL
            self.counts[fault.kind] += submit_next(fault.hold_s)
            return
        self.counts[fault.kind] += 1
        if fault.kind == "kill_replan":
            self.killed_slurmhet(["replan", "--once"], fault.hold_s)
        elif fault.kind == "node_down":
            def down_and_back() -> None:
                _run(["scontrol", "update", f"nodename={fault.node}", "state=down", "reason=slurmhet chaos"])
                _run(["scontrol", "update", f"nodename={fault.node}", "state=drain", "reason=slurmhet chaos"])
                time.sleep(fault.hold_s)
                _run(["scontrol", "update", f"nodename={fault.node}", "state=resume"])
            self.background(down_and_back)
        elif fault.kind == "slurmd_restart":
            self.background(lambda: _run([str(DEVCLUSTER), "restart", f"slurmd:{fault.node}", "--down-s",
                                          str(round(fault.hold_s))], timeout=300))
        elif fault.kind == "slurmctld_restart":
            self.background(lambda: _run([str(DEVCLUSTER), "restart", "slurmctld", "--down-s",
                                          str(round(fault.hold_s))], timeout=300))
        elif fault.kind == "postgres_restart":
            def pg_down_and_up() -> None:
                _run([str(PGCLUSTER), "down"], timeout=120)
                time.sleep(fault.hold_s)
                _run([str(PGCLUSTER), "start"], timeout=120)
            self.background(pg_down_and_up)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")


def _run(argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def _checked(argv: Sequence[str]) -> str:
    """stdout of a query the verdict depends on: its failure must not read as an empty answer."""
    proc = _run(argv, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _stored(chaos: Chaos) -> list[dict[str, Any]]:
    out = chaos.slurmhet("status", "--json")
    if out.returncode != 0:
        raise RuntimeError(f"slurmhet status failed: {out.stderr.strip()}")
    return json.loads(out.stdout)["jobs"]


def _sacct_runs(ids: Sequence[str]) -> list[dict[str, str]]:
    """Every run (``--duplicates``) of these Slurm jobs, allocations only."""
    if not ids:
        return []
    out = _checked(["sacct", "-D", "-X", "-n", "-P", "-j", ",".join(ids), "-o", "JobID,State,Start,End,Comment"])
    rows = []
    for line in out.splitlines():
        job_id, state, start, end, comment = (line.split("|") + [""] * 5)[:5]
        rows.append({"id": job_id, "state": state, "start": start, "end": end, "comment": comment})
    return rows


def _base(slurm_id: str) -> str:
    """The job id of an array task (A_k) or a het component (A+k)."""
    return slurm_id.split("_")[0].split("+")[0]


def _epoch(text: str) -> float | None:
    from datetime import datetime

    if not text or text in ("Unknown", "None"):
        return None
    return datetime.fromisoformat(text).timestamp()


def _tagged_since(tag: str, since: str) -> set[str]:
    out = _checked(["sacct", "-X", "-n", "-P", "--allusers", "--starttime", since, "-o", "JobID,Comment"])
    return {_base(line.split("|")[0]) for line in out.splitlines()
            if line.split("|")[-1].endswith(f"@{tag}")}


def run(minutes: float, seed: int, pg_url: str | None = None) -> dict[str, Any]:
    """One chaos run on the live dev cluster; returns the JSON document (see the module's docstring)."""
    import psycopg

    pg_url = pg_url or _run([str(PGCLUSTER), "url"]).stdout.strip()
    admin = pg_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"slurmhet_chaos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    root = Path(tempfile.mkdtemp(prefix=f"slurmhet-chaos-{seed}-"))
    chaos = Chaos(root, pg_url.rsplit("/", 1)[0] + "/" + name, minutes, seed)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    jobs = workload(seed, minutes, root / "ckpt")
    faults = fault_schedule(seed, minutes)
    arrivals, pending_faults = list(jobs), list(faults)
    unsure: list[WorkloadJob] = []  # submitted under a SIGKILL: stored or not, the store will say
    try:
        def submit(job: WorkloadJob, kill_after: float | None = None) -> None:
            path = root / f"{job.name}.yaml"
            path.write_text(job.spec)
            if kill_after is None:
                out = chaos.slurmhet("submit", str(path))
                if out.returncode != 0:  # the store or Slurm down: the user tries again later
                    chaos.notes.append(f"{job.name}: submit exited {out.returncode}: {out.stderr.strip()[:200]}")
                    unsure.append(job)
            else:
                chaos.killed_slurmhet(["submit", str(path)], kill_after)
                unsure.append(job)

        def submit_next(kill_after: float) -> bool:
            """The next job to arrive comes now; when all have, one more small one joins the workload."""
            job = arrivals.pop(0) if arrivals else extra_job(len(jobs), root / "ckpt")
            if job not in jobs:
                jobs.append(job)
            submit(job, kill_after)
            return True

        next_replan, deadline = 0.0, minutes * 60 * 2
        while True:
            now = chaos.now()
            while arrivals and arrivals[0].arrive_s <= now:
                submit(arrivals.pop(0))
            while pending_faults and pending_faults[0].at_s <= now:
                chaos.inject(pending_faults.pop(0), submit_next)
            if now >= next_replan:
                chaos.slurmhet("replan", "--once")  # exit 1 while a daemon is down: cron tries again
                next_replan = now + REPLAN_EVERY_S
                if unsure and not chaos.busy():
                    try:
                        names = {r["name"] for r in _stored(chaos)}
                    except RuntimeError:
                        names = None
                    if names is not None:
                        retry, unsure[:] = [j for j in unsure if j.name not in names], []
                        for job in retry:
                            submit(job)
            chaos.progress.sample(read_progress(chaos.state / "progress"), now)
            if now >= minutes * 60 and not arrivals and not pending_faults and not unsure and not chaos.busy():
                try:
                    if all(r["state"] in STORE_FINAL for r in _stored(chaos)):
                        break
                except RuntimeError:
                    pass
            if now >= deadline:
                chaos.notes.append(f"not every job ended within {deadline:.0f} s")
                break
            time.sleep(1.0)
        chaos.settle()
        return _result(chaos, jobs, faults, started)
    finally:
        chaos.settle()
        for node in NODES:  # whatever the run left drained comes back
            _run(["scontrol", "update", f"nodename={node}", "state=resume"])
        if _run([str(PGCLUSTER), "status"]).returncode != 0:
            _run([str(PGCLUSTER), "start"], timeout=120)
        live = _run(["squeue", "-h", "-o", "%i|%k"]).stdout
        tag = _store_tag(chaos)
        ids = [line.split("|")[0] for line in live.splitlines() if tag and line.endswith(f"@{tag}")]
        if ids:
            _run(["scancel", *ids])
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _store_tag(chaos: Chaos) -> str:
    import psycopg

    try:
        with psycopg.connect(chaos.db_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            row = conn.execute("SELECT value FROM store_meta WHERE key = 'instance'").fetchone()
        return str(row[0]) if row else ""
    except psycopg.Error:
        return ""


def _result(chaos: Chaos, jobs: Sequence[WorkloadJob], faults: Sequence[Fault], started: str) -> dict[str, Any]:
    stored = _stored(chaos)
    recorded = {p["id"] for row in stored for p in row["slurm"]}
    sacct = _sacct_runs(sorted(recorded, key=int))
    known = {_base(r["id"]) for r in sacct}
    roles = {(row["id"], p["id"]): (p["role"], p.get("round") or 0) for row in stored for p in row["slurm"]}
    runs: dict[int, list[Run]] = {}
    for row in stored:
        ids = {p["id"] for p in row["slurm"]}
        # A het job's run is its first component's row (the components start and end together).
        runs[row["id"]] = [Run(r["id"].removesuffix("+0"), *roles[(row["id"], _base(r["id"]))][:1],
                               _epoch(r["start"]), _epoch(r["end"]), roles[(row["id"], _base(r["id"]))][1])
                           for r in sacct if _base(r["id"]) in ids and ("+" not in r["id"] or r["id"].endswith("+0"))]
    lost = {row["id"]: chaos.progress.lost_steps(str(row["id"])) for row in stored}
    every = {row["id"]: CHECKPOINT_EVERY for row in stored}
    held = invariants([j.name for j in jobs], stored, _tagged_since(_store_tag(chaos), started), known,
                      recorded, runs, lost, every)
    overlaps = {i: pairs for i, r in runs.items() if (pairs := overlapping(r))}
    worst = max(((lost[i] * chaos.progress.pace_s_per_step(str(i)), i) for i in lost), default=(0.0, None))
    return {
        "minutes": chaos.minutes, "seed": chaos.seed, "elapsed_s": round(chaos.now(), 1),
        "faults": {k: v for k, v in chaos.counts.items()},
        "faults_planned": len(faults),
        "jobs": {"workload": len(jobs), "stored": len(stored),
                 "by_state": {s: sum(1 for r in stored if r["state"] == s) for s in sorted({r["state"] for r in stored})},
                 "slurm_jobs": len(recorded), "restarts": sum(r.get("restarts", 0) for r in stored)},
        "invariants": held,
        "overlapping_runs": {str(i): pairs for i, pairs in overlaps.items()},
        "not_completed": [{"id": r["id"], "name": r["name"], "state": r["state"], "reason": r["reason"]}
                          for r in stored if r["state"] != "COMPLETED"],
        "progress_lost_steps": {str(i): n for i, n in lost.items() if n},
        "worst_progress_lost_steps": max(lost.values(), default=0),
        "worst_progress_lost_s": round(worst[0], 1),
        "checkpoint_every_steps": CHECKPOINT_EVERY,
        "notes": chaos.notes[-20:],
        "state_dir": str(chaos.state),
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.minutes, args.seed), indent=2))
