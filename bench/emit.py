"""``slurmhet bench emit``: submissions per second to the real slurmctld, one array vs one sbatch per job.

Both sides submit the same ``jobs`` tiny jobs (``true`` on one k80), held so
nothing runs and the cluster is left as found (everything is cancelled at the
end). Reported: jobs accepted per second each way and their ratio, measured in
one run. Run: ``.venv/bin/python -m bench.emit --json [--jobs N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from slurmhet.emit.multipart import MultiPartSubmitter, Part
from slurmhet.emit.requests import ArrayChunk, ArrayRequest, BatchRequest, Common, GpuShape, Launch
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.runner import SubprocessRunner

LAUNCH = Launch(("true",), (sys.executable, "-m", "slurmhet", "run", "--"))


def _common(job_id: int) -> Common:
    return Common(job_id=job_id, name="bench-emit", log_dir="/tmp", time_limit_min=1, extra=(("hold", None),))


def run(jobs: int = 1000) -> dict[str, object]:
    client = SlurmCli(SubprocessRunner(timeout=60), timeout=60)
    max_array = int(client.config().get("MaxArraySize", "1001"))
    submitted: list[str] = []
    try:
        array = ArrayRequest(_common(0), LAUNCH, GpuShape("k80", 1), ArrayChunk(0, jobs))
        start = time.perf_counter()
        outcome = MultiPartSubmitter(client).submit([Part(c) for c in array.chunks(max_array)])
        array_s = time.perf_counter() - start
        submitted += [p.slurm_job_id for p in outcome.submitted]
        if not outcome.ok:
            raise SystemExit(f"array submission refused: {outcome.message}")
        single = BatchRequest(_common(0), LAUNCH, "k80", 1).materialize()
        start = time.perf_counter()
        for _ in range(jobs):
            submitted.append(client.submit(single.argv, single.script))
        single_s = time.perf_counter() - start
    finally:
        for i in range(0, len(submitted), 500):
            client.cancel(submitted[i:i + 500])
    return {
        "jobs": jobs,
        "max_array_size": max_array,
        "array_sbatch_calls": len(outcome.submitted),
        "array_jobs_per_s": jobs / array_s,
        "single_jobs_per_s": jobs / single_s,
        "array_over_single": single_s / array_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.jobs)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{args.jobs} jobs: array {result['array_jobs_per_s']:.0f} jobs/s, one sbatch per job "
              f"{result['single_jobs_per_s']:.1f} jobs/s, ratio {result['array_over_single']:.0f}x")


if __name__ == "__main__":
    main()
