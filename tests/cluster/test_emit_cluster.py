"""Emission on the real dev cluster: het jobs, arrays + consolidation, chunking, packs, submitit, refusals."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurmhet.emit.multipart import MultiPartSubmitter, Part
from slurmhet.emit.requests import (ArrayChunk, ArrayRequest, Common, ConsolidationRequest, GpuShape, HetJobRequest,
                                    Launch, PackMember, PackRequest)
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.runner import SubprocessRunner
from slurmhet.slurm.parsers import AccountingRecord
from tests.cluster.helpers import accounting

pytestmark = pytest.mark.usefixtures("slurm_cluster")

LAUNCHER = (sys.executable, "-m", "slurmhet", "run", "--")
REPO = Path(__file__).resolve().parents[2]

@pytest.fixture
def client() -> SlurmCli:
    return SlurmCli(SubprocessRunner(timeout=30))


SLURMHET_CMD = (sys.executable, "-m", "slurmhet")


def _settled(slurm_ids: list[str], rows: int, timeout: float = 120) -> list[AccountingRecord]:
    """Poll sacct until ``rows`` job-level rows (het components, array tasks) are final; sacct lags squeue."""
    deadline = time.monotonic() + timeout
    while True:
        records = [r for r in accounting(slurm_ids, timeout=timeout) if not r.id.is_step]
        if len([r for r in records if r.state not in ("PENDING", "RUNNING", "REQUEUED")]) >= rows:
            return records
        assert time.monotonic() < deadline, f"sacct: fewer than {rows} final rows for {slurm_ids}: {records}"
        time.sleep(1)


def test_two_type_job_runs_as_one_het_job(tmp_path: Path, client: SlurmCli) -> None:
    request = HetJobRequest(
        Common(9001, "het v100+t4", str(tmp_path), time_limit_min=5),
        Launch(("bash", "-c", "echo $SLURMD_NODENAME $RANK $WORLD_SIZE $SLURM_HET_SIZE $SLURMHET_SHARD_WEIGHT "
                              "$MASTER_ADDR"), LAUNCHER),
        (GpuShape("v100", 1, 1, ("nodea",)), GpuShape("t4", 2, 1, ("nodeb",))),
        shard_weights=(0.5, 0.25, 0.25),
    )
    outcome = MultiPartSubmitter(client).submit([Part(request)])
    assert outcome.ok, outcome.message
    slurm_id = outcome.submitted[0].slurm_job_id
    records = _settled([slurm_id], 2)
    by_offset = {r.id.het_offset: r for r in records}
    assert by_offset[0].gpus_by_type() == {"v100": 1} and by_offset[0].nodes == "nodea"
    assert by_offset[1].gpus_by_type() == {"t4": 2} and by_offset[1].nodes == "nodeb"
    assert all(r.state == "COMPLETED" for r in records)
    lines = sorted((tmp_path / f"slurmhet-9001-{slurm_id}.out").read_text().split("\n"))
    assert [l for l in lines if l] == ["nodea 0 3 2 0.5 nodea", "nodeb 1 3 2 0.25 nodea", "nodeb 2 3 2 0.25 nodea"]
    rows = outcome.submitted[0].store_rows()
    assert [(r["het_offset"], r["gpu_type"], r["gpu_count"]) for r in rows] == [(0, "v100", 1), (1, "t4", 2)]


def test_unpinned_het_job_gets_a_partition_per_component(tmp_path: Path, client: SlurmCli) -> None:
    """From a plan on the dev cluster: no nodelist (no node holds two of its types), each component in
    its type's partition; Slurm still puts each on the one node of its type."""
    from slurmhet.cluster import Inventory
    from slurmhet.emit.from_plan import EmitSettings, requests_for
    from slurmhet.planner.model import Allocation, JobPlan
    from slurmhet.slurm.profile import SiteProfile
    from slurmhet.spec import GpuRequest, JobSpec, Workload

    spec = JobSpec(name="het partitions", workload=Workload("ResNet-18", 64), global_batch=64,
                   command=("bash", "-c", "echo $SLURMD_NODENAME $RANK"), steps=1, gpus=GpuRequest(1, 8),
                   time_limit_min=5)
    plan = JobPlan("9007", Allocation((("nodea", "v100", 1), ("nodeb", "t4", 1))), (), 1.0, 1.0, 0.0, 1.0, 1.0, 0)
    settings = EmitSettings(str(tmp_path), LAUNCHER, SLURMHET_CMD, partitions={"v100": "v100", "t4": "t4"})
    profile = SiteProfile("22.05", True, 1001, 10**6, "gres", False, True, True)
    parts = requests_for(9007, spec, plan, profile, settings, inventory=Inventory(tuple(client.nodes())))
    assert not any(a.startswith("--nodelist") for a in parts[0].request.materialize().argv)
    outcome = MultiPartSubmitter(client).submit(parts)
    assert outcome.ok, outcome.message
    records = _settled([outcome.submitted[0].slurm_job_id], 2)
    by_offset = {r.id.het_offset: r for r in records}
    assert [(by_offset[k].partition, by_offset[k].nodes) for k in (0, 1)] == [("v100", "nodea"), ("t4", "nodeb")]
    assert all(r.state == "COMPLETED" for r in records)


