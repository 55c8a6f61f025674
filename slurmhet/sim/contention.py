"""Ring-all-reduce communication under inter-server link contention (seed 004, eqs. 6-8).

A gang that stays inside one server pays no inter-server communication (its
intra-node cost is already inside the measured throughput). A gang spread over
servers exchanges ``2 (w-1)/w * m`` bytes per iteration over its bottleneck link,
whose bandwidth ``b_e`` is shared by the ``k = xi1 * p`` contending jobs with a
degradation ``f(alpha, k) = k + alpha (k - 1)``, plus ``xi2`` seconds per server used.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from slurmhet.policies.base import Gang, Placement


@dataclass(frozen=True)
class ContentionModel:
    """Constants of eqs. (6)-(8); defaults documented in bench/README.md (Reproductions)."""

    inter_gbps: float = 1.25
    xi1: float = 1.0
    xi2: float = 0.002
    alpha: float = 0.1

    def degradation(self, k: float) -> float:
        """f(alpha, k): 1 for a lone job, growing linearly with contenders."""
        k = max(1.0, k)
        return k + self.alpha * (k - 1.0)

    def comm_seconds(self, workers: int, servers: int, model_gb: float, contenders: int) -> float:
        """Per-iteration inter-server time of one gang (eq. 8's first and third terms)."""
        if servers <= 1 or workers <= 1:
            return 0.0
        bandwidth = self.inter_gbps / self.degradation(self.xi1 * contenders)
        return 2.0 * (workers - 1) / workers * model_gb / bandwidth + self.xi2 * servers


def gang_servers(gang: Gang) -> set[str]:
    return {node for node, _, _ in gang}


def contenders(placements: Mapping[int, Placement]) -> dict[tuple[int, int], int]:
    """p_j (eq. 6) per (job, copy): the most spread gangs sharing one of its servers, itself included."""
    spread_on: dict[str, int] = defaultdict(int)
    spread: list[tuple[tuple[int, int], set[str]]] = []
    for job_id, placement in placements.items():
        for copy, gang in enumerate(placement):
            servers = gang_servers(gang)
            if len(servers) > 1:
                spread.append(((job_id, copy), servers))
                for server in servers:
                    spread_on[server] += 1
    return {key: max(spread_on[s] for s in servers) for key, servers in spread}
