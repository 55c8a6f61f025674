"""submit / status / cancel on the real dev cluster (Slurm 22.05, 3 nodes, 3 GPU types)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cluster.helpers import accounting, cli, job, status, wait_for, write

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def test_typed_job_runs_on_the_right_node_and_is_accounted(tmp_path: Path, state_dir: Path) -> None:
    spec = write(tmp_path / "t4.yaml", job("t4-pair", ["bash", "-c", "echo node=$SLURMD_NODENAME rank=$RANK"],
                                             "{min: 2, max: 2, types: [t4]}"))
    out = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    assert out[0]["state"] == "SUBMITTED" and out[0]["allocation"] == "2xt4@nodeb"
    job_id, (slurm_id,) = out[0]["job_id"], out[0]["slurm_job_ids"]
    rows = wait_for(state_dir, [job_id])
    assert rows[job_id]["state"] == "COMPLETED"
    log = (state_dir / "logs" / f"slurmhet-{job_id}-{slurm_id}.out").read_text()
    assert sorted(log.split()) == ["node=nodeb", "node=nodeb", "rank=0", "rank=1"]
    records = [r for r in accounting([slurm_id]) if not r.id.is_step]
    assert records[0].alloc_tres.get("gres/gpu:t4") == 2 and records[0].nodes == "nodeb"
    tag, _, store = records[0].comment.partition("@")
    assert tag == f"slurmhet:{job_id}" and len(store) == 12  # job ids are per store: the tag names the store


def test_cancel_stops_a_runningjob(tmp_path: Path, state_dir: Path) -> None:
    spec = write(tmp_path / "long.yaml", job("sleeper", ["sleep", "300"], "{min: 1, max: 1, types: [k80]}"))
    job_id = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"][0]["job_id"]
    wait_for(state_dir, [job_id], final=("RUNNING",), timeout=60)
    cli("cancel", str(job_id), state=state_dir)
    slurm_id = status(state_dir)[job_id]["slurm"][0]["id"]
    records = [r for r in accounting([slurm_id]) if not r.id.is_step]
    assert records[0].state == "CANCELLED"
    assert status(state_dir)[job_id]["state"] == "CANCELLED"
    missing = cli("cancel", "999", state=state_dir, check=False)
    assert missing.returncode == 2 and "no slurmhet job 999" in missing.stderr


def test_hostile_name_and_command_run_safely(tmp_path: Path, state_dir: Path) -> None:
    hostile = "it's; $(touch pwned)\n`touch pwned2` \"q\""
    spec = write(tmp_path / "h.yaml", job(hostile, ["printf", "%s", hostile], "1"))
    out = json.loads(cli("submit", "--json", str(spec), state=state_dir, cwd=tmp_path).stdout)["jobs"][0]
    rows = wait_for(state_dir, [out["job_id"]])
    assert rows[out["job_id"]]["state"] == "COMPLETED" and rows[out["job_id"]]["name"] == hostile
    log = (state_dir / "logs" / f"slurmhet-{out['job_id']}-{out['slurm_job_ids'][0]}.out").read_text()
    assert log == hostile
    assert not list(tmp_path.glob("pwned*")) and not list(state_dir.glob("**/pwned*"))


def test_sbatch_refusal_is_stored_with_slurms_message(tmp_path: Path, state_dir: Path) -> None:
    spec = write(tmp_path / "r.yaml", job("refused", ["true"], "1", "sbatch: ['--licenses=no-such-license:1']\n"))
    proc = cli("submit", "--json", str(spec), state=state_dir, check=False)
    assert proc.returncode == 1 and "SUBMIT_FAILED" in proc.stderr
    row = json.loads(proc.stdout)["jobs"][0]
    assert row["state"] == "SUBMIT_FAILED" and "invalid license specification" in row["reason"].lower()
    stored = status(state_dir)[row["job_id"]]
    assert stored["state"] == "SUBMIT_FAILED" and stored["reason"] == row["reason"]


def test_bad_spec_stores_nothing(tmp_path: Path, state_dir: Path) -> None:
    for body, words in [
        (job("x", ["true"], "{types: [a100]}"), "GPU type 'a100' is not in the cluster"),
        (job("x", ["true"], "{min: 5, types: [v100]}"), "at least 5 GPUs but the cluster has 4"),
        (job("x", ["true"], "1", "sbatch: ['--gpus=2']\n"), "managed by slurmhet"),
        # Refused before Slurm sees them (issue 14): the shared cluster's rules, read from Slurm.
        (job("x", ["true"], "1", "sbatch: ['--account=no-such-account']\n"), "may not use account 'no-such-account'"),
        (job("x", ["true"], "1", "sbatch: ['--partition=no-such-partition']\n"), "no partition 'no-such-partition'"),
        (job("x", ["true"], "1", "sbatch: ['--qos=gpu2']\n"), "may not use QOS 'gpu2'"),
    ]:
        proc = cli("submit", str(write(tmp_path / "bad.yaml", job("ok", ["true"], "1"), body)),
                   state=state_dir, check=False)
        assert proc.returncode == 2 and words in proc.stderr and "bad.yaml:" in proc.stderr
    assert status(state_dir) == {}


def test_status_with_slurmctld_unreachable_leaves_store(tmp_path: Path, state_dir: Path) -> None:
    spec = write(tmp_path / "s.yaml", job("sleeper", ["sleep", "60"], "1"))
    job_id = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"][0]["job_id"]
    before = status(state_dir)[job_id]
    # A copy of slurm.conf whose controller port nobody listens on: slurmctld is "down" for this client only.
    conf = tmp_path / "slurm.conf"
    text = Path("/etc/slurm/slurm.conf").read_text()
    conf.write_text("\n".join("SlurmctldPort=1" if l.startswith("SlurmctldPort") else l for l in text.splitlines()))
    shutil.copy("/etc/slurm/gres.conf", tmp_path / "gres.conf")
    down = cli("status", state=state_dir, check=False, env={"SLURM_CONF": str(conf)})
    assert down.returncode == 1
    assert "cannot reach Slurm" in down.stderr and "left as it was" in down.stderr
    after = status(state_dir)[job_id]
    assert after["state"] in (before["state"], "RUNNING", "COMPLETED")
    cli("cancel", str(job_id), state=state_dir)
