"""replan, report and faults on the real dev cluster (issue 8).

Every test checks Slurm's own view (squeue --json / sacct, matched by the
``slurmhet:<id>@<store>`` comment tag) as well as the store (``slurmhet status
--json`` or the store's tables). The dev cluster is shared: foreign jobs may
delay ours, so waits have deadlines, never fixed sleeps for outcomes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmhet.replan import MAX_SUBMIT_ATTEMPTS
from tests.cluster.helpers import ANY_ONE, SLURMHET, accounting, cli, never_ran, status, user_python, wait_for
from tests.cluster.replan_helpers import (SLURM, adopted_by, attempts, db_snapshot, elapsed_seconds,
                                          events, job, kill_group, live_tagged, recorded_parts, release_sbatch, replan,
                                          sacct_rows, scancel, slow_sbatch, slurm_jobs_of_store, squeue_state,
                                          start_cli, store_tag, store_waiting_jobs, submit, submitted_by,
                                          usable_gpus, wait_file_lines, write)

pytestmark = pytest.mark.usefixtures("slurm_cluster")

FINAL = ("COMPLETED", "FAILED", "CANCELLED")


@pytest.fixture
def since() -> datetime:
    """sacct window start for this test (a little slack for clock rounding)."""
    return datetime.now() - timedelta(seconds=10)




def one_slurm_job_each(tag: str, since: datetime, job_ids: list[int]) -> dict[int, str]:
    """Assert each slurmhet job has exactly one Slurm job (by comment tag); returns {job: Slurm id}."""
    seen = slurm_jobs_of_store(tag, since)
    counts = {j: sorted(seen.get(j, {})) for j in job_ids}
    assert all(len(ids) == 1 for ids in counts.values()), f"Slurm jobs per slurmhet job: {counts}"
    return {j: ids[0] for j, ids in counts.items()}


def replan_until_done(state: Path, job_ids: list[int], timeout: float) -> tuple[dict[int, dict[str, Any]], int]:
    """Replan, look, repeat, until every job is final; returns the rows and how many replans it took."""
    deadline, rounds = time.monotonic() + timeout, 0
    while True:
        replan(state)
        rounds += 1
        rows = status(state)
        if all(rows[i]["state"] in FINAL for i in job_ids):
            return rows, rounds
        if time.monotonic() > deadline:
            raise AssertionError(f"not final after {rounds} replans / {timeout}s: "
                                 f"{ {i: rows[i]['state'] for i in job_ids} }")
        time.sleep(2)


# --------------------------------------------------------------------------- 1. idempotence


def test_replan_is_idempotent_and_submits_waiting_jobs_when_gpus_free(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    gpus = usable_gpus()
    n = gpus + 2
    # Each job runs until the test lets it go (at most 5 minutes), so no GPU frees between the two replans
    # however slow they are; a fixed sleep raced them on a loaded machine.
    go = tmp_path / "go"
    hold = ["sh", "-c", 'i=0; until [ -e "$1" ] || [ "$i" -ge 300 ]; do sleep 1; i=$((i + 1)); done', "hold", str(go)]
    out = submit(state_dir, write(tmp_path / "many.yaml", *[job(f"many{i}", hold) for i in range(n)]))
    ids = [o["job_id"] for o in out]
    started = [o["job_id"] for o in out if o["state"] == "SUBMITTED"]
    waiting = [o["job_id"] for o in out if o["state"] == "PENDING"]
    assert len(started) == gpus and len(waiting) == 2, out
    assert all(o["reason"] for o in out if o["state"] == "PENDING")
    tag = store_tag(state_dir)

    first = replan(state_dir)
    before = slurm_jobs_of_store(tag, since)
    rows_before = status(state_dir)
    logged = [e for e in events(state_dir) if e[1] != "state"]  # state changes are Slurm's news, not replan's
    second = replan(state_dir)
    after = slurm_jobs_of_store(tag, since)
    assert second.stdout.strip() == "slurmhet replan: nothing to do", (first.stdout, second.stdout)
    assert [e for e in events(state_dir) if e[1] != "state"] == logged  # no submit, cancel, adopt or reset
    assert {j: set(s) for j, s in after.items()} == {j: set(s) for j, s in before.items()}
    assert set(after) == set(started)  # the waiting jobs are still not in Slurm
    assert all(state in ("PENDING", "RUNNING", "COMPLETING") for s in after.values() for state in s.values())
    assert {i: r["slurm"] and r["slurm"][0]["id"] for i, r in status(state_dir).items()} == \
        {i: r["slurm"] and r["slurm"][0]["id"] for i, r in rows_before.items()}

    go.touch()
    wait_for(state_dir, started, timeout=180)
    third = replan(state_dir)
    assert set(submitted_by(third.stdout)) == set(waiting), third.stdout
    rows = wait_for(state_dir, ids, timeout=180)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids), rows
    slurm_ids = one_slurm_job_each(tag, since, ids)
    final = {r.id.job: r.state for r in accounting(list(slurm_ids.values())) if not r.id.is_step}
    assert set(final.values()) == {"COMPLETED"}, final


# --------------------------------------------------------------------------- 2. fifty concurrent submits


class DuplicateSubmission(AssertionError):
    """A slurmhet job submitted to Slurm more than once (the bug these tests guard against)."""


def duplicates(tag: str, since: datetime, job_ids: list[int]) -> dict[int, list[str]]:
    seen = slurm_jobs_of_store(tag, since)
    return {j: sorted(seen[j]) for j in job_ids if len(seen.get(j, {})) > 1}


def test_fifty_concurrent_submits_store_and_submit_each_job_once(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    specs = [write(tmp_path / f"c{i}.yaml", job(f"concurrent{i}", ["true"])) for i in range(50)]
    env = {**os.environ, "SLURMHET_STATE_DIR": str(state_dir)}
    t0 = time.monotonic()
    procs = [subprocess.Popen([*SLURMHET, "submit", "--json", str(s)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for s in specs]
    results = [(p.communicate(timeout=600), p.returncode) for p in procs]
    submit_s = time.monotonic() - t0
    failed = [(rc, err) for (_, err), rc in results if rc != 0]
    assert not failed, failed[:3]
    outcomes = [json.loads(out)["jobs"][0] for (out, _), _ in results]
    ids = [o["job_id"] for o in outcomes]
    assert len(set(ids)) == 50
    rows = status(state_dir)
    assert sorted(rows) == sorted(ids)  # stored once each, nothing else
    assert sorted(r["name"] for r in rows.values()) == sorted(f"concurrent{i}" for i in range(50))
    tag = store_tag(state_dir)
    early = duplicates(tag, since, ids)  # already in Slurm more than once, straight after the submits

    rows, rounds = replan_until_done(state_dir, ids, timeout=300)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids)
    seen = slurm_jobs_of_store(tag, since)
    assert all(seen.get(i) for i in ids), {i: seen.get(i) for i in ids}  # none lost
    print(f"50 submits in {submit_s:.0f}s ({sum(o['state'] == 'SUBMITTED' for o in outcomes)} said SUBMITTED), "
          f"{rounds} replans to finish, {time.monotonic() - t0:.0f}s in all; "
          f"{len(early)} job(s) in Slurm twice or more: {early}")
    if early or duplicates(tag, since, ids):
        raise DuplicateSubmission(f"{len(early)} of 50 jobs were submitted more than once: {early}")
    assert len({s for i in ids for s in seen[i]}) == 50


def test_submits_queued_on_the_lock_each_dispatch_their_job_once(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    """Deterministic form of the race above: two submits store their job while a replan holds the lock."""
    store_waiting_jobs(state_dir, tmp_path, 1, ["true"])
    tag = store_tag(state_dir)
    # The holder's sbatch stalls until both submits have stored (an 8 s stall was too short on a loaded machine).
    slow_env, noted = slow_sbatch(tmp_path / "slowbin", 90)
    holder = start_cli(state_dir, "replan", env=slow_env)
    wait_file_lines(noted, 1, proc=holder)
    specs = [write(tmp_path / f"q{i}.yaml", job(f"queued{i}", ["true"])) for i in range(2)]
    submits = [start_cli(state_dir, "submit", "--json", str(spec)) for spec in specs]
    deadline = time.monotonic() + 60
    while len([e for e in events(state_dir, kind="stored") if e[2].endswith(("q0.yaml", "q1.yaml"))]) < 2:
        assert time.monotonic() < deadline and holder.poll() is None, "both submits should store while the lock is held"
        time.sleep(0.1)
    release_sbatch(noted)
    holder.communicate(timeout=120)
    assert holder.returncode == 0
    outs = [p.communicate(timeout=180) for p in submits]
    assert [p.returncode for p in submits] == [0, 0], outs
    ids = [json.loads(out)["jobs"][0]["job_id"] for out, _ in outs]
    dups = duplicates(tag, since, ids)
    if dups:
        raise DuplicateSubmission(f"submitted more than once: {dups}; submit outputs: {[o for o, _ in outs]}")
    one_slurm_job_each(tag, since, ids)


# --------------------------------------------------------------------------- 3. overlapping replans


def test_two_replans_started_together_submit_each_job_once(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    ids = store_waiting_jobs(state_dir, tmp_path, 4, ["true"])
    tag = store_tag(state_dir)
    assert not any(slurm_jobs_of_store(tag, since).get(i) for i in ids)
    procs = [start_cli(state_dir, "replan"), start_cli(state_dir, "replan")]
    outs = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert [rc for _, _, rc in outs] == [0, 0], outs
    did = [submitted_by(out) for out, _, _ in outs]
    workers = [d for d in did if d]
    assert len(workers) == 1, outs  # the other one found the lock held, or came after and found nothing to do
    assert set(workers[0]) == set(ids)
    idle = outs[[bool(d) for d in did].index(False)][0]
    assert "already running" in idle or not submitted_by(idle), idle
    one_slurm_job_each(tag, since, ids)


def test_replan_holding_the_lock_turns_a_second_one_away(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    ids = store_waiting_jobs(state_dir, tmp_path, 3, ["true"])
    tag = store_tag(state_dir)
    slow_env, noted = slow_sbatch(tmp_path / "slowbin", 5)
    holder = start_cli(state_dir, "replan", env=slow_env)
    wait_file_lines(noted, 1, proc=holder)  # inside its first sbatch: it holds the lock for >= 10 s more
    second = replan(state_dir)
    assert second.returncode == 0 and second.stdout.strip() == "slurmhet replan: already running", second.stdout
    assert holder.poll() is None, "the lock holder ended before the second replan was turned away"
    out, err = holder.communicate(timeout=300)
    assert holder.returncode == 0, err
    assert set(submitted_by(out)) == set(ids), out
    noted_ids = noted.read_text().split()
    assert sorted(one_slurm_job_each(tag, since, ids).values()) == sorted(noted_ids)


# --------------------------------------------------------------------------- 4. kill -9 midway


def test_replan_killed_midway_loses_and_duplicates_nothing(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    """kill -9 as soon as squeue shows the first Slurm job; the next replan repairs everything."""
    ids = store_waiting_jobs(state_dir, tmp_path, 8, ["sleep", "3"])
    tag = store_tag(state_dir)
    proc = start_cli(state_dir, "replan")
    deadline = time.monotonic() + 120
    while not any(set(served) & set(ids) for served in live_tagged(tag).values()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "replan submitted nothing in 120 s"
        time.sleep(0.02)
    os.kill(proc.pid, 9)  # the replan process only; an sbatch it started may still finish
    proc.communicate(timeout=30)
    assert proc.returncode == -9
    time.sleep(2)  # let an in-flight sbatch land
    in_slurm = slurm_jobs_of_store(tag, since)
    recorded = recorded_parts(state_dir)
    submitted_before = {j for j in ids if in_slurm.get(j)}
    recorded_before = {j for j in ids if recorded.get(j)}
    assert 1 <= len(submitted_before) < len(ids) and recorded_before <= submitted_before, (in_slurm, recorded)
    orphans = submitted_before - recorded_before

    again = replan(state_dir)
    assert set(adopted_by(again.stdout)) == orphans, again.stdout
    assert set(submitted_by(again.stdout)) == set(ids) - submitted_before, again.stdout
    slurm_ids = one_slurm_job_each(tag, since, ids)
    rows = status(state_dir)
    for job_id in ids:
        parts = rows[job_id]["slurm"]
        assert [p["id"] for p in parts] == [slurm_ids[job_id]], (job_id, parts)
        assert parts[0]["role"] == "batch", parts  # an orphan recorded as its cut-off dispatch would have
    assert {e[0] for e in events(state_dir, kind="adopted")} == orphans
    rows = wait_for(state_dir, ids, timeout=180)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids), rows
    one_slurm_job_each(tag, since, ids)
    print(f"killed after {len(submitted_before)} of {len(ids)} sbatch calls; {len(orphans)} orphan(s) adopted")


def _killed_between_sbatch_and_record(tmp_path: Path, state_dir: Path, since: datetime) -> tuple[list[int], str, int]:
    """Waiting jobs, then a replan killed while its first sbatch has run but not answered.

    Returns (job ids, the orphan Slurm id, the orphan's slurmhet job id).
    """
    ids = store_waiting_jobs(state_dir, tmp_path, 4, ["sleep", "2"])
    tag = store_tag(state_dir)
    slow_env, noted = slow_sbatch(tmp_path / "slowbin", 120)
    proc = start_cli(state_dir, "replan", env=slow_env)
    (orphan,) = wait_file_lines(noted, 1, proc=proc)
    kill_group(proc)  # kill -9 the replan and its stalled sbatch: Slurm has the job, the store does not
    in_slurm = {j: s for j, s in slurm_jobs_of_store(tag, since).items() if j in ids}
    owners = [j for j, s in in_slurm.items() if orphan in s]
    assert len(owners) == 1 and sum(len(s) for s in in_slurm.values()) == 1, in_slurm
    assert not any(recorded_parts(state_dir).get(j) for j in ids)
    assert {status(state_dir)[j]["state"] for j in ids} == {"PENDING"}
    return ids, orphan, owners[0]


def test_replan_killed_between_sbatch_and_record_adopts_the_orphan(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    ids, orphan, owner = _killed_between_sbatch_and_record(tmp_path, state_dir, since)
    again = replan(state_dir)
    assert adopted_by(again.stdout) == {owner: orphan}, again.stdout
    assert set(submitted_by(again.stdout)) == set(ids) - {owner}, again.stdout
    slurm_ids = one_slurm_job_each(store_tag(state_dir), since, ids)
    assert slurm_ids[owner] == orphan
    row = status(state_dir)[owner]
    assert [(p["id"], p["role"]) for p in row["slurm"]] == [(orphan, "batch")]
    # From the dispatch's mark: the GPUs it asked for, which report and the failure rules read.
    assert row["slurm"][0]["gpu_type"] in ("v100", "t4", "k80") and row["slurm"][0]["gpus"] == 1, row
    assert [e[0] for e in events(state_dir, kind="adopted")] == [owner]
    rows = wait_for(state_dir, ids, timeout=180)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids), rows
    one_slurm_job_each(store_tag(state_dir), since, ids)


def _squeue_leaving_out(directory: Path, hidden: str) -> dict[str, str]:
    """A PATH entry whose ``squeue --json`` leaves out Slurm job ``hidden``, as squeue does once an ended job is
    older than MinJobAge (300 s on the dev cluster, as on most sites); every other answer is the real squeue's."""
    real = shutil.which("squeue")
    assert real, "squeue is not installed"
    directory.mkdir(parents=True, exist_ok=True)
    stand_in = directory / "squeue"
    stand_in.write_text(f"""#!{sys.executable}
import json, subprocess, sys
out = subprocess.run([{real!r}, *sys.argv[1:]], capture_output=True, text=True)
sys.stderr.write(out.stderr)
if out.returncode or "--json" not in sys.argv:
    sys.stdout.write(out.stdout)
    sys.exit(out.returncode)
data = json.loads(out.stdout)
data["jobs"] = [j for j in data["jobs"] if str(j.get("job_id")) != {hidden!r}]
json.dump(data, sys.stdout)
""")
    stand_in.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ.get('PATH', '')}"}


