"""`slurmhet logs --follow` and `status ID` on the dev cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.helpers import cli, job, wait_until_empty, write

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def test_logs_follow_a_het_job_until_it_ends_and_status_id_shows_it_whole(tmp_path: Path, state_dir: Path,
                                                                          leftovers: list[str]) -> None:
    wait_until_empty()  # the placement asserted below needs every v100 and two t4s free
    script = "echo start rank=$RANK type=$SLURMHET_GPU_TYPE; echo warn rank=$RANK >&2; sleep 8; echo end rank=$RANK"
    spec = write(tmp_path / "het.yaml", job("het-logs", ["bash", "-c", script], "{min: 6, max: 6, types: [v100, t4]}"))
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    assert out["state"] == "SUBMITTED" and "v100" in out["allocation"] and "t4" in out["allocation"]
    job_id, (slurm_id,) = out["job_id"], out["slurm_job_ids"]

    followed = cli("logs", "--follow", str(job_id), state=state_dir, timeout=300)  # returns when the job ends
    lines = followed.stdout.splitlines()
    assert lines[0].startswith(f"==> part 1: Slurm job {slurm_id} (het; 4xv100 on nodea + 2xt4 on nodeb")
    assert lines[-1] == f"==> job {job_id} COMPLETED <=="
    starts = sorted(line for line in lines if line.startswith("start rank="))
    assert starts == sorted([f"start rank={r} type=v100" for r in range(4)] + [f"start rank={r} type=t4"
                                                                                for r in range(4, 6)])
    assert sum(line.startswith("end rank=") for line in lines) == 6

    one = cli("logs", "--part", "1", str(job_id), state=state_dir).stdout
    assert one.startswith(f"==> part 1: Slurm job {slurm_id} (het;") and "COMPLETED) <==" in one.splitlines()[0]
    # The finished job's one part, the same bytes as followed (its header now says COMPLETED).
    assert one.split("\n", 1)[1] == followed.stdout.rsplit("==> job", 1)[0].split("\n", 1)[1]
    assert "warn rank=" not in followed.stdout and "warn rank=" not in one  # stdout only
    # stderr is its own file per part: `--stderr` shows it, and plain `logs` says the part wrote some.
    plain = cli("logs", str(job_id), state=state_dir)
    assert f"(part 1 also wrote to stderr: slurmhet logs {job_id} --stderr --part 1)" in plain.stderr
    errors = cli("logs", "--stderr", str(job_id), state=state_dir).stdout.splitlines()
    assert errors[0].startswith(f"==> part 1: Slurm job {slurm_id} (het;") and errors[0].endswith(" stderr <==")
    assert sorted(errors[1:]) == sorted(f"warn rank={r}" for r in range(6))
    bad = cli("logs", "--part", "2", str(job_id), state=state_dir, check=False)
    assert bad.returncode == 2 and "has 1 part(s) with output" in bad.stderr

    detail = json.loads(cli("status", str(job_id), "--json", state=state_dir).stdout)
    assert detail["state"] == "COMPLETED" and detail["times"]["actual_jct_s"] > 0
    assert sorted((p["het_offset"], p["gpu_type"], p["gpus"]) for p in detail["slurm"]) == [(0, "v100", 4),
                                                                                          (1, "t4", 2)]
    assert [Path(log["path"]).name for log in detail["logs"]] == [f"slurmhet-{job_id}-{slurm_id}.out"]
    assert [Path(log["stderr"]).name for log in detail["logs"]] == [f"slurmhet-{job_id}-{slurm_id}.err"]
    assert {"stored", "submitted"} <= {e["kind"] for e in detail["events"]}
    text = cli("status", str(job_id), state=state_dir).stdout
    assert f"job {job_id} 'het-logs'" in text and "speed on v100:" in text and "log: " in text
