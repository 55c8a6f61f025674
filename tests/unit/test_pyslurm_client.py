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