def _slurmdbd_behind(directory: Path, hidden: str, backlog: int) -> dict[str, str]:
    """PATH entries for slurmdbd lagging behind slurmctld (as after it was away): ``sdiag`` reports ``backlog``
    records still queued for it, and ``sacct`` does not list Slurm job ``hidden`` yet; squeue has forgotten it
    (:func:`_squeue_leaving_out`). Every other answer is the real command's."""
    env = _squeue_leaving_out(directory, hidden)
    real = shutil.which("sacct")
    assert real, "sacct is not installed"
    (directory / "sacct").write_text(f"""#!{sys.executable}
import subprocess, sys
out = subprocess.run([{real!r}, *sys.argv[1:]], capture_output=True, text=True)
sys.stderr.write(out.stderr)
keep = [l for l in out.stdout.splitlines(True) if l.split("|")[0].split(".")[0].split("_")[0].strip() != {hidden!r}]
sys.stdout.write("".join(keep))
sys.exit(out.returncode)
""")
    (directory / "sdiag").write_text(f"#!/bin/sh\necho 'DBD Agent queue size: {backlog}'\n")
    for name in ("sacct", "sdiag"):
        (directory / name).chmod(0o755)
    return env


def test_a_killed_replans_orphan_that_ended_and_left_the_queue_is_adopted_from_sacct_not_run_again(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    """No replan looked until the orphan had run, ended, and left squeue (stood in for: an squeue that leaves it
    out). The dispatch's mark says it was cut off, so the next replan asks sacct, finds the orphan by its tag,
    and records its job COMPLETED instead of submitting it a second time. While slurmdbd is behind (stood in for:
    sdiag's backlog, a sacct that does not list the orphan yet), the job waits rather than run again."""
    ids, orphan, owner = _killed_between_sbatch_and_record(tmp_path, state_dir, since)
    [ended] = [r for r in accounting([orphan], timeout=120) if not r.id.is_step]
    assert ended.state == "COMPLETED", ended
    # First slurmdbd lags: sacct does not list the orphan yet, and its absence proves nothing. Its job waits.
    lagging = replan(state_dir, env=_slurmdbd_behind(tmp_path / "lagging", orphan, 5))
    assert adopted_by(lagging.stdout) == {} and set(submitted_by(lagging.stdout)) == set(ids) - {owner}, lagging.stdout
    assert (f"job {owner}: its dispatch was cut off and slurmdbd is 5 record(s) behind: not dispatched again until "
            "sacct can say whether sbatch took it") in lagging.stdout, lagging.stdout
    assert status(state_dir)[owner]["state"] == "PENDING"
    again = replan(state_dir, env=_squeue_leaving_out(tmp_path / "aged", orphan))
    assert adopted_by(again.stdout) == {owner: orphan} and submitted_by(again.stdout) == {}, again.stdout
    row = status(state_dir)[owner]
    assert row["state"] == "COMPLETED" and [(p["id"], p["role"]) for p in row["slurm"]] == [(orphan, "batch")], row
    [(_, _, found)] = events(state_dir, owner, kind="adopted")
    assert found == f"Slurm job {orphan} found by its comment tag, ended COMPLETED", found
    rows = wait_for(state_dir, ids, timeout=180)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids), rows
    one_slurm_job_each(store_tag(state_dir), since, ids)


