"""The launcher: rank environment from recorded Slurm environments, exports, signals, progress."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurmhet.errors import InputError
from slurmhet.runtime.hostlist import expand_hostlist
from slurmhet.runtime.launcher import accumulation_steps, derive_rank_env, launch
from slurmhet.runtime.progress import read_progress

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "slurm-env"


def _fixture(name: str) -> dict:
    """A recorded task environment plus the SLURMHET_* variables the emitted script adds."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return {**data, "env": {**data["captured_env"], **data["slurmhet_env"]}}


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_derive_rank_env_matches_recorded_environment(name: str) -> None:
    data = _fixture(name)
    got = derive_rank_env(data["env"])
    expected = data["expected"]
    assert got.rank == expected["rank"]
    assert got.world_size == expected["world_size"]
    assert got.local_rank == expected["local_rank"]
    assert got.master_addr == expected["master_addr"]
    assert got.master_port == expected["master_port"]
    assert got.gpu_type == expected["gpu_type"]
    assert got.shard_weight == pytest.approx(expected["shard_weight"])
    assert got.accumulation_steps == expected["accumulation_steps"]
    assert got.het_group == expected["het_group"]
    assert got.job_id == expected["job_id"]
    assert got.slurm_job_id == expected["slurm_job_id"]
    assert got.node == expected["node"]
    assert sum(got.shard_weights) == pytest.approx(1.0)


def test_het_ranks_cover_the_world_once() -> None:
    """Every task of a spanning het step gets a distinct rank; rendezvous is on component 0 for all."""
    base = _fixture("het_job_spanning_step")["env"]
    envs = [{**base, "SLURM_PROCID": str(p), "SLURMD_NODENAME": node}
            for p, node in enumerate(["nodeb", "nodea", "nodea"])]
    ranks = [derive_rank_env(e) for e in envs]
    assert [r.rank for r in ranks] == [0, 1, 2]
    assert [r.het_group for r in ranks] == [0, 1, 1]
    assert [r.gpu_type for r in ranks] == ["t4", "v100", "v100"]
    assert {r.master_addr for r in ranks} == {"nodeb"}


