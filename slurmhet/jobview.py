"""One job in full, for `slurmhet status ID` (pure: from the stored job, its events, logs and speeds).

Everything a researcher asks about one job in one place: what was asked, what
the plan said and on what speeds (measured or prior), which Slurm jobs ran it,
where, in what state and why, what was predicted against what happened, and
where its output is.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from slurmhet.emit.requests import option_value
from slurmhet.joblogs import LogPart
from slurmhet.spec import JobSpec
from slurmhet.sync import restarts
from slurmhet.throughput import ThroughputEntry


def _iso(at: datetime | None) -> str | None:
    return at.astimezone().isoformat(timespec="seconds") if at is not None else None


def _stamp(seconds: float | None) -> str | None:
    return datetime.fromtimestamp(seconds, timezone.utc).astimezone().isoformat(timespec="seconds") \
        if seconds is not None else None


def job_detail(job: Any, spec: JobSpec, events: Sequence[Any], logs: Sequence[LogPart],
               speeds: Mapping[str, ThroughputEntry], waiting: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form of one job; ``job`` is a stored Job with its Slurm parts loaded."""
    plan = job.plan or {}
    work = {"steps": spec.steps} if spec.steps is not None else {"epochs": spec.epochs,
                                                                 "dataset_size": spec.dataset_size}
    actual = (job.ended_at - job.created_at).total_seconds() if job.ended_at else None
    return {
        "id": job.id, "name": job.name, "owner": job.owner, "state": job.state.value, "reason": job.reason,
        "source": job.source, "attempts": job.attempts, "restarts": restarts(job),
        "spec": {"workload": spec.workload.key, "work": work, "global_batch": spec.global_batch, "sync": spec.sync,
                 "gpus": {"min": spec.gpus.min, "max": spec.gpus.max, "types": list(spec.gpus.types)},
                 "command": list(spec.command) or None, "entrypoint": spec.entrypoint,
                 "checkpoint_dir": spec.checkpoint_dir, "time_limit_min": spec.time_limit_min},
        "plan": {"policy": plan.get("policy"), "placement": plan.get("slots"),
                 "shard_weights": plan.get("shard_weights"), "planned_start": _stamp(plan.get("start_s")),
                 "predicted_jct_s": job.predicted_jct_s, "wait_reason": plan.get("wait_reason") or "",
                 "throughput_priors": list(plan.get("priors") or ())},
        "throughput": {t: {"samples_per_s": e.value, "source": e.source, "provenance": e.provenance}
                       for t, e in sorted(speeds.items())},
        "times": {"stored": _iso(job.created_at), "started": _iso(job.started_at), "ended": _iso(job.ended_at),
                  "actual_jct_s": actual},
        "slurm": [{"id": p.slurm_job_id, "role": p.role, "round": p.round, "array_task": p.array_task,
                   "het_offset": p.het_offset, "gpu_type": p.gpu_type, "gpus": p.gpu_count, "nodes": p.nodes,
                   "state": p.state, "reason": p.reason, "exit_code": p.exit_code,
                   "after": slurm_dependency(p.argv), "submitted": _iso(p.submitted_at), "started": _iso(p.started_at), "ended": _iso(p.ended_at)}
                  for p in sorted(job.slurm_jobs, key=lambda p: (p.submitted_at, p.id))],
        "waiting": dict(waiting),
        "logs": [{"slurm_id": lp.slurm_id, "path": str(lp.path), "stderr": str(lp.stderr) if lp.stderr else None,
                  "part": lp.header} for lp in logs],
        "events": [{"at": _iso(e.at), "kind": e.kind, "message": e.message} for e in events],
        "last_failure": _last_failure(events),
    }


def _last_failure(events: Sequence[Any]) -> dict[str, Any] | None:
    """The latest failed run as the failure rules saw it: exit code, Slurm's state, its stderr's tail."""
    failures = [e for e in events if e.kind in ("failed", "retried") and getattr(e, "data", None)]
    if not failures:
        return None
    data = failures[-1].data
    return {"at": _iso(failures[-1].at), "verdict": failures[-1].kind, "reason": failures[-1].message,
            **{k: data.get(k) for k in ("slurm_job_ids", "exit_code", "slurm_state", "ran_s", "stderr",
                                        "stderr_tail", "unusable")}}