def test_submit_after_a_killed_replan_does_not_resubmit_the_orphan(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    ids, orphan, owner = _killed_between_sbatch_and_record(tmp_path, state_dir, since)
    new = submit(state_dir, write(tmp_path / "new.yaml", job("newcomer", ["true"])))
    assert [n["state"] for n in new] == ["SUBMITTED"], new
    seen = slurm_jobs_of_store(store_tag(state_dir), since)
    if sorted(seen[owner]) != [orphan]:
        raise DuplicateSubmission(f"job {owner} is in Slurm as {sorted(seen[owner])}, orphan {orphan}")


# --------------------------------------------------------------------------- 5. slurmctld unreachable


def _unreachable_conf(directory: Path, same_stamp: bool) -> Path:
    """A copy of slurm.conf whose controller port nobody listens on.

    Stopping the shared slurmctld would break the other engineers' runs, so slurmctld is made
    unreachable for this client only. With ``same_stamp`` the copy keeps the real file's size
    and mtime, so slurmhet's cached site profile still matches and the replanner itself meets
    the failure (not the profile probe).
    """
    real = Path("/etc/slurm/slurm.conf")
    text = real.read_text()
    lines = text.splitlines(keepends=True)
    port = [i for i, line in enumerate(lines) if line.startswith("SlurmctldPort=")]
    assert port, "slurm.conf has no SlurmctldPort line"
    lines[port[0]] = "SlurmctldPort=1\n"
    bad = "".join(lines)
    if same_stamp:
        pad = len(text.encode()) - len(bad.encode())
        assert pad >= 2, pad
        bad += "#" * (pad - 1) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(bad)
    shutil.copy("/etc/slurm/gres.conf", directory / "gres.conf")
    if same_stamp:
        st = real.stat()
        os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert conf.stat().st_size == st.st_size
    return conf


@pytest.mark.parametrize("same_stamp", [False, True], ids=["profile-reprobed", "profile-cached"])
def test_replan_with_slurmctld_unreachable_fails_cleanly_and_next_run_recovers(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str], same_stamp: bool) -> None:
    t_setup = time.monotonic()
    ids = store_waiting_jobs(state_dir, tmp_path, 2, ["sleep", "2"])
    t_setup = time.monotonic() - t_setup
    tag = store_tag(state_dir)
    conf = _unreachable_conf(tmp_path / "unreachable", same_stamp)
    before = db_snapshot(state_dir)
    t0 = time.monotonic()
    down = replan(state_dir, check=False, env={"SLURM_CONF": str(conf)})
    took = time.monotonic() - t0
    message = " ".join(down.stderr.split())
    assert down.returncode == 1, (down.stdout, down.stderr)
    assert message.startswith("slurmhet: error: Slurm:") and "Unable to contact slurm controller" in message, message
    assert "Traceback" not in down.stderr and down.stdout == ""
    assert db_snapshot(state_dir) == before  # not a row changed, added or removed
    assert not any(slurm_jobs_of_store(tag, since).get(j) for j in ids)

    t_up = time.monotonic()
    up = replan(state_dir)
    assert set(submitted_by(up.stdout)) == set(ids), up.stdout
    t_up, t_done = time.monotonic() - t_up, time.monotonic()
    rows = wait_for(state_dir, ids, timeout=180)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids), rows
    one_slurm_job_each(tag, since, ids)
    print(f"setup {t_setup:.0f}s; unreachable replan failed after {took:.1f}s: {message}; recovering replan "
          f"{t_up:.1f}s; jobs done {time.monotonic() - t_done:.0f}s later")


