"""The cluster these tests run on is the Slurm series `make test` meant (22.05 on the host, 24.11 and 26.05 in chroots)."""

from __future__ import annotations

import os
import subprocess

import pytest

from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.profile import probe
from slurmhet.slurm.runner import SubprocessRunner

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def test_the_commands_and_the_controller_are_the_expected_series() -> None:
    """Without this, a chroot's run that talked to the host's cluster would pass as a 24.11 run."""
    client = SlurmCli(SubprocessRunner(timeout=30))
    major, minor, _ = client.version()
    series = f"{major}.{minor:02d}"
    # make test names the series of each run; by hand, any series of the dev cluster will do.
    assert series == os.environ.get("SLURMHET_EXPECT_SLURM", series)
    controller = client.config()["SLURM_VERSION"]  # what slurmctld itself reports
    assert controller.startswith(f"{major}.{minor:02d}."), controller
    profile = probe(client)
    assert profile.major == major and profile.slurm_version.startswith(f"{major}.{minor}.")
    # Each series listens on its own port (devcluster), below the ephemeral range: the host's 22.05 on 16817,
    # 24.11 on 26817, 26.05 on 31817.
    port = {"22.05": "16817", "24.11": "26817", "26.05": "31817"}[series]
    assert client.config()["SlurmctldPort"] == port
    # And numbers its jobs from its own start, so that clusters run side by side give their jobs' torch
    # MASTER_PORT (runtime/launcher.py: from the job id) different values.
    assert client.config()["FirstJobId"] == {"22.05": "1", "24.11": "4001", "26.05": "8001"}[series]
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    assert "is UP" in ping.stdout