def slurm_dependency(argv: Sequence[str]) -> str:
    """The ``--dependency`` a part was submitted with ("afterok:12:13"), or ""."""
    return option_value(argv or (), "dependency") or ""


def detail_lines(d: Mapping[str, Any]) -> list[str]:
    """The plain-text form of :func:`job_detail`."""
    spec, plan, times = d["spec"], d["plan"], d["times"]
    gpus = spec["gpus"]
    lines = [f"job {d['id']} {d['name']!r} ({d['owner']}): {d['state']}" + (f" - {d['reason']}" if d["reason"] else ""),
             f"  spec: {spec['workload']}, work {spec['work']}, global batch {spec['global_batch']}, {spec['sync']}, "
             f"{gpus['min']}-{gpus['max']} GPUs of {', '.join(gpus['types']) or 'any type'} (from {d['source']})"]
    if plan["placement"]:
        lines.append("  plan: " + ", ".join(f"{n}:{t}x{c}" for n, t, c in plan["placement"])
                     + f" ({plan['policy']}), start {plan['planned_start']}, predicted JCT "
                     + (f"{plan['predicted_jct_s']:.0f} s" if plan["predicted_jct_s"] is not None else "-"))
    if plan["wait_reason"]:  # with a placement: an overdue job queued in Slurm there, and why
        lines.append(f"  plan: waits: {plan['wait_reason']}")
    for gpu, cell in d["throughput"].items():
        label = "PRIOR" if cell["source"] == "prior" else cell["source"]
        lines.append(f"  speed on {gpu}: {cell['samples_per_s']:.1f} samples/s [{label}] {cell['provenance']}")
    lines.append(f"  times: stored {times['stored']}, started {times['started'] or '-'}, ended {times['ended'] or '-'}"
                 + (f", JCT {times['actual_jct_s']:.0f} s" if times["actual_jct_s"] is not None else "")
                 + (f"; restarted {d['restarts']} time(s)" if d.get("restarts") else ""))
    for p in d["slurm"]:
        where = f"{p['gpus']}x{p['gpu_type']}" if p["gpu_type"] else "-"
        lines.append(f"  Slurm {p['id']}" + (f"_{p['array_task']}" if p["array_task"] is not None else "")
                     + (f"+{p['het_offset']}" if p["het_offset"] is not None else "")
                     + f" [{p['role']}] {where} on {p['nodes'] or '-'}: {p['state']}"
                     + (f" ({p['reason']})" if p["reason"] else "")
                     + (f", exit {p['exit_code']}" if p["exit_code"] else "")
                     + (f", starts after {p['after']}" if p["after"] else ""))
    why = [v for k, v in d["waiting"].items() if v and k in ("slurm_reason", "why")]
    if why:
        lines.append("  waiting: " + "; ".join(str(w) for w in why))
    failure = d.get("last_failure")
    if failure:
        lines.append(f"  last failure ({failure['verdict']}): Slurm {','.join(failure['slurm_job_ids'] or [])} "
                     f"{failure['slurm_state']}, exit {failure['exit_code'] or '-'}"
                     + (f" after {failure['ran_s']:.0f} s" if failure["ran_s"] is not None else "")
                     + f": {failure['reason']}")
        if failure["stderr_tail"]:
            lines.append(f"  its stderr, last {len(failure['stderr_tail'])} lines ({failure['stderr']}):")
            lines += [f"    | {line}" for line in failure["stderr_tail"]]
    for log in d["logs"]:
        lines.append(f"  log: {log['path']}" + (f", stderr {log['stderr']}" if log.get("stderr") else "")
                     + f"  ({log['part']})")
    for e in d["events"][-20:]:
        lines.append(f"  {e['at']} {e['kind']}: {e['message']}")
    return lines
