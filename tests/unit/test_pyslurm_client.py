"""The pyslurm adapter is used only when pyslurm matches Slurm's version; here it says why not."""

from __future__ import annotations

import pytest

from slurmhet.slurm import pyslurm_client


def test_availability_gives_a_reason() -> None:
    module, reason = pyslurm_client.available((22, 5, 8))
    if module is None:
        assert reason.startswith("pyslurm")
    else:
        assert reason == ""


def test_pyslurm_reads_the_same_inventory_as_the_cli(slurm_cluster: None) -> None:
    from slurmhet.slurm.client import SlurmCli
    from slurmhet.slurm.runner import SubprocessRunner

    cli = SlurmCli(SubprocessRunner())
    module, reason = pyslurm_client.available(cli.version())
    if module is None:
        pytest.skip(f"pyslurm adapter not usable here: {reason}")
    adapter = pyslurm_client.PyslurmClient(module, cli)
    assert {n.name: dict(n.gpus) for n in adapter.nodes()} == {n.name: dict(n.gpus) for n in cli.nodes()}


def test_the_queue_is_read_as_the_cli_reads_it_with_every_field_the_open_world_needs() -> None:
    """pyslurm's job objects lacked the GPUs a foreign job holds, its request, partition, priority and limit:
    read through them, every other user's job held nothing and the planner saw an empty cluster."""
    from types import SimpleNamespace

    from slurmhet.slurm.parsers import QueueRecord

    held = QueueRecord(job_id="7", het_job_id=None, het_offset=None, array_job_id=None, array_task=None, name="x",
                       state="RUNNING", reason="None", comment="", user="alice", nodes="nodea", partition="v100",
                       priority=42, time_limit_s=600.0, gpus=(("nodea", "v100", 4),), gpu_request=(("v100", 4),))
    asked: list[object] = []

    class Cli:
        def queue(self, job_ids: object = None) -> list[QueueRecord]:
            asked.append(job_ids)
            return [held]

    def no_jobs() -> None:
        raise AssertionError("the queue must not be read through pyslurm.Jobs")

    module = SimpleNamespace(Jobs=SimpleNamespace(load=no_jobs))
    adapter = pyslurm_client.PyslurmClient(module, Cli())  # type: ignore[arg-type]
    assert adapter.queue(["7"]) == [held] and adapter.queue() == [held]
    assert asked == [["7"], None]