# --------------------------------------------------------------------------- 6. node drained mid-run


def test_drained_node_displaces_a_pending_job_to_another_type(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    # slurmhet sends no job to wait behind someone else's GPUs (issue 14), so the job waits in Slurm by its
    # own choice: submitted held (`--hold`), as a user holding a job for later would.
    drain_tried = False
    try:
        (out,) = submit(state_dir, write(tmp_path / "tk.yaml",
                                         job("t4-or-k80", ["sleep", "2"], "{min: 1, max: 1, types: [t4, k80]}",
                                             "sbatch: ['--hold']\n")))
        assert out["state"] == "SUBMITTED" and out["allocation"] == "1xt4@nodeb", out
        job_id, (first,) = out["job_id"], out["slurm_job_ids"]
        leftovers.append(first)
        tag = store_tag(state_dir)
        assert squeue_state(first) == ("PENDING", "JobHeldUser"), squeue_state(first)
        calm = replan(state_dir)  # also records the cluster snapshot the drain is compared with
        assert "cancel" not in calm.stdout and not submitted_by(calm.stdout), calm.stdout

        drain_tried = True
        subprocess.run(["scontrol", "update", "nodename=nodeb", "state=drain", "reason=slurmhet-test"], check=True,
                       timeout=30)
        moved = replan(state_dir)
        assert "event: node nodeb became unavailable" in moved.stdout, moved.stdout
        assert f"cancel Slurm job(s) {first} of job {job_id}: nodes gone" in moved.stdout, moved.stdout
        resubmitted = submitted_by(moved.stdout)
        assert list(resubmitted) == [job_id] and f"1xk80@nodec Slurm {resubmitted[job_id][0]}" in moved.stdout
        (second,) = resubmitted[job_id]
        leftovers.append(second)
        subprocess.run(["scontrol", "release", second], check=True, timeout=30)  # the user's hold, lifted

        rows = wait_for(state_dir, [job_id], timeout=120)
        assert rows[job_id]["state"] == "COMPLETED"
        assert [(p["id"], p["role"], p["state"]) for p in rows[job_id]["slurm"]] == \
            [(first, "superseded", "CANCELLED"), (second, "batch", "COMPLETED")]
        records = {r.id.job: r for r in accounting([first, second]) if not r.id.is_step}
        assert records[first].state == "CANCELLED" and never_ran(records[first])
        assert records[second].state == "COMPLETED" and records[second].nodes == "nodec"
        assert records[second].gpus_by_type() == {"k80": 1}
        assert slurm_jobs_of_store(tag, since)[job_id] == {first: "CANCELLED", second: "COMPLETED"}
        assert [e[1] for e in events(state_dir, job_id) if e[1] == "displaced"] == ["displaced"]
    finally:
        if drain_tried:  # always undo our drain (a drained nodeb stalls everyone's t4 jobs), never someone else's
            subprocess.run(["scontrol", "update", "nodename=nodeb", "state=resume"], capture_output=True, timeout=30)


# --------------------------------------------------------------------------- 7. sbatch refusal retried


def test_refused_job_is_retried_by_replan_until_the_cap(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    spec = write(tmp_path / "refused.yaml",
                 job("refused", ["true"], ANY_ONE, "sbatch: ['--licenses=no-such-license:1']\n"))
    proc = cli("submit", "--json", str(spec), state=state_dir, check=False)
    assert proc.returncode == 1 and "SUBMIT_FAILED" in proc.stderr
    job_id = json.loads(proc.stdout)["jobs"][0]["job_id"]
    row = status(state_dir)[job_id]
    assert row["state"] == "SUBMIT_FAILED"
    assert "Invalid license specification" in row["reason"]
    assert attempts(state_dir, job_id) == 1
    for attempt in range(2, MAX_SUBMIT_ATTEMPTS + 1):
        out = replan(state_dir).stdout
        assert f"job {job_id} (refused): SUBMIT_FAILED" in out and "Invalid license" in out, out
        assert attempts(state_dir, job_id) == attempt
    failures = [e for e in events(state_dir, job_id) if e[1] == "submit_failed"]
    assert len(failures) == MAX_SUBMIT_ATTEMPTS and all("Invalid license" in e[2] for e in failures)
    capped = replan(state_dir)
    assert capped.stdout.strip() == "slurmhet replan: nothing to do", capped.stdout
    assert attempts(state_dir, job_id) == MAX_SUBMIT_ATTEMPTS
    assert len([e for e in events(state_dir, job_id) if e[1] == "submit_failed"]) == MAX_SUBMIT_ATTEMPTS
    row = status(state_dir)[job_id]
    assert row["state"] == "SUBMIT_FAILED" and row["slurm"] == []
    # Slurm refused every attempt outright: no job carries this store's tag.
    assert slurm_jobs_of_store(store_tag(state_dir), since) == {}


# --------------------------------------------------------------------------- 8. multi-user


TEST_USER = "slurmhet-test"


def test_other_user_cannot_see_or_cancel_roots_job(tmp_path: Path, state_dir: Path, pg_store: str) -> None:
    python = user_python(TEST_USER)
    if python is None:
        pytest.skip(f"{TEST_USER} cannot run a Python {sys.version_info.major}.{sys.version_info.minor} "
                    "with slurmhet's packages")
    interpreter, py_env = python
    home = Path(tempfile.mkdtemp(prefix="slurmhet-multiuser-", dir="/tmp"))
    shutil.chown(home, TEST_USER, TEST_USER)
    table = os.environ["SLURMHET_THROUGHPUT_TABLE"]
    user_env = {"HOME": str(home), "PATH": os.environ["PATH"], "SLURMHET_STATE_DIR": str(home / "state"),
                "SLURMHET_DB": pg_store, "SLURMHET_THROUGHPUT_TABLE": table, **py_env}

    def as_user(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", TEST_USER, "--", "env", "-i",
                               *[f"{k}={v}" for k, v in user_env.items()], *interpreter, "-m", "slurmhet", *args],
                              capture_output=True, text=True, cwd=home, timeout=180)

    root_env = {"SLURMHET_DB": pg_store}
    slurm_ids: list[str] = []
    try:
        (mine,) = submit(state_dir, write(tmp_path / "root.yaml", job("root-job", ["sleep", "60"])), env=root_env)
        assert mine["state"] == "SUBMITTED", mine
        slurm_ids += mine["slurm_job_ids"]
        spec = write(home / "user.yaml", job("user-job", ["sleep", "60"]))
        shutil.chown(spec, TEST_USER, TEST_USER)
        proc = as_user("submit", "--json", str(spec))
        assert proc.returncode == 0, proc.stderr
        (theirs,) = json.loads(proc.stdout)["jobs"]
        assert theirs["state"] == "SUBMITTED", theirs
        slurm_ids += theirs["slurm_job_ids"]
        users = {q.job_id: q.user for q in SLURM.queue(slurm_ids)}
        assert users == {mine["slurm_job_ids"][0]: "root", theirs["slurm_job_ids"][0]: TEST_USER}

        seen = as_user("status", "--json")
        assert seen.returncode == 0, seen.stderr
        assert [(r["id"], r["owner"]) for r in json.loads(seen.stdout)["jobs"]] == [(theirs["job_id"], TEST_USER)]
        refused = as_user("cancel", str(mine["job_id"]))
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert f"job {mine['job_id']} belongs to root" in " ".join(refused.stderr.split())
        everyone = as_user("status", "--all", "--json")
        assert everyone.returncode == 2 and "--all needs root" in " ".join(everyone.stderr.split())
        # Slurm still runs root's job, and the store still has it live.
        assert squeue_state(mine["slurm_job_ids"][0])[0] in ("PENDING", "RUNNING")
        own = status(state_dir, env=root_env)
        assert list(own) == [mine["job_id"]] and own[mine["job_id"]]["state"] in ("SUBMITTED", "RUNNING")
        admin = json.loads(cli("status", "--all", "--json", state=state_dir, env=root_env).stdout)["jobs"]
        assert {(r["id"], r["owner"]) for r in admin} == {(mine["job_id"], "root"), (theirs["job_id"], TEST_USER)}

        # root is admin: it may cancel the other user's job; Slurm agrees.
        cli("cancel", str(theirs["job_id"]), str(mine["job_id"]), state=state_dir, env=root_env)
        records = {r.id.job: r for r in accounting(slurm_ids) if not r.id.is_step}
        assert {k: (r.state, r.user) for k, r in records.items()} == {
            mine["slurm_job_ids"][0]: ("CANCELLED", "root"), theirs["slurm_job_ids"][0]: ("CANCELLED", TEST_USER)}
    finally:
        scancel(slurm_ids)
        shutil.rmtree(home, ignore_errors=True)


# --------------------------------------------------------------------------- 9. report


def test_report_gpu_hours_match_sacct_and_every_format_works(
        tmp_path: Path, state_dir: Path, since: datetime, leftovers: list[str]) -> None:
    out = submit(state_dir, write(
        tmp_path / "mix.yaml",
        job("het-five", ["sleep", "4"], "{min: 5, max: 5, types: [v100, t4]}"),
        job("k80-pair", ["sleep", "3"], "{min: 2, max: 2, types: [k80]}"),
        job("t4-one", ["sleep", "2"], "{min: 1, max: 1, types: [t4]}"),
    ))
    assert [o["state"] for o in out] == ["SUBMITTED"] * 3, out
    ids = [o["job_id"] for o in out]
    rows = wait_for(state_dir, ids, timeout=180)
    assert all(rows[i]["state"] == "COMPLETED" for i in ids), rows
    het = rows[ids[0]]["slurm"]
    assert {p["role"] for p in het} == {"het"} and {p["gpu_type"] for p in het} == {"v100", "t4"}, het
    slurm_ids = sorted({p["id"] for i in ids for p in rows[i]["slurm"]})
    accounting(slurm_ids)  # sacct lags squeue: wait for final rows first

    # GPU-hours by type, from raw sacct text: sum over non-step rows of gres/gpu:<type> x Elapsed.
    expected: dict[int, dict[str, float]] = {}
    het_rows = 0
    tag = store_tag(state_dir)
    for row in sacct_rows(slurm_ids):
        if "." in row["JobID"]:
            continue
        (job_id,) = [int(t) for t in row["Comment"].split("@")[0].removeprefix("slurmhet:").split(",")]
        assert row["Comment"].endswith(f"@{tag}")
        het_rows += "+" in row["JobID"]
        for item in row["AllocTRES"].split(","):
            key, _, value = item.partition("=")
            if key.startswith("gres/gpu:"):
                hours = expected.setdefault(job_id, {})
                gpu_type = key.removeprefix("gres/gpu:")
                hours[gpu_type] = hours.get(gpu_type, 0.0) + int(value) * elapsed_seconds(row["Elapsed"]) / 3600.0
    assert het_rows == 2
    assert set(expected[ids[0]]) == {"v100", "t4"} and set(expected[ids[1]]) == {"k80"}
    assert set(expected[ids[2]]) == {"t4"}

    report = json.loads(cli("report", "--json", state=state_dir).stdout)
    by_id = {j["id"]: j for j in report["jobs"]}
    assert sorted(by_id) == sorted(ids)
    for job_id in ids:
        got = by_id[job_id]
        assert got["state"] == "COMPLETED"
        assert got["gpu_hours"] == {t: round(h, 6) for t, h in sorted(expected[job_id].items())}, (got, expected)
        assert got["gpu_hours"] and all(h > 0 for h in got["gpu_hours"].values())
        assert got["queue_s"] is not None and got["run_s"] is not None and got["jct_s"] >= got["run_s"]
    totals: dict[str, float] = {}
    for hours in expected.values():
        for gpu_type, value in hours.items():
            totals[gpu_type] = totals.get(gpu_type, 0.0) + value
    assert report["cluster"]["gpu_hours"] == pytest.approx({t: round(v, 6) for t, v in totals.items()}, abs=2e-6)
    assert report["cluster"]["makespan_s"] > 0

    as_csv = cli("report", "--csv", state=state_dir).stdout
    parsed = list(csv.DictReader(io.StringIO(as_csv)))
    assert sorted(int(r["id"]) for r in parsed) == sorted(ids)
    for r in parsed:
        for gpu_type, value in by_id[int(r["id"])]["gpu_hours"].items():
            assert float(r[f"gpu_hours_{gpu_type}"]) == value

    plots = tmp_path / "plots"
    plotted = cli("report", "--plot", str(plots), state=state_dir)
    pngs = sorted(p.name for p in plots.iterdir())
    assert pngs == ["gantt.png", "jct_cdf.png", "utilization.png"], pngs
    assert all((plots / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (plots / p).stat().st_size > 1000
               for p in pngs)
    assert plotted.stderr.count("wrote ") == 3

    both = cli("report", "--json", "--csv", state=state_dir, check=False)
    assert both.returncode == 2 and "--json and --csv exclude each other" in both.stderr and both.stdout == ""
