"""Resource and environment fields on the dev cluster (nodes: 4 CPUs, 4000 MB, 4 or 2 GPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.helpers import accounting, cli, job, status, wait_for, write

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def test_cpus_and_memory_per_gpu_reach_allocation_and_workdir_the_command(tmp_path: Path, state_dir: Path,
                                                                           leftovers: list[str]) -> None:
    workdir = tmp_path / "run dir"
    workdir.mkdir()
    spec = write(tmp_path / "res.yaml", job("res", ["bash", "-c", "echo cwd=$PWD cpus=$SLURM_CPUS_PER_TASK"],
                                            "{min: 2, max: 2, types: [t4]}",
                                            f"cpus_per_gpu: 2\nmem_per_gpu: 500M\nworkdir: {json.dumps(str(workdir))}\n"))
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    rows = wait_for(state_dir, [out["job_id"]])
    assert rows[out["job_id"]]["state"] == "COMPLETED"
    [record] = [r for r in accounting(out["slurm_job_ids"]) if not r.id.is_step]
    assert record.alloc_tres.get("gres/gpu:t4") == 2
    assert record.alloc_tres.get("cpu") == 4 and record.alloc_tres.get("mem") == 1000  # 2 GPUs x (2 CPUs, 500 MB)
    log = Path(rows[out["job_id"]]["logs"][0]).read_text()
    assert log.count(f"cwd={workdir} cpus=2") == 2


def test_more_cpus_per_gpu_than_the_nodes_feed_is_refused_before_anything_is_stored(tmp_path: Path,
                                                                                  state_dir: Path) -> None:
    spec = write(tmp_path / "big.yaml", job("big", ["true"], "{min: 2, max: 2, types: [t4]}", "cpus_per_gpu: 3\n"))
    refused = cli("submit", str(spec), state=state_dir, check=False)
    assert refused.returncode == 2 and f"{spec}:" in refused.stderr
    assert "at least 2 GPUs but the cluster has 1" in refused.stderr  # a 4-CPU node feeds one 3-CPU GPU
    assert status(state_dir) == {}


def test_the_plan_gives_no_node_more_gpus_than_its_cpus_feed(tmp_path: Path, state_dir: Path,
                                                            leftovers: list[str]) -> None:
    """nodea has 4 v100 but 4 CPUs: at 2 CPUs per GPU the job gets 2 there (4 would be refused by Slurm)."""
    spec = write(tmp_path / "hungry.yaml", job("hungry", ["bash", "-c", "echo rank=$RANK"],
                                               "{min: 2, max: 4, types: [v100]}", "cpus_per_gpu: 2\n"))
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    assert out["state"] == "SUBMITTED" and out["allocation"] == "2xv100@nodea", out
    rows = wait_for(state_dir, [out["job_id"]])
    assert rows[out["job_id"]]["state"] == "COMPLETED"
    [record] = [r for r in accounting(out["slurm_job_ids"]) if not r.id.is_step]
    assert record.alloc_tres.get("gres/gpu:v100") == 2 and record.alloc_tres.get("cpu") == 4
