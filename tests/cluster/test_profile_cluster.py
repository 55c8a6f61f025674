"""`slurmhet profile` on the dev cluster: a model nobody measured is measured on each GPU type, and used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.helpers import accounting, cli, status

pytestmark = pytest.mark.usefixtures("slurm_cluster")

REPO = Path(__file__).resolve().parents[2]
#: The model's "true" speed: the emulation paces to it, the planner's table knows nothing of it. Paced, not
#: CPU-bound: at 1,200 samples/s (37.5 steps/s) the CPU step itself took longer than the pace on a loaded CI
#: machine (Slurm 26.05 measured 1,016), so the fastest type's pace leaves the CPU twice that time.
TRUTH = {"v100": 600.0, "t4": 240.0, "k80": 120.0}
SPEC = f"""\
jobs:
  - name: hidden
    workload: {{model: mlp-hidden, batch_size: 32}}
    command: [{sys.executable}, {REPO / "examples" / "train.py"}, --model, mlp-small, --steps, "100000",
              --global-batch, "32"]
    work: {{steps: 3000}}
    gpus: {{min: 1, max: 1}}
    time_limit: 10
"""


def test_profile_measures_an_unknown_model_and_every_later_plan_uses_it(tmp_path: Path, state_dir: Path,
                                                                         leftovers: list[str]) -> None:
    truth = tmp_path / "truth.yaml"
    truth.write_text("throughputs:\n  'mlp-hidden (batch size 32)': " + json.dumps(TRUTH) + "\n")
    spec = tmp_path / "hidden.yaml"
    spec.write_text(SPEC)
    env = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_EMULATION_TABLE": str(truth)}

    before = json.loads(cli("plan", "--json", str(spec), state=state_dir).stdout)["jobs"][0]
    assert all(cell["source"] == "prior" for cell in before["throughput"].values())  # planned, not refused

    out = cli("profile", "--steps", "60", "--json", str(spec), state=state_dir, env=env, timeout=900)
    profiles = {p["gpu_type"]: p for p in json.loads(out.stdout)["profiles"]}
    assert set(profiles) == set(TRUTH)
    for gpu, rate in TRUTH.items():
        row = profiles[gpu]
        assert row["state"] == "COMPLETED" and row["samples_per_s"] == pytest.approx(rate, rel=0.15), row
        assert row["ratio"] == pytest.approx(rate / max(TRUTH.values()), rel=0.2)
        [record] = [r for r in accounting(row["slurm_job_ids"]) if not r.id.is_step]
        assert record.alloc_tres.get(f"gres/gpu:{gpu}") == 1  # each run on its own type, one GPU
        # Stopped by its launcher once measured, the run ends: it does not requeue itself as a preemption would.
        history = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", row["slurm_job_ids"][0]],
                                 capture_output=True, text=True, check=True, timeout=60).stdout.split()
        assert history == ["COMPLETED"], history
    rows = status(state_dir)
    assert {rows[p["stored_job_id"]]["name"] for p in profiles.values()} == {f"hidden.profile-{g}" for g in TRUTH}

    after = json.loads(cli("plan", "--json", str(spec), state=state_dir).stdout)["jobs"][0]
    assert after["throughput_priors"] == []
    for gpu, rate in TRUTH.items():
        cell = after["throughput"][gpu]
        assert cell["source"] == "profile" and cell["samples_per_s"] == pytest.approx(rate, rel=0.15), cell
    assert after["gpus_by_type"] == {"v100": 1}  # the measured fastest type

    # Everything is measured now: --profile-first runs nothing more and submits the job itself.
    sub = cli("submit", "--profile-first", "--json", str(spec), state=state_dir, env=env)
    [job] = json.loads(sub.stdout)["jobs"]
    leftovers.extend(job["slurm_job_ids"])
    assert job["state"] == "SUBMITTED" and job["allocation"].startswith("1xv100")
    assert len(status(state_dir)) == len(TRUTH) + 1