def test_forked_copies_run_as_array_then_consolidation(tmp_path: Path, client: SlurmCli) -> None:
    """Two copies save checkpoints; the afterany consolidation starts after both and averages them."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save = ("import os, torch; from slurmhet.runtime.checkpoint import *; t = int(os.environ['SLURM_ARRAY_TASK_ID']); "
            "save_checkpoint(os.path.join(os.environ['SLURMHET_CHECKPOINT_DIR'], own_checkpoint_name(os.environ)), "
            "TrainingCheckpoint(model={'w': torch.full((2,), float(t))}, optimizer=None, steps=10 + 10 * t, "
            "start_steps=0, meta={}))")
    common = Common(9002, "forked", str(tmp_path), time_limit_min=5)
    launch = Launch((sys.executable, "-c", save), LAUNCHER, (("SLURMHET_CHECKPOINT_DIR", str(ckpt)),))
    array = ArrayRequest(common, launch, GpuShape("k80", 1), ArrayChunk(0, 2), throttle=2, round=1)
    consolidation = ConsolidationRequest(common, SLURMHET_CMD, str(ckpt), (0, 1), round=1)
    outcome = MultiPartSubmitter(client).submit([Part(array), Part(consolidation, after=(0,))])
    assert outcome.ok, outcome.message
    array_id, cons_id = (p.slurm_job_id for p in outcome.submitted)
    assert f"--dependency=afterany:{array_id}" in outcome.submitted[1].argv
    records = _settled([array_id, cons_id], 3)
    tasks = [r for r in records if r.id.array_task is not None]
    cons = next(r for r in records if r.id.job == cons_id)
    assert len(tasks) == 2 and all(r.state == "COMPLETED" for r in tasks)
    assert cons.state == "COMPLETED"
    assert cons.start is not None and all(t.end is not None and cons.start >= t.end for t in tasks)
    from slurmhet.runtime.checkpoint import load_checkpoint
    merged = load_checkpoint(ckpt / "consolidated.pt")
    assert merged.model["w"].tolist() == pytest.approx([20 / 30, 20 / 30])  # steps-weighted: (0*10 + 1*20) / 30


def test_five_thousand_tasks_are_chunked_under_max_array_size(tmp_path: Path, client: SlurmCli) -> None:
    """Held, so nothing runs: slurmctld accepts every chunk's indices (< MaxArraySize=1001) and keeps the total."""
    max_size = int(client.config()["MaxArraySize"])
    request = ArrayRequest(Common(9003, "many", str(tmp_path), time_limit_min=1, extra=(("hold", None),)),
                           Launch(("true",), LAUNCHER), GpuShape("k80", 1), ArrayChunk(0, 5000), throttle=50)
    chunks = request.chunks(max_size)
    outcome = MultiPartSubmitter(client).submit([Part(c) for c in chunks])
    try:
        assert outcome.ok, outcome.message
        assert len(outcome.submitted) == -(-5000 // max_size)
        queued = client.queue([p.slurm_job_id for p in outcome.submitted])
        pending = [r for r in queued if r.state == "PENDING"]
        assert {r.root_id for r in pending} == {p.slurm_job_id for p in outcome.submitted}
        rows = [row for p in outcome.submitted for row in p.store_rows()]
        assert len(rows) == 5000 and max(r["array_task"] for r in rows) == max_size - 1
        offsets = [p.request.chunk.task_offset for p in outcome.submitted]
        assert offsets == list(range(0, 5000, max_size))
    finally:
        client.cancel([p.slurm_job_id for p in outcome.submitted])


def test_refused_later_part_cancels_the_earlier_ones(tmp_path: Path, client: SlurmCli) -> None:
    common = Common(9004, "atomic", str(tmp_path), time_limit_min=1, extra=(("hold", None),))
    good = ArrayRequest(common, Launch(("true",), LAUNCHER), GpuShape("k80", 1), ArrayChunk(0, 2))
    refused = replace(common, extra=(("hold", None), ("account", "no-such-account")))
    bad = ArrayRequest(refused, Launch(("true",), LAUNCHER), GpuShape("k80", 1), ArrayChunk(2, 1))
    outcome = MultiPartSubmitter(client).submit([Part(good), Part(bad)])
    assert not outcome.ok and outcome.refused_at == 1 and "account" in outcome.message.lower()
    first = outcome.submitted[0].slurm_job_id
    assert outcome.cancelled == (first,) and outcome.live == ()
    records = [r for r in accounting([first]) if not r.id.is_step]
    assert records and all(r.state == "CANCELLED" for r in records)


def test_pack_runs_members_concurrently_in_one_allocation(tmp_path: Path, client: SlurmCli) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    member = ("bash", "-c", f"date +%s.%N > {marks}/$SLURMHET_JOB_ID.start; sleep 3; "
                            f"echo $SLURM_JOB_ID $CUDA_MPS_PIPE_DIRECTORY > {marks}/$SLURMHET_JOB_ID.end; "
                            f"date +%s.%N > {marks}/$SLURMHET_JOB_ID.stop")
    mps_log = tmp_path / "mps.log"
    # sbatch exports the submitter's environment: the stand-in control daemon is on the job's PATH.
    runner = SubprocessRunner(timeout=30, base_env={**os.environ, "SLURMHET_MPS_STANDIN_LOG": str(mps_log),
                                                    "PATH": f"{REPO / 'tests' / 'standins'}:{os.environ['PATH']}"})
    pack = PackRequest(Common(9005, "pack", str(tmp_path), time_limit_min=5, also=(9006,)), LAUNCHER,
                       SLURMHET_CMD, "v100",
                       (PackMember(9005, "a", member, (), 50), PackMember(9006, "b'$(x)", member, (), 50)),
                       sharing="mps", share_count=100, nodelist=("nodea",))
    outcome = MultiPartSubmitter(SlurmCli(runner)).submit([Part(pack)])
    assert outcome.ok, outcome.message
    slurm_id = outcome.submitted[0].slurm_job_id
    record = next(r for r in accounting([slurm_id]) if not r.id.is_step)
    assert record.state == "COMPLETED" and record.comment == "slurmhet:9005,9006" and record.nodes == "nodea"
    assert record.alloc_tres.get("gres/mps") == 100
    starts, stops = ([float((marks / f"{i}.{mark}").read_text()) for i in (9005, 9006)] for mark in ("start", "stop"))
    assert max(starts) < min(stops), (starts, stops)  # both started before either finished its 3 s
    ends = {tuple((marks / f"{i}.end").read_text().split()) for i in (9005, 9006)}
    assert len(ends) == 1 and next(iter(ends))[0] == slurm_id  # one allocation, one private MPS pipe directory
    assert mps_log.read_text().count("quit") >= 1


def test_hostile_het_job_renders_safely(tmp_path: Path, client: SlurmCli) -> None:
    hostile = "it's; $(touch pwned)\n`touch pwned2` \"q\""
    request = HetJobRequest(Common(9007, hostile, str(tmp_path), time_limit_min=5),
                            Launch(("printf", "%s\\n", hostile), LAUNCHER),
                            (GpuShape("v100", 1, 1), GpuShape("k80", 1, 1)))
    outcome = MultiPartSubmitter(client).submit([Part(request)])
    assert outcome.ok, outcome.message
    slurm_id = outcome.submitted[0].slurm_job_id
    assert all(r.state == "COMPLETED" for r in _settled([slurm_id], 2))
    out = (tmp_path / f"slurmhet-9007-{slurm_id}.out").read_text()
    assert sorted(out.splitlines()) == sorted(hostile.splitlines() * 2)  # two ranks, lines may interleave
    assert not list(tmp_path.glob("**/pwned*")) and not list(Path.cwd().glob("pwned*"))


def _square(x: int) -> int:
    return x * x


def test_python_callable_through_submitit_returns_its_result(tmp_path: Path) -> None:
    """Single job and map_array both go through our runner; submitit's handles return the results."""
    from slurmhet.emit.submitit_executor import RunnerSlurmExecutor

    executor = RunnerSlurmExecutor(tmp_path / "submitit", runner=SubprocessRunner(timeout=30), python=sys.executable)
    executor.update_parameters(time=5, gres="gpu:k80:1", ntasks_per_node=1, comment="slurmhet:9008",
                               array_parallelism=3)
    job = executor.submit(_square, 7)
    jobs = executor.map_array(_square, [1, 2, 3])
    assert job.result() == 49
    assert [j.result() for j in jobs] == [1, 4, 9]
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one array


def _where() -> tuple[str, str, str, str]:
    import os

    return (os.environ["SLURMD_NODENAME"], os.environ["RANK"], os.environ["WORLD_SIZE"],
            os.environ["SLURMHET_SHARD_WEIGHT"])


def test_python_callable_as_het_job_through_submitit(tmp_path: Path) -> None:
    """submitit cannot express a het job; our executor subclass renders it and keeps submitit's handles."""
    from slurmhet.emit.submitit_executor import HetSubmititExecutor

    request = HetJobRequest(
        Common(9010, "submitit het", str(tmp_path), time_limit_min=5),
        Launch((), LAUNCHER),
        (GpuShape("v100", 1, 1, ("nodea",)), GpuShape("t4", 2, 1, ("nodeb",))),
        shard_weights=(0.5, 0.25, 0.25),
    )
    executor = HetSubmititExecutor(tmp_path / "submitit", SubprocessRunner(timeout=30), request, python=sys.executable)
    job = executor.submit(_where)
    results = job.results()  # one per rank, in rank order (submitit's multi-task handle)
    assert results[0] == ("nodea", "0", "3", "0.5")
    assert sorted(results) == [("nodea", "0", "3", "0.5"), ("nodeb", "1", "3", "0.25"),
                                     ("nodeb", "2", "3", "0.25")]
    records = _settled([job.job_id], 2)
    assert {r.id.het_offset: r.gpus_by_type() for r in records} == {0: {"v100": 1}, 1: {"t4": 2}}
