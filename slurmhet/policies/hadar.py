"""Hadar (seed 003, section III): primal-dual prices and a DP over the queue, every round.

Each (server h, type r) has a price that grows exponentially with its allocated share,
k = U_min^r (U_max^r / U_min^r)^(gamma / c)  (eq. 5), with U_max / U_min from eqs. (6)-(7)
recomputed each round over the queue. A job's utility is its effective throughput,
U_j(f) = steps_j / (f - a_j); its payoff under an allocation is U_j(f) minus the
allocation's cost (the sum of the marginal prices of the GPUs it takes). FIND_ALLOC
compares packed allocations (one server) and spread ones (fastest types first across
servers); communication enters through the job model's rate. The DP (Alg. 2) chooses
the subset of the queue with the largest total payoff; as documented in bench/README.md
it is exact over the first ``dp_window`` queued jobs (memoised on the free GPUs) and
greedy beyond. Running jobs keep their GPUs (Hadar only allocates to queued jobs);
multi-type gangs run at the slowest type's speed (barrier, constraint 1b).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from slurmhet.policies.base import ClusterView, Free, JobState, Placement, Slot, TimePolicy, make_gang


@dataclass(frozen=True)
class Prices:
    """Eq. (5) per GPU type; ``used`` and ``cap`` per (node, type)."""

    u_min: dict[str, float]
    u_max: dict[str, float]
    cap: dict[Slot, int]

    def marginal(self, slot: Slot, used: int, take: int) -> float:
        """Sum of the prices of ``take`` more GPUs on ``slot`` with ``used`` already allocated."""
        lo, hi, cap = self.u_min[slot[1]], self.u_max[slot[1]], self.cap[slot]
        return sum(lo * (hi / lo) ** ((used + i) / cap) for i in range(take))


def compute_prices(view: ClusterView, queue: list[JobState], eta: float = 1.0) -> Prices:
    """U_max^r and U_min^r (eqs. 6-7) over the queued jobs."""
    types = view.gpu_types()
    t_min, t_max = {}, {}
    for job in queue:
        rates = [r for r in (view.rates.type_rate(job.job_type, job.gpus, t) for t in types) if r > 0]
        t_min[job.job_id] = job.remaining / max(rates)
        t_max[job.job_id] = job.remaining / min(rates)
    horizon = view.now + sum(t_max.values())

    best = max(utility(view, j, j.remaining / t_min[j.job_id]) / j.gpus for j in queue)
    worst = min(utility(view, j, j.remaining / (horizon - view.now)) / (t_max[j.job_id] * j.gpus) for j in queue)
    worst = min(worst / (4 * eta), best / 2)
    return Prices({t: worst for t in types}, {t: best for t in types}, dict(view.capacity))


def utility(view: ClusterView, job: JobState, rate: float, delay: float = 0.0) -> float:
    """U_j: effective throughput normalised by the job's best throughput, so that job types compare.

    Equals (the job's whole run time on its fastest type) / (finish - arrival), in (0, 1].
    """
    best = view.best_type_rate(job)
    if rate <= 0 or best <= 0:
        return 0.0
    finish = view.now + delay + job.remaining / rate
    return (job.total_steps / best) / max(finish - job.arrival, 1e-9)


class Hadar(TimePolicy):
    key = "hadar"
    round_based = True
    dp_window = 3

    #: Seconds a job loses when its allocation changes (the paper's checkpoint-restart).
    restart_s = 10.0

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        if not view.jobs:
            return {}
        prices = compute_prices(view, view.jobs)
        queue = sorted(view.jobs, key=lambda j: (-utility(view, j, view.best_type_rate(j)) / j.gpus, j.arrival,
                                                 j.job_id))
        free = view.free()
        return self.dp_allocation(view, queue, free, {s: 0 for s in view.capacity}, prices)

    def find_alloc(self, view: ClusterView, job: JobState, free: Free, used: dict[Slot, int],
                   prices: Prices) -> tuple[float, Placement] | None:
        """FIND_ALLOC: the best (payoff, placement) among packed and spread candidates, if payoff > 0."""
        if free.total() < job.gpus:
            return None
        order = view.runnable_types(job)
        rank = {t: i for i, t in enumerate(order)}
        candidates: list[dict[Slot, int]] = []
        per_node: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for (node, t), c in free.counts.items():
            if c > 0 and t in rank:
                per_node[node].append((t, c))
        for node, slots in per_node.items():  # packed: one server
            if sum(c for _, c in slots) >= job.gpus:
                candidates.append(_take([(node, t, c) for t, c in slots], job.gpus, rank))
        spread = [(n, t, c) for n, slots in per_node.items() for t, c in slots]
        if sum(c for _, _, c in spread) >= job.gpus:  # spread: fastest types first, cheapest servers first
            spread.sort(key=lambda s: (rank[s[1]], used[(s[0], s[1])] / prices.cap[(s[0], s[1])], -s[2], s[0]))
            candidates.append(_take(spread, job.gpus, rank))
        if job.running and free.fits(job.placement):
            candidates.append({(n, t): c for g in job.placement for n, t, c in g})
        best: tuple[float, Placement] | None = None
        for take in candidates:
            placement = (make_gang(take),)
            rate = view.rates.rate(job.job_type, job.gpus, placement, self.sharding)
            delay = 0.0 if placement == job.placement else self.restart_s
            cost = sum(prices.marginal(s, used[s], c) for s, c in take.items())
            payoff = utility(view, job, rate, delay) - cost
            if rate > 0 and (best is None or payoff > best[0]):
                best = (payoff, placement)
        return best if best is not None and best[0] > 0 else None

    def dp_allocation(self, view: ClusterView, queue: list[JobState], free: Free, used: dict[Slot, int],
                      prices: Prices) -> dict[int, Placement]:
        """Alg. 2: include-or-skip each queued job, maximising total payoff."""
        memo: dict[tuple[int, tuple[tuple[Slot, int], ...]], tuple[float, dict[int, Placement]]] = {}
        window = min(self.dp_window, len(queue))

        def tail(free: Free, used: dict[Slot, int]) -> tuple[float, dict[int, Placement]]:
            total, chosen = 0.0, {}
            for job in queue[window:]:
                if free.total() == 0:
                    break
                found = self.find_alloc(view, job, free, used, prices)
                if found:
                    self._apply(found[1], free, used)
                    total, chosen[job.job_id] = total + found[0], found[1]
            return total, chosen

        def solve(idx: int, free: Free, used: dict[Slot, int]) -> tuple[float, dict[int, Placement]]:
            key = (idx, tuple(sorted(free.counts.items())))
            if key not in memo:
                memo[key] = self._branch(view, queue, idx, window, free, used, prices, solve, tail)
            return memo[key]

        return solve(0, _copy(free), dict(used))[1]

    def _branch(self, view: ClusterView, queue: list[JobState], idx: int, window: int, free: Free,
                used: dict[Slot, int], prices: Prices, solve, tail) -> tuple[float, dict[int, Placement]]:
        """One DP state: the better of skipping and taking ``queue[idx]`` (line 14-21 of Alg. 2)."""
        if idx >= window or free.total() == 0:
            return tail(_copy(free), dict(used))
        skip = solve(idx + 1, _copy(free), dict(used))
        found = self.find_alloc(view, queue[idx], free, used, prices)
        if not found:
            return skip
        taken_free, taken_used = _copy(free), dict(used)
        self._apply(found[1], taken_free, taken_used)
        take = solve(idx + 1, taken_free, taken_used)
        if take[0] + found[0] > skip[0]:
            return take[0] + found[0], {queue[idx].job_id: found[1], **take[1]}
        return skip

    @staticmethod
    def _apply(placement: Placement, free: Free, used: dict[Slot, int]) -> None:
        free.take(placement)
        for gang in placement:
            for node, t, c in gang:
                used[(node, t)] += c


def _take(slots: list[tuple[str, str, int]], k: int, rank: dict[str, int]) -> dict[Slot, int]:
    take: dict[Slot, int] = {}
    for node, t, c in sorted(slots, key=lambda s: rank[s[1]]) if len({s[0] for s in slots}) == 1 else slots:
        use = min(c, k - sum(take.values()))
        if use > 0:
            take[(node, t)] = use
    return take


def _copy(free: Free) -> Free:
    return Free(free.counts)