def test_per_group_het_steps_number_ranks_after_earlier_components() -> None:
    base = _fixture("het_job_per_group_step")["env"]
    group0 = {**base, "SLURMHET_HET_GROUP": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1"}
    group1 = [{**base, "SLURM_PROCID": str(p)} for p in (0, 1)]
    assert [derive_rank_env(e).rank for e in [group0, *group1]] == [0, 1, 2]


def test_exports_are_what_env_init_and_the_workload_read() -> None:
    exports = derive_rank_env(_fixture("multi_node")["env"]).exports()
    assert {k: exports[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "nodeb", "MASTER_PORT": "20055"}
    assert exports["SLURMHET_SHARD_WEIGHT"] == "0.2"
    assert [float(w) for w in exports["SLURMHET_SHARD_WEIGHTS"].split(",")] == pytest.approx([0.3, 0.3, 0.2, 0.2])
    assert exports["SLURMHET_GPU_TYPE"] == "k80"
    assert exports["SLURMHET_ACCUMULATION_STEPS"] == "1"
    assert exports["SLURMHET_PROGRESS_FILE"] == "/var/lib/slurmhet/progress/18.55.3.json"


def test_node_addresses_map_unresolvable_node_names() -> None:
    env = {**_fixture("het_job_spanning_step")["env"], "SLURMHET_NODE_ADDRS": "nodea=127.0.0.1,nodeb=127.0.0.2"}
    assert derive_rank_env(env).master_addr == "127.0.0.2"
    with pytest.raises(InputError, match="bad entry"):
        derive_rank_env({**env, "SLURMHET_NODE_ADDRS": "nodeb"})


def test_explicit_master_port_wins() -> None:
    env = {**_fixture("single_node")["env"], "MASTER_PORT": "31111"}
    assert derive_rank_env(env).master_port == 31111


@pytest.mark.parametrize(("weights", "message"), [
    ("0.5,0.5,0.0", "3 weights but the job has 2 ranks"),
    ("0.9,0.3", "sum to 1"),
    ("0.5,x", "not a list of numbers"),
    ("-0.5,1.5", "non-negative"),
])
def test_bad_shard_weights_are_input_errors(weights: str, message: str) -> None:
    env = {**_fixture("single_node")["env"], "SLURMHET_SHARD_WEIGHTS": weights}
    with pytest.raises(InputError, match=message) as info:
        derive_rank_env(env)
    assert info.value.place == "SLURMHET_SHARD_WEIGHTS"


def test_rank_gpu_types_must_cover_every_rank() -> None:
    env = {**_fixture("multi_node")["env"], "SLURMHET_RANK_GPU_TYPES": "v100,t4"}
    with pytest.raises(InputError, match="2 entries but the job has 4 ranks"):
        derive_rank_env(env)


def test_accumulation_steps_relaxed_scale_fixed() -> None:
    assert accumulation_steps(1.0, None) == 1
    assert accumulation_steps(0.5, 4) == 2  # 2 GPUs standing in for 4 nominal workers
    assert accumulation_steps(0.6, 4) == 3
    assert accumulation_steps(0.4, 4) == 2
    assert accumulation_steps(0.25, 2) == 1  # more GPUs than nominal: no accumulation


@pytest.mark.parametrize(("text", "hosts"), [
    ("nodea", ["nodea"]),
    ("nodea,nodeb", ["nodea", "nodeb"]),
    ("nodea,node[b-c]", ["nodea", "nodeb", "nodec"]),
    ("gpu[01-03,05]", ["gpu01", "gpu02", "gpu03", "gpu05"]),
    ("gpu[08-10],cpu1", ["gpu08", "gpu09", "gpu10", "cpu1"]),
    ("n[1-10]", [f"n{i}" for i in range(1, 11)]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu01]", "gpu[3-1]", "gpu[a-3]", "gpu[[1-2]]", "gpu[]"])
def test_bad_hostlists_are_input_errors(text: str) -> None:
    with pytest.raises(InputError):
        expand_hostlist(text)


def test_launcher_does_not_import_torch() -> None:
    code = "import sys, slurmhet.runtime.launcher, slurmhet.runtime.mps; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def _local_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))}
    return {**env, "SLURM_JOB_ID": "9100", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_NODELIST": "nodea",
            "SLURMD_NODENAME": "nodea", "SLURMHET_JOB_ID": "31", "SLURMHET_PROGRESS_DIR": str(tmp_path / "progress"),
            "SLURMHET_GPU_TYPE": "t4"}


def test_launch_passes_rank_env_to_the_child_and_records_exit(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w')); raise SystemExit(3)"
    status = launch(["--", sys.executable, "-c", code], _local_env(tmp_path))
    assert status == 3
    child = json.loads(out.read_text())
    assert (child["RANK"], child["WORLD_SIZE"], child["MASTER_ADDR"], child["MASTER_PORT"]) == ("0", "1", "127.0.0.1", "29100")
    assert child["SLURMHET_GPU_TYPE"] == "t4"
    [record] = read_progress(tmp_path / "progress")
    assert (record.job_id, record.slurm_job_id, record.rank, record.state, record.exit_code) == ("31", "9100", 0, "failed", 3)


def test_launch_rejects_an_empty_command(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no command"):
        launch(["--"], _local_env(tmp_path))


def test_launch_forwards_sigusr2_to_the_child(tmp_path: Path) -> None:
    """The launcher runs in its own process here; SIGUSR2 to it must reach the child's handler."""
    ready, got = tmp_path / "ready", tmp_path / "got"
    child = textwrap.dedent(f"""
        import pathlib, signal, time
        signal.signal(signal.SIGUSR2, lambda s, f: pathlib.Path({str(got)!r}).write_text(str(s)))
        pathlib.Path({str(ready)!r}).write_text("1")
        deadline = time.time() + 20
        while not pathlib.Path({str(got)!r}).exists() and time.time() < deadline:
            time.sleep(0.02)
    """)
    runner = (f"import sys; from slurmhet.runtime.launcher import launch; "
              f"sys.exit(launch([sys.executable, '-c', {child!r}]))")
    proc = subprocess.Popen([sys.executable, "-c", runner], env=_local_env(tmp_path), cwd=REPO)
    try:
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "child did not start"
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert got.read_text() == str(int(signal.SIGUSR2))
    [record] = read_progress(tmp_path / "progress")
    assert record.state == "done"


@pytest.mark.parametrize(("exit_how", "state", "code"), [
    ("os.kill(os.getpid(), signal.SIGTERM)", "preempted", 0),  # killed by Slurm's requeue after checkpointing
    ("raise SystemExit(3)", "failed", 3),  # a real failure after the stop is still a failure
])
def test_a_run_killed_after_it_checkpointed_stays_preempted(tmp_path: Path, exit_how: str, state: str,
                                                           code: int) -> None:
    env = _local_env(tmp_path)
    record = tmp_path / "progress" / "31.9100.0.json"
    child = (
        "import json, os, signal, time\n"
        f"path = {str(record)!r}\n"
        "data = json.load(open(path)); data.update(state='preempted', steps_done=7)\n"
        "json.dump(data, open(path, 'w'))\n"
        f"{exit_how}\n"
    )
    launch(["--", sys.executable, "-c", child], env)
    [stored] = read_progress(tmp_path / "progress")
    assert (stored.state, stored.steps_done, stored.exit_code) == (state, 7, code)


@pytest.mark.parametrize("env,expected", [
    ({}, {"OMP_NUM_THREADS": "1"}),
    ({"SLURM_CPUS_PER_TASK": "4"}, {"OMP_NUM_THREADS": "4"}),
    ({"SLURM_CPUS_PER_TASK": "x"}, {"OMP_NUM_THREADS": "1"}),
    ({"SLURM_CPUS_PER_TASK": "4", "OMP_NUM_THREADS": "8"}, {}),  # the user's choice stands
])
def test_thread_env_caps_openmp_at_the_tasks_cpus(env: dict[str, str], expected: dict[str, str]) -> None:
    from slurmhet.runtime.launcher import thread_env

    assert thread_env(env) == expected


def test_a_profiling_run_is_stopped_once_its_steps_are_measured(tmp_path: Path) -> None:
    """SLURMHET_PROFILE_STEPS: the command would train for ever; the launcher stops it after 5 measured steps."""
    env = {**_local_env(tmp_path), "SLURMHET_PROFILE_STEPS": "5"}
    record = tmp_path / "progress" / "31.9100.0.json"
    child = (
        "import json, os, time\n"
        f"path = {str(record)!r}\n"
        "steps = 0\n"
        "while True:\n"
        "    steps += 1\n"
        "    data = json.load(open(path)); data.update(state='running', steps_done=steps, samples_per_second=250.0)\n"
        "    json.dump(data, open(path + '.tmp', 'w')); os.replace(path + '.tmp', path)\n"
        "    time.sleep(0.1)\n"
    )
    started = time.monotonic()
    status = launch(["--", sys.executable, "-c", child], env)
    assert status == 0 and time.monotonic() - started < 20
    [stored] = read_progress(tmp_path / "progress")
    assert stored.state == "done" and stored.exit_code == 0 and stored.steps_done >= 5
    assert stored.samples_per_second == 250.0


def test_a_profiling_run_that_ends_first_keeps_its_own_status(tmp_path: Path) -> None:
    env = {**_local_env(tmp_path), "SLURMHET_PROFILE_STEPS": "1000"}
    assert launch(["--", sys.executable, "-c", "raise SystemExit(4)"], env) == 4
    [stored] = read_progress(tmp_path / "progress")
    assert (stored.state, stored.exit_code) == ("failed", 4)
