"""Golden sbatch scripts. After an intended template change regenerate with `make goldens`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from slurmhet.emit.requests import BatchRequest, Common, Launch, Materialized

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
REGEN = os.environ.get("SLURMHET_REGEN_GOLDENS") == "1"
HOSTILE_NAME = "it's; $(rm -rf /)\n`x`"
HOSTILE_ARGV = ("bash", "-c", 'echo "$1"', "--", "a'b; $(touch pwned)\nline2 `y` \"q\"")


def _common(name: str = "resnet18") -> Common:
    return Common(job_id=42, name=name, log_dir="/var/log/slurmhet", time_limit_min=90, partition="gpu",
                  extra=(("account", "ml"), ("exclusive", None)))


LAUNCHER = ("/opt/slurmhet/bin/python", "-m", "slurmhet", "run", "--")
CASES: dict[str, BatchRequest] = {
    "batch-gres": BatchRequest(_common(), Launch(("python", "train.py", "--epochs", "2"), LAUNCHER), "t4", 2,
                               gpu_request_style="gres", shard_weights=(0.5, 0.5)),
    "batch-gpus-per-node": BatchRequest(_common(), Launch(("python", "train.py"), LAUNCHER, (("OMP_NUM_THREADS", "4"),)),
                                        "v100", 4, nodes=2, nodelist=("nodea", "nodex"),
                                        gpu_request_style="gpus-per-node"),
    "batch-hostile": BatchRequest(_common(HOSTILE_NAME), Launch(HOSTILE_ARGV, LAUNCHER), "k80", 1),
}


def _text(m: Materialized) -> str:
    return m.script + "\n# --- argv ---\n" + json.dumps(m.sbatch_argv(), indent=1) + "\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    path = GOLDEN / f"{name}.txt"
    text = _text(CASES[name].materialize())
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run `make goldens`"
    assert text == path.read_text(), f"{path} differs; if intended, run `make goldens` and review the diff"


def test_hostile_values_stay_data(tmp_path: Path) -> None:
    """Run the rendered hostile script with stand-in srun/launcher: the argv arrives byte-exact."""
    m = CASES["batch-hostile"].materialize()
    assert "\n#SBATCH" not in m.script  # options never reach sbatch's script parser
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env python3\nimport json,sys\n"
        f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", m.script], check=True, env=env, cwd=tmp_path)
    got = json.loads(record.read_text())
    assert got[-len(HOSTILE_ARGV):] == list(HOSTILE_ARGV)
    assert not (tmp_path / "pwned").exists()
    name_opt = [a for a in m.argv if a.startswith("--job-name=")][0]
    assert all(c.isalnum() or c in "._+-=" for c in name_opt.removeprefix("--job-name"))
