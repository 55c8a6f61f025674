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
                 ("bench", "emit", "--jobs", "10", "--json")):
        documents[argv[0]] = json.loads(cli(*argv, state=state_dir, timeout=300).stdout)
    assert documents["submit --dry-run"]["jobs"] and documents["plan"]["jobs"]
    assert any(row["id"] == job_id for row in documents["status"]["jobs"])
    assert documents["cluster"]["gpus_by_type"]
    assert documents["bench"]["array_jobs_per_s"] > 0
