"""Tiresias (2-queue discretised LAS) and YARN-CS on hand-computed instances, and their placement."""

from slurmhet.cluster import Inventory, Node
from slurmhet.policies.baselines import Tiresias, YarnCs, server_gang
from slurmhet.policies.base import ClusterView, JobState
from slurmhet.sim import SimConfig, run_policies
from slurmhet.sim.engine import capacity_of
from slurmhet.sim.traces import TraceJob
from tests.unit.sim_rates import tiny


def finishes(policy, jobs: list[TraceJob], inventory: Inventory,
             table: dict[str, dict[str, float]]) -> dict[int, float]:
    run = run_policies(jobs, inventory, tiny(table), {"p": policy}, SimConfig(restart_s=10.0)).runs["p"]
    return {r.job_id: round(r.finish, 6) for r in run.records}


def tiresias(threshold: float) -> Tiresias:
    policy = Tiresias(round_s=60.0)
    policy.threshold = threshold
    return policy


def test_tiresias_preempts_a_demoted_job_for_a_new_one() -> None:
    one = Inventory((Node("a", {"v100": 1}),))
    jobs = [TraceJob(0, "x", 1, 0.0, 200.0), TraceJob(1, "x", 1, 70.0, 30.0)]
    # Job 0 passes 50 GPU-s in round 1 (queue 2). At 120 (120 steps done) job 1, in queue 1,
    # takes the GPU and ends at 150; job 0 resumes at the 180 round: 180 + 10 restart + 80.
    assert finishes(tiresias(50.0), jobs, one, {"x": {"v100": 1.0}}) == {1: 150.0, 0: 270.0}


def test_tiresias_does_not_preempt_inside_a_queue() -> None:
    one = Inventory((Node("a", {"v100": 1}),))
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 0.0, 100.0)]
    # 0-60 job 0, demoted; 60-120 job 1 (queue 1 beats queue 2), demoted. At 120 both are in
    # queue 2: the running job 1 stays ahead of the waiting job 0 and ends at 160;
    # job 0 resumes at 180: 180 + 10 + 40.
    assert finishes(tiresias(50.0), jobs, one, {"x": {"v100": 1.0}}) == {1: 160.0, 0: 230.0}


def test_tiresias_keeps_a_running_job_on_its_gpus() -> None:
    two = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    jobs = [TraceJob(0, "x", 1, 0.0, 1000.0), TraceJob(1, "x", 1, 100.0, 60.0)]
    # Job 0 (demoted at 60) keeps the V100 (1000 / 2 = 500) while the idle K80 takes job 1
    # at the 120 round (120 + 60 / 1); moving job 0 off the V100 would only cost it.
    assert finishes(tiresias(50.0), jobs, two, {"x": {"v100": 2.0, "k80": 1.0}}) == {1: 180.0, 0: 500.0}


def test_yarn_cs_waits_for_one_server() -> None:
    nodes = Inventory((Node("a", {"v100": 2}), Node("b", {"k80": 2})))
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 0.0, 200.0), TraceJob(2, "x", 1, 0.0, 300.0),
            TraceJob(3, "x", 2, 0.0, 200.0), TraceJob(4, "x", 1, 0.0, 10.0)]
    # First fit: jobs 0, 1 on a, job 2 on b. Job 3 needs two GPUs of one server: at 100 one is
    # idle on each (no spreading), so it waits, and job 4 waits behind it (FIFO), until job 1
    # frees a at 200: job 3 ends 200 + 200 / 2, job 4 takes b's idle GPU: 200 + 10.
    out = finishes(YarnCs(), jobs, nodes, {"x": {"v100": 1.0, "k80": 1.0}})
    assert out == {0: 100.0, 1: 200.0, 2: 300.0, 3: 300.0, 4: 210.0}


def _view(nodes: Inventory, gpus: int) -> tuple[ClusterView, JobState]:
    job = JobState(0, "x", gpus, 1.0, 0.0, 1.0, 1.0)
    return ClusterView(0.0, capacity_of(nodes), [job], tiny({"x": {"v100": 1.0, "k80": 1.0}}),
                       tuple(n.name for n in nodes.nodes)), job


def test_server_gang_takes_whole_servers_of_one_kind() -> None:
    nodes = Inventory((Node("a", {"v100": 4}), Node("b", {"k80": 4}), Node("c", {"k80": 4}),
                       Node("d", {"v100": 4})))
    view, job = _view(nodes, 6)
    free = view.free([((("d", "v100", 1),),)])
    # v100 has one idle server (a) and d has 3 idle: a + 2 GPUs of d; never a K80 beside them.
    assert server_gang(view, job, free) == ((("a", "v100", 4), ("d", "v100", 2)),)
    free = view.free([((("d", "v100", 3),),)])
    # d has 1 idle: v100 cannot hold 6, so two K80 servers' worth: b whole + 2 of c.
    assert server_gang(view, job, free) == ((("b", "k80", 4), ("c", "k80", 2)),)
    view, job = _view(nodes, 2)
    free = view.free([((("a", "v100", 3), ("b", "k80", 3), ("c", "k80", 3), ("d", "v100", 3)),)])
    # Four idle GPUs, but one per server: a 2-GPU job waits.
    assert server_gang(view, job, free) is None


def test_server_gang_mixes_kinds_only_when_no_kind_can_hold_the_job() -> None:
    nodes = Inventory((Node("a", {"v100": 4}), Node("b", {"k80": 4})))
    view, job = _view(nodes, 8)
    assert server_gang(view, job, view.free()) == ((("a", "v100", 4), ("b", "k80", 4)),)
    assert server_gang(view, job, view.free([((("b", "k80", 1),),)])) is None
