"""HadarE (seed 003, section V): Hadar plus job forking into copies on idle nodes.

Each round Hadar places one copy of each job it admits; then every still idle node
takes one more copy (a whole gang on that node) of the job that would otherwise finish
last, until no node is idle or every job has one copy per node. Copies of a job train
concurrently and are aggregated each round: the job's remaining steps are split among
its copies in proportion to their throughputs, so they all finish their share together
and the job progresses at the sum of their rates. The engine charges the consolidation
(weight-averaging the copies' checkpoints) at every round a job runs as several copies.
"""

from __future__ import annotations

from slurmhet.policies.hadar import Hadar
from slurmhet.policies.base import ClusterView, Placement


class HadarE(Hadar):
    key = "hadare"
    forks = True

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        out = super().decide(view)
        free = view.free(out.values())
        nodes = {n for n, _ in view.capacity}
        rate = {j.job_id: view.rates.rate(j.job_type, j.gpus, out.get(j.job_id, ())) for j in view.jobs}
        while True:
            best = None
            for job in view.jobs:
                copies = len(out.get(job.job_id, ()))
                if copies >= len(nodes):
                    continue
                for gpu_type in view.runnable_types(job):
                    gang = free.gang_of_type(gpu_type, job.gpus)
                    if gang is None or len({n for n, _, _ in gang}) > 1:
                        continue
                    gain = view.rates.rate(job.job_type, job.gpus, (gang,))
                    finish = job.remaining / rate[job.job_id] if rate[job.job_id] > 0 else float("inf")
                    if best is None or (finish, gain) > best[0]:
                        best = ((finish, gain), job.job_id, gang)
                    break
            if best is None:
                return out
            _, job_id, gang = best
            free.take((gang,))
            out[job_id] = tuple(out.get(job_id, ())) + (gang,)
            rate[job_id] += best[0][1]
