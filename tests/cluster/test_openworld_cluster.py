"""slurmhet on a shared cluster (issue 14), on the real dev cluster.

Other users' jobs are plain sbatch jobs of user ``slurmhet-noise``; the capped user
``slurmhet-capped`` has the QOS ``gpu2`` (MaxTRESPerUser=gres/gpu=2). Each decision
slurmhet makes here is asserted from the numbers behind it: the dev cluster's
throughput table and the foreign jobs' time limits.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Iterator

import pytest

from slurmhet.slurm.world import job_prio_threshold, read_world
from slurmhet.throughput import load_tables
from tests.cluster.helpers import accounting, cli, job, never_ran, status, user_python, wait_for, write
from tests.cluster.replan_helpers import (REPO, SLURM, db_snapshot, events, holding_every_v100, replan,
                                          sbatch_foreign, scancel, squeue_state, submit, submitted_by, wait_slurm)

pytestmark = pytest.mark.usefixtures("slurm_cluster")

NOISE_USER = "slurmhet-noise"  # sbatch_foreign's user: someone else
CAPPED_USER = "slurmhet-capped"
WORKLOAD = "ResNet-18 (batch size 64)"
TABLE = load_tables([REPO / "etc" / "throughput" / "devcluster.yaml"])
RATE = {t: TABLE.rate(WORKLOAD, t) for t in ("v100", "t4", "k80")}
#: The planner's floor on a foreign job's release: Slurm kills it at start + time limit at the latest,
#: and an estimate never ends it sooner than a minute from now (slurm/world.py OVERDUE_GRACE_S).
GRACE_S = 60.0


def run_s(steps: int, gpu_type: str) -> float:
    return steps * 64 / RATE[gpu_type]


def resnet(name: str, steps: int, types: str, command: list[str] | None = None, extra: str = "") -> str:
    return job(name, command or ["sleep", "1"], f"{{min: 1, max: 1, types: [{types}]}}",
               extra).replace("work: {steps: 10}", f"work: {{steps: {steps}}}")


# --------------------------------------------------------------------------- a foreign job holds every V100


def test_a_flexible_job_starts_on_idle_t4s_while_a_foreign_job_holds_the_v100s_for_longer(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    _, latest_end = holding_every_v100(30, 600, leftovers)
    steps = 20
    # The v100s free up a minute from now at the earliest; the t4 run is far shorter than that wait.
    wait_then_v100 = GRACE_S + run_s(steps, "v100")
    assert run_s(steps, "t4") < wait_then_v100
    (out,) = submit(state_dir, write(tmp_path / "j.yaml", resnet("wants-fast", steps, "v100, t4")))
    assert out["state"] == "SUBMITTED" and out["allocation"].startswith("1xt4"), out
    (slurm_id,) = out["slurm_job_ids"]
    (record,) = SLURM.queue([slurm_id])
    assert record.partition == "t4", record  # the planned type's own partition
    argv = json.loads(cli("status", "--json", state=state_dir).stdout)["jobs"][0]
    assert argv["state"] in ("SUBMITTED", "RUNNING", "COMPLETED")
    rows = wait_for(state_dir, [out["job_id"]], timeout=90)
    assert rows[out["job_id"]]["state"] == "COMPLETED"
    (done,) = [r for r in accounting([slurm_id]) if not r.id.is_step]
    assert done.gpus_by_type() == {"t4": 1} and done.nodes == "nodeb"
    view = json.loads(cli("cluster", "--json", state=state_dir).stdout)
    assert view["others"]["v100"] == 4, view["others"]
    assert {(p["partition"], p["gpu_type"]): p["others"] for p in view["partitions"]}[("v100", "v100")] == 4
    assert view["limits"]["job_comments"] is True  # probed: the dev cluster keeps comments in sacct


def test_a_flexible_job_waits_for_a_v100_when_its_release_plus_the_v100_run_beats_the_t4_run(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    blocker, latest_end = holding_every_v100(1, 45, leftovers)
    steps = 2000
    now = time.time()
    wait_then_v100 = max(latest_end - now, 0.0) + run_s(steps, "v100")
    assert wait_then_v100 < run_s(steps, "t4"), (wait_then_v100, run_s(steps, "t4"))
    (out,) = submit(state_dir, write(tmp_path / "j.yaml", resnet("wants-v100", steps, "v100, t4")))
    assert out["state"] == "PENDING", out
    assert "waits for 1 v100 held by other users" in out["reason"] and "starting now on 1xt4" in out["reason"], out
    row = status(state_dir)[out["job_id"]]
    assert row["planned_start"] is not None, row
    assert "v100 held by 1 other job(s)" in row["why"] and "t4 would start it now but run" in row["why"], row
    # The foreign job ends well before its time limit: the next replan submits the waiting job there.
    scancel([blocker])
    deadline = time.monotonic() + 60
    while True:
        moved = replan(state_dir)
        if out["job_id"] in submitted_by(moved.stdout):
            break
        assert time.monotonic() < deadline, moved.stdout
        time.sleep(2)
    assert "1xv100@nodea" in moved.stdout, moved.stdout
    rows = wait_for(state_dir, [out["job_id"]], timeout=90)
    assert rows[out["job_id"]]["state"] == "COMPLETED"


# --------------------------------------------------------------------------- replan moves a job pending in Slurm


def _pending_on_v100(tmp_path: Path, state_dir: Path, steps: int, minutes: int, sleep_s: int,
                     leftovers: list[str]) -> tuple[int, str]:
    """A slurmhet job pending in Slurm for Resources on v100 behind a foreign job: submitted held while the
    v100s were free, then the foreign job took them, then released."""
    spec = write(tmp_path / "p.yaml", resnet("pending", steps, "v100, t4", extra="sbatch: ['--hold']\n"))
    (out,) = submit(state_dir, spec)
    assert out["state"] == "SUBMITTED" and out["allocation"].startswith("1xv100"), out
    (slurm_id,) = out["slurm_job_ids"]
    held = replan(state_dir)  # held by the user: not a reason slurmhet can cure, so nothing moves
    assert "moves to" not in held.stdout, held.stdout
    assert status(state_dir)[out["job_id"]]["slurm_reason"] == "JobHeldUser"
    holding_every_v100(minutes, sleep_s, leftovers)
    subprocess.run(["scontrol", "release", slurm_id], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while squeue_state(slurm_id)[1] not in ("Resources", "Priority"):
        assert time.monotonic() < deadline, squeue_state(slurm_id)
        time.sleep(1)
    return out["job_id"], slurm_id


def test_replan_moves_a_job_pending_behind_a_foreign_job_to_idle_t4s_when_that_pays(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    steps = 20
    job_id, first = _pending_on_v100(tmp_path, state_dir, steps, 30, 600, leftovers)
    moved = replan(state_dir)
    assert f"job {job_id} pending in Slurm {first} moves to t4" in moved.stdout, moved.stdout
    (second,) = submitted_by(moved.stdout)[job_id]
    assert squeue_state(second)[1] == "JobHeldUser"  # the spec's own sbatch flags go with it
    subprocess.run(["scontrol", "release", second], check=True, timeout=30)
    rows = wait_for(state_dir, [job_id], timeout=90)
    assert rows[job_id]["state"] == "COMPLETED"
    records = {r.id.job: r for r in accounting([first, second]) if not r.id.is_step}
    assert records[first].state == "CANCELLED" and never_ran(records[first])
    assert records[second].gpus_by_type() == {"t4": 1}
    resets = [e for e in events(state_dir, job_id) if e[1] == "reset"]
    assert len(resets) == 1 and "where it waits" in resets[0][2], resets


def test_replan_leaves_a_pending_job_where_it_waits_when_moving_does_not_pay(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    steps = 2000  # t4: ~194 s; v100: ~83 s after a foreign job that Slurm kills within a minute
    assert GRACE_S + run_s(steps, "v100") < run_s(steps, "t4")
    job_id, first = _pending_on_v100(tmp_path, state_dir, steps, 1, 45, leftovers)
    for _ in range(2):
        calm = replan(state_dir)
        assert "moves to" not in calm.stdout and not submitted_by(calm.stdout), calm.stdout
    row = status(state_dir)[job_id]
    assert row["state"] == "SUBMITTED" and [p["id"] for p in row["slurm"]] == [first], row
    assert row["slurm_reason"] in ("Resources", "Priority") and row["slurm_expected_start"], row


# --------------------------------------------------------------------------- a site's wait limit (max_wait_h)


def test_a_job_pending_past_the_sites_wait_limit_is_queued_in_slurm_ahead_of_younger_jobs_and_backfilled_around(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    env = {"SLURMHET_CONFIG": str(tmp_path / "config.yaml")}
    (tmp_path / "config.yaml").write_text("max_wait_h: 0.005\n")  # 18 s
    blocker = sbatch_foreign("--gres=gpu:v100:2", "-p", "v100", "-t", "5", "--wrap", "sleep 300")
    leftovers.append(blocker)
    wait_slurm(blocker, ("RUNNING",), timeout=90)
    wide = job("wide", ["sleep", "1"], "{min: 4, max: 4, types: [v100]}")
    (first,) = submit(state_dir, write(tmp_path / "w.yaml", wide), env=env)
    assert first["state"] == "PENDING", first  # 2 of the 4 v100s are held
    time.sleep(20)
    # The wide job is overdue: the next command that plans (this submit) queues it in Slurm for the 4 v100s.
    # The narrow job fits the 2 free v100s; without the limit it would start there. It waits behind the
    # overdue one, the free v100s kept for it.
    (second,) = submit(state_dir, write(tmp_path / "n.yaml", resnet("narrow", 10, "v100")), env=env)
    assert second["state"] == "PENDING", second
    rows = status(state_dir, env=env)
    assert rows[first["job_id"]]["state"] == "SUBMITTED", rows
    (part,) = rows[first["job_id"]]["slurm"]
    assert (part["state"], part["gpu_type"], part["gpus"]) == ("PENDING", "v100", 4), part
    assert "free GPUs are kept for 1 overdue job(s)" in rows[second["job_id"]]["reason"], rows
    detail = json.loads(cli("status", "--json", str(first["job_id"]), state=state_dir, env=env).stdout)
    assert "queued in Slurm for 4 x v100" in detail["plan"]["wait_reason"], detail["plan"]
    # A job whose time limit (1 min) ends before the blocker's (5 min), so before the wide job can start,
    # runs on a kept v100 now: slurmhet submits it, and Slurm's backfill starts it around the wide job.
    (short,) = submit(state_dir, write(tmp_path / "s.yaml", resnet("short", 10, "v100", extra="time_limit: 1\n")),
                      env=env)
    assert short["state"] == "SUBMITTED", short
    assert wait_for(state_dir, [short["job_id"]], timeout=90)[short["job_id"]]["state"] == "COMPLETED"
    # Each plan stores the queued job's new forecast: with the blocker's limit cut to 4 min, the next replan
    # expects the wide job to start by then (the stored plan of the time it was queued said otherwise).
    def planned_start() -> str:
        detail = json.loads(cli("status", "--json", str(first["job_id"]), state=state_dir, env=env).stdout)
        assert "queued in Slurm for 4 x v100" in detail["plan"]["wait_reason"], detail["plan"]
        return str(detail["plan"]["planned_start"])

    before = planned_start()
    (held,) = [q for q in SLURM.queue() if q.job_id == blocker]
    assert held.start is not None, held
    _scontrol("update", f"jobid={blocker}", "TimeLimit=4")
    replan(state_dir, env=env)
    after = planned_start()
    assert after != before and datetime.fromisoformat(after).timestamp() <= held.start.timestamp() + 240 + 5, \
        (before, after, held.start)
    # Another user's younger job fits the 2 free v100s but would run past the blocker's limit: Slurm keeps
    # it pending, as it does not let a lower-priority job delay the wide one (kept out of Slurm's queue,
    # the wide job would not stop it).
    younger = sbatch_foreign("--gres=gpu:v100:2", "-p", "v100", "-t", "10", "--nice=100000", "--wrap", "sleep 5")
    leftovers.append(younger)
    for _ in range(8):  # bf_interval=1, sched_interval=2: several passes of both schedulers
        time.sleep(1)
        assert squeue_state(younger)[0] == "PENDING", squeue_state(younger)
    # The forecast still has the wide job start by the blocker's new limit. (Slurm gives the younger job no
    # expected start; open_world ranks it after the queued job by its priority, which the unit tests pin. Here
    # the foreign user's history predicts it runs seconds, so it would not delay the forecast either way.)
    replan(state_dir, env=env)
    assert datetime.fromisoformat(planned_start()).timestamp() <= held.start.timestamp() + 240 + 5, \
        (planned_start(), held.start)
    scancel([blocker])
    # Slurm starts the wide job itself: no replan submits it again.
    rows = wait_for(state_dir, [first["job_id"]], timeout=120)
    assert rows[first["job_id"]]["state"] == "COMPLETED", rows
    assert [p["id"] for p in rows[first["job_id"]]["slurm"]] == [part["id"]], rows[first["job_id"]]["slurm"]
    # The narrow job goes to Slurm through a replan: now that the v100s are free, or already, queued once it
    # too was overdue (18 s) at one of the replans above.
    deadline = time.monotonic() + 60
    while not status(state_dir, env=env)[second["job_id"]]["slurm"] \
            and second["job_id"] not in submitted_by(replan(state_dir, env=env).stdout):
        assert time.monotonic() < deadline
        time.sleep(2)
    assert wait_for(state_dir, [second["job_id"]], timeout=120)[second["job_id"]]["state"] == "COMPLETED"
    wait_slurm(younger, ("COMPLETED", ""), timeout=120)  # "": squeue lists it no more
    starts = {r.raw_id: r.start for r in accounting([part["id"], younger]) if not r.id.is_step}
    assert starts[younger] >= starts[part["id"]], starts  # type: ignore[operator]


# --------------------------------------------------------------------------- a QOS caps GPUs per user


@pytest.fixture
def capped() -> Iterator[tuple[Path, object]]:
    python = user_python(CAPPED_USER)
    assert python is not None, f"{CAPPED_USER} cannot run slurmhet's Python"
    interpreter, py_env = python
    home = Path(tempfile.mkdtemp(prefix="slurmhet-capped-", dir="/tmp"))
    shutil.chown(home, CAPPED_USER, CAPPED_USER)
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "SLURMHET_STATE_DIR": str(home / "state"),
           "SLURMHET_THROUGHPUT_TABLE": str(Path(os.environ["SLURMHET_THROUGHPUT_TABLE"]).resolve()), **py_env}

    def as_user(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", CAPPED_USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                               *interpreter, "-m", "slurmhet", *args], capture_output=True, text=True, cwd=home,
                              timeout=180)

    yield home, as_user
    ids = [q.job_id for q in SLURM.queue() if q.user == CAPPED_USER]
    scancel(ids)
    shutil.rmtree(home, ignore_errors=True)


def test_a_qos_gpu_cap_bounds_the_plan_and_refuses_a_job_that_needs_more(capped: tuple[Path, object]) -> None:
    home, as_user = capped
    big = write(home / "big.yaml", job("needs-three", ["sleep", "1"], "{min: 3, max: 3}"))
    shutil.chown(big, CAPPED_USER, CAPPED_USER)
    refused = as_user("submit", "--json", str(big))  # type: ignore[operator]
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "QOS gpu2" in refused.stderr and "allows 2" in refused.stderr, refused.stderr
    assert not (home / "state" / "slurmhet.db").exists() or "needs-three" not in \
        as_user("status", "--json").stdout  # type: ignore[operator]

    spec = write(home / "three.yaml", *(job(f"one-{i}", ["sleep", "20"], "{min: 1, max: 2}") for i in range(3)))
    shutil.chown(spec, CAPPED_USER, CAPPED_USER)
    proc = as_user("submit", "--json", str(spec))  # type: ignore[operator]
    assert proc.returncode == 0, proc.stderr
    outs = json.loads(proc.stdout)["jobs"]
    placed = [o for o in outs if o["state"] == "SUBMITTED"]
    gpus = sum(int(part.split("x")[0]) for o in placed for part in o["allocation"].split(" + "))
    assert gpus <= 2 and placed, outs
    assert any(o["state"] == "PENDING" for o in outs), outs
    held = sum(sum(c for _, _, c in q.gpus) for q in SLURM.queue() if q.user == CAPPED_USER and q.state == "RUNNING")
    assert held <= 2
    cluster = json.loads(as_user("cluster", "--json").stdout)  # type: ignore[operator]
    assert cluster["limits"]["gpu_cap"] == 2 and "QOS gpu2" in cluster["limits"]["gpu_cap_source"], cluster["limits"]


# --------------------------------------------------------------------------- partitions and reservations


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, timeout=30, capture_output=True)


def test_a_partition_the_account_may_not_use_is_never_planned_onto(tmp_path: Path, state_dir: Path,
                                                                   leftovers: list[str]) -> None:
    private = "slurmhet-test-private"
    _scontrol("create", f"PartitionName={private}", "Nodes=nodec", "AllowAccounts=slurmhet-nobody")
    try:
        spec = write(tmp_path / "p.yaml", job("private", ["sleep", "1"], extra=f"sbatch: ['--partition={private}']\n"))
        proc = cli("submit", "--json", str(spec), state=state_dir, check=False)
        assert proc.returncode == 2 and f"partition {private!r} is not open to you" in proc.stderr, proc.stderr
        assert "AllowAccounts" in proc.stderr
        assert not (state_dir / "slurmhet.db").exists() or not status(state_dir)
        # k80 only in partitions root's accounts may not use: out of reach.
        _scontrol("update", "PartitionName=k80", "AllowAccounts=slurmhet-nobody")
        _scontrol("update", "PartitionName=gpu", "Nodes=nodea,nodeb")
        _scontrol("update", "PartitionName=urgent", "Nodes=nodea,nodeb")  # the preempting one holds every node
        only_k80 = write(tmp_path / "k.yaml", job("k80-only", ["sleep", "1"], "{min: 1, max: 1, types: [k80]}"))
        proc = cli("submit", "--json", str(only_k80), state=state_dir, check=False)
        assert proc.returncode == 2 and "none of its GPU types (k80) is in a partition you may use" in proc.stderr
        either = write(tmp_path / "e.yaml", resnet("k80-or-t4", 2000, "k80, t4"))
        (out,) = submit(state_dir, either)
        assert out["state"] == "SUBMITTED" and out["allocation"].startswith("1xt4"), out
        (record,) = SLURM.queue(out["slurm_job_ids"])
        assert record.partition == "t4"
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=gpu", "Nodes=nodea,nodeb,nodec"], timeout=30)
        subprocess.run(["scontrol", "update", "PartitionName=urgent", "Nodes=nodea,nodeb,nodec"], timeout=30)
        subprocess.run(["scontrol", "update", "PartitionName=k80", "AllowAccounts=ALL"], timeout=30)
        subprocess.run(["scontrol", "delete", f"PartitionName={private}"], capture_output=True, timeout=30)


# Whom it admits does not matter: slurmhet's jobs name no reservation, and Slurm starts none of them on its nodes.
@pytest.mark.parametrize("admits", [NOISE_USER, "root"])
def test_a_reservation_covering_nodeb_for_the_next_hour_is_not_planned_onto(tmp_path: Path, state_dir: Path,
                                                                            leftovers: list[str], admits: str) -> None:
    name = "slurmhet-test-maint"
    _scontrol("create", "reservation", f"ReservationName={name}", "StartTime=now", "Duration=60", "Nodes=nodeb",
              f"Users={admits}")
    try:
        (out,) = submit(state_dir, write(tmp_path / "r.yaml", resnet("t4-or-k80", 20, "t4, k80")))
        assert out["state"] == "SUBMITTED" and out["allocation"].startswith("1xk80"), out
        view = json.loads(cli("cluster", "--json", state=state_dir).stdout)
        assert {(p["partition"], p["gpu_type"]): p["reserved"] for p in view["partitions"]}[("t4", "t4")] == 4
        (waiting,) = submit(state_dir, write(tmp_path / "w.yaml", resnet("t4-only", 20, "t4")))
        assert waiting["state"] == "PENDING", waiting
        assert f"reservation {name}" in status(state_dir)[waiting["job_id"]]["why"]
        if admits == NOISE_USER:  # a job bound to the reservation: squeue names it, as slurm/world.py reads it
            inside = sbatch_foreign(f"--reservation={name}", "-p", "t4", "--gres=gpu:t4:1", "-t", "5", "--wrap",
                                    "sleep 120")
            leftovers.append(inside)
            wait_slurm(inside, ("RUNNING",))
            (record,) = SLURM.queue([inside])
            assert record.reservation == name and record.gpus == (("nodeb", "t4", 1),), record
    finally:
        scancel(leftovers)  # Slurm keeps a reservation that a job still runs in
        deadline = time.monotonic() + 60
        while subprocess.run(["scontrol", "delete", f"ReservationName={name}"], capture_output=True,
                             timeout=30).returncode and name in _reservations() and time.monotonic() < deadline:
            time.sleep(1)
        assert name not in _reservations()


def _reservations() -> str:
    return subprocess.run(["scontrol", "show", "reservation", "--oneliner"], capture_output=True, text=True,
                          timeout=30).stdout


# --------------------------------------------------------------------------- QOS MinPrioThreshold


@pytest.mark.parametrize("above", [False, True])
def test_a_qos_min_prio_threshold_above_a_blocked_jobs_priority_lets_lower_jobs_pass_it_as_forecast(
        leftovers: list[str], above: bool) -> None:
    """A blocked job holds its partition's nodes from lower-priority jobs unless its priority is below its QOS's
    MinPrioThreshold (slurmctld's ``acct_policy_get_prio_thresh``, which replaces ``bf_min_prio_reserve``).
    slurmhet reads the threshold and forecasts the same (``ReserveRule.reserves``); Slurm's own choice is
    the check."""
    holder = sbatch_foreign("--gres=gpu:v100:3", "-p", "v100", "-t", "10", "--wrap", "sleep 600")
    leftovers.append(holder)
    wait_slurm(holder, ("RUNNING",), timeout=90)
    ours = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-p", "v100", "--gres=gpu:v100:4", "-t", "5",
                           "--wrap", "sleep 60"], capture_output=True, text=True, timeout=30, check=True,
                          cwd="/tmp").stdout.strip()
    leftovers.append(ours)
    deadline = time.monotonic() + 60
    while squeue_state(ours) != ("PENDING", "Resources"):
        assert time.monotonic() < deadline, f"job {ours} not pending on Resources: {squeue_state(ours)}"
        time.sleep(0.5)
    (record,) = SLURM.queue([ours])
    threshold = record.priority + 1000
    if above:
        subprocess.run(["sacctmgr", "-i", "modify", "qos", record.qos, "set", f"MinPrioThresh={threshold}"],
                       capture_output=True, timeout=30, check=True)
    try:
        world = read_world(SLURM, "root")
        (record,) = [r for r in world.queue if r.job_id == ours]
        assert world.reserve.enforce_limits  # the dev cluster enforces limits
        read = job_prio_threshold(world, record)
        assert read == (threshold if above else None)
        forecast = world.reserve.reserves(record.eligible.timestamp() if record.eligible else None, record.priority,
                                          time.time(), read)
        assert forecast is not above
        # Low from submission on: a job submitted at the user's own (higher) priority and lowered after can
        # start at submit time, before the update lands (CI saw that on 24.11, 1 ms apart).
        low = sbatch_foreign("--gres=gpu:v100:1", "-p", "v100", "-t", "30", "--nice=100000", "--wrap", "sleep 300")
        leftovers.append(low)
        (low_record,) = SLURM.queue([low])
        assert low_record.priority < record.priority, (low_record, record)
        if above:  # ours reserves nothing: the lower job takes the free v100 at once
            wait_slurm(low, ("RUNNING",), timeout=30)
        else:  # ours holds the v100s; the 1-v100 job would delay it (30 min > the holder's 10), so it waits
            time.sleep(10)
            assert squeue_state(low)[0] == "PENDING", squeue_state(low)
    finally:
        if above:
            subprocess.run(["sacctmgr", "-i", "modify", "qos", record.qos, "set", "MinPrioThresh=-1"],
                           capture_output=True, timeout=30, check=True)


# --------------------------------------------------------------------------- bad Slurm output


BAD_OUTPUT = {
    "partition": ("scontrol", "show partition", "PartitionName=v100 MaxTime=forever Nodes=nodea State=UP"),
    "reservation": ("scontrol", "show reservation", "ReservationName=x StartTime=soon EndTime=later Nodes=nodeb"),
    "assoc": ("sacctmgr", "show assoc", "slurmhet|root"),
    "qos": ("sacctmgr", "show qos", "normal|high|gres/gpu=lots|||x||soon|"),
    "squeue --start": ("squeue", "--start", "17|tomorrow|nodea"),
}


@pytest.mark.parametrize("case", sorted(BAD_OUTPUT))
def test_bad_output_of_each_new_slurm_query_fails_the_command_and_leaves_the_store(
        case: str, tmp_path: Path, state_dir: Path) -> None:
    command, match, garbage = BAD_OUTPUT[case]
    real = shutil.which(command)
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / command
    matches = " && ".join(f'[[ " $* " == *" {word} "* ]]' for word in match.split())
    wrapper.write_text(f'#!/bin/bash\nif {matches}; then printf "%s\\n" {shlex.quote(garbage)}; exit 0; fi\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(0o755)
    cli("status", state=state_dir)  # the store exists before the failing command
    before = db_snapshot(state_dir)
    spec = write(tmp_path / "j.yaml", job("bad-output", ["sleep", "1"]))
    proc = cli("submit", str(spec), state=state_dir, check=False, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert command in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert db_snapshot(state_dir) == before
