"""Every command's ``--json`` is exactly one JSON document on stdout, against the real dev cluster."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster.helpers import cli, job, wait_for, write


def test_every_json_output_is_one_document(tmp_path: Path, state_dir: Path) -> None:
    spec = write(tmp_path / "one.yaml", job("json-probe", ["true"], "1"))
    documents = {}
    for argv in (("cluster", "--json"), ("plan", "--json", str(spec)), ("submit", "--dry-run", "--json", str(spec)),
                 ("submit", "--json", str(spec))):
        documents[argv[0] + (" --dry-run" if "--dry-run" in argv else "")] = json.loads(
            cli(*argv, state=state_dir).stdout)
    job_id = documents["submit"]["jobs"][0]["job_id"]
    wait_for(state_dir, [job_id])
    for argv in (("status", "--json"), ("replan", "--once", "--dry-run", "--json"), ("report", "--json"),
                 ("bench", "emit", "--jobs", "10", "--json"), ("explain", str(job_id), "--json"),
                 ("plan", "--cluster", "v100:2", "--json", str(spec))):
        documents[" ".join(argv[:1] + (("--cluster",) if "--cluster" in argv else ()))] = json.loads(
            cli(*argv, state=state_dir, timeout=300).stdout)
    documents["status ID"] = json.loads(cli("status", str(job_id), "--json", state=state_dir).stdout)
    assert documents["status ID"]["id"] == job_id and documents["explain"]["job"] == job_id
    # `true` reports no progress: the profile measures nothing, says so (exit 1), and still prints one document.
    profiled = cli("profile", "--steps", "5", "--types", "k80", "--json", str(spec), state=state_dir, check=False)
    assert profiled.returncode == 1 and "measured nothing" in profiled.stderr
    assert [(p["gpu_type"], p["samples_per_s"]) for p in json.loads(profiled.stdout)["profiles"]] == [("k80", None)]
    assert documents["plan --cluster"]["cluster"]["source"] == "--cluster"
    assert documents["submit --dry-run"]["jobs"] and documents["plan"]["jobs"]
    assert any(row["id"] == job_id for row in documents["status"]["jobs"])
    assert documents["cluster"]["gpus_by_type"]
    assert documents["bench"]["array_jobs_per_s"] > 0
