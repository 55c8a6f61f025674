"""Planning without Slurm: `plan --cluster`, `submit --dry-run --cluster`, and the cached inventory fallback.

Every command runs as a real process whose PATH holds no Slurm command, so any attempt to ask Slurm
fails loudly instead of passing silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

UNPROFILED = """\
jobs:
  - name: mynet
    workload: {model: my-net, batch_size: 32, samples_per_s_hint: {t4: 900}}
    model_size_mb: 40
    command: [python, train.py, --lr, "1e-3; rm -rf /"]
    work: {steps: 2000}
    gpus: {min: 1, max: 2}
  - name: nobody-knows
    workload: {model: never-seen, batch_size: 16}
    command: [python, train.py]
    work: {steps: 500}
  - name: after-both
    after: [mynet, nobody-knows]
    workload: {model: never-seen, batch_size: 16}
    command: [python, eval.py]
    work: {steps: 5}
"""


def slurmhet(args: list[str], state: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "no-slurm-bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMHET_")}
    # The table named outright: a dev cluster's site config (/etc/slurmhet) must not decide what this test sees.
    env.update(PATH=str(empty), SLURMHET_STATE_DIR=str(state), HOME=str(tmp_path),
               SLURMHET_THROUGHPUT_TABLE=str(Path(__file__).resolve().parents[2] / "etc/throughput/devcluster.yaml"))
    return subprocess.run([sys.executable, "-m", "slurmhet", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(UNPROFILED)
    return path


def test_plan_for_a_cluster_shape_plans_unprofiled_models_with_flagged_priors(tmp_path: Path, spec: Path) -> None:
    state = tmp_path / "state"
    done = slurmhet(["plan", str(spec), "--cluster", "v100:4,t4:8", "--json"], state, tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["cluster"] == {"source": "--cluster", "note": "planned for --cluster v100:4,t4:8; Slurm was not asked",
                               "gpus_by_type": {"t4": 8, "v100": 4}}
    jobs = {j["job"]: j for j in data["jobs"]}
    assert set(jobs) == {"mynet", "nobody-knows"}
    assert data["waiting"] == [{"job": "after-both", "reason": "waits for mynet, nobody-knows to complete (after:)"}]
    for job in jobs.values():
        assert job["gpus_by_type"] and set(job["throughput_priors"]) == set(job["gpus_by_type"])
        assert all(cell["source"] == "prior" for cell in job["throughput"].values())
    mine = jobs["mynet"]["throughput"]
    assert mine["t4"]["samples_per_s"] == 900.0 and mine["t4"]["provenance"] == "hint in spec 'mynet'"
    assert "catalog v100/t4" in mine["v100"]["provenance"]
    assert "default" in jobs["nobody-knows"]["throughput"]["v100"]["provenance"]
    assert not state.exists()  # nothing stored, nothing cached: Slurm was never asked


def test_submit_dry_run_for_a_cluster_shape_renders_without_slurm(tmp_path: Path, spec: Path) -> None:
    state = tmp_path / "state"
    done = slurmhet(["submit", "--dry-run", "--cluster", "v100:2,t4:2", "--gpus-per-node", "2", str(spec)],
                    state, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "# job 'mynet'" in done.stdout and "# job 'nobody-knows'" in done.stdout
    assert "# job 'after-both': waiting (waits for mynet, nobody-knows to complete (after:))" in done.stdout
    assert "'1e-3; rm -rf /'" in done.stdout  # the spec's argument reaches the script quoted
    assert "--gpus-per-node=" in done.stdout  # never seen the site: rendered for a generic cons_tres Slurm
    assert "planned for --cluster v100:2,t4:2" in done.stderr
    assert not state.exists()


def test_without_slurm_plan_uses_the_cached_inventory_and_says_so(tmp_path: Path, spec: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "inventory.yaml").write_text(
        "nodes:\n- {name: nodea, gpus: {v100: 4}, cpus: 32, memory_mb: 64000}\n- {name: nodeb, gpus: {t4: 4}}\n")
    done = slurmhet(["plan", str(spec)], state, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Slurm cannot be reached: planned on the inventory cached" in done.stderr
    assert "nodea" in done.stdout or "nodeb" in done.stdout


def test_without_slurm_or_cache_plan_exits_2_pointing_at_cluster(tmp_path: Path, spec: Path) -> None:
    done = slurmhet(["plan", str(spec)], tmp_path / "state", tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("slurmhet: error: --cluster: Slurm cannot be reached")
    assert "scontrol not found" in line and "--cluster v100:4,t4:8" in line


@pytest.mark.parametrize(("args", "words"), [
    (["plan", "{spec}", "--cluster", "v100:four"], "--cluster: bad cluster spec entry 'v100:four'"),
    (["plan", "{spec}", "--cluster", "{missing}.yaml"], "cannot read cluster file"),
    (["submit", "{spec}", "--cluster", "v100:4"], "--cluster: --cluster plans for a shape"),
    (["plan", "{spec}", "--cluster", "rtx2080ti:4"], "'rtx2080ti' is not in the GPU catalog"),
    (["plan", "{spec}", "--cluster", "{broken}"], "broken.yaml:2:1: YAML syntax error: expected the node content"),
])
def test_bad_cluster_input_exits_2_with_one_line(tmp_path: Path, spec: Path, args: list[str], words: str) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [\n")
    argv = [a.format(spec=spec, missing=tmp_path / "nope", broken=broken) for a in args]
    done = slurmhet(argv, tmp_path / "state", tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("slurmhet: error: ")]
    assert len(errors) == 1 and words in errors[0] and "(hint: " in errors[0], done.stderr
    assert all(line.startswith(("slurmhet: error: ", "slurmhet: note: ")) for line in done.stderr.splitlines()), \
        done.stderr  # the error on one line, whatever the YAML parser wrote
    assert not (tmp_path / "state").exists()
