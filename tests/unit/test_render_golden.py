"""Golden sbatch scripts. After an intended template change regenerate with `make goldens`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.emit.from_plan import EmitSettings, requests_for
from slurmhet.emit.requests import (ArrayChunk, ArrayRequest, BatchRequest, Common, ConsolidationRequest, GpuShape,
                                    HetJobRequest, Launch, Materialized, PackMember, PackRequest, SweepArrayRequest,
                                    SweepMember)
from slurmhet.planner.model import Allocation, JobPlan
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import GpuRequest, JobSpec, Workload

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
REGEN = os.environ.get("SLURMHET_REGEN_GOLDENS") == "1"
HOSTILE_NAME = "it's; $(rm -rf /)\n`x`"
HOSTILE_ARGV = ("bash", "-c", 'echo "$1"', "--", "a'b; $(touch pwned)\nline2 `y` \"q\"")


def _common(name: str = "resnet18") -> Common:
    return Common(job_id=42, name=name, log_dir="/var/log/slurmhet", time_limit_min=90, partition="gpu",
                  extra=(("account", "ml"), ("exclusive", None)))


LAUNCHER = ("/opt/slurmhet/bin/python", "-m", "slurmhet", "run", "--")
SLURMHET = ("/opt/slurmhet/bin/python", "-m", "slurmhet")
HET_SHAPES = (GpuShape("v100", 2, 1, ("nodea",)), GpuShape("t4", 1, 2, ("nodeb", "nodex")))
#: The dev cluster: one GPU type per node, one partition per type besides the default.
DEV_NODES = (Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4}), Node("nodec", {"k80": 2}))
DEV_PARTITIONS = {"v100": "v100", "t4": "t4", "k80": "k80"}


def _planned(slots: tuple[tuple[str, str, int], ...], nodes: tuple[Node, ...] = DEV_NODES,
             sbatch: tuple[tuple[str, str | None], ...] = (), runtime: str = "none",
             **fields: object) -> BatchRequest | HetJobRequest:
    """What from_plan emits for a plan on ``nodes``: shows where it pins nodes and picks partitions."""
    spec = JobSpec(name="resnet18", workload=Workload("ResNet-18", 64), global_batch=64,
                   command=("python", "train.py"), steps=10, gpus=GpuRequest(1, 8), time_limit_min=90, sbatch=sbatch,
                   **fields)  # type: ignore[arg-type]
    plan = JobPlan("42", Allocation(slots), (), 1.0, 1.0, 0.0, 1.0, 1.0, 0)
    settings = EmitSettings("/var/log/slurmhet", LAUNCHER, SLURMHET, partitions=DEV_PARTITIONS)
    profile = SiteProfile("22.05.8", True, 1001, 10**6, "gres", False, True, True, container_runtime=runtime)
    request = requests_for(42, spec, plan, profile, settings, inventory=Inventory(nodes))[0].request
    assert isinstance(request, (BatchRequest, HetJobRequest))
    return request


CASES: dict[str, BatchRequest | HetJobRequest | ArrayRequest | ConsolidationRequest | PackRequest | SweepArrayRequest] = {
    "batch-gres": BatchRequest(_common(), Launch(("python", "train.py", "--epochs", "2"), LAUNCHER), "t4", 2,
                               gpu_request_style="gres", shard_weights=(0.5, 0.5)),
    "batch-gpus-per-node": BatchRequest(_common(), Launch(("python", "train.py"), LAUNCHER, (("OMP_NUM_THREADS", "4"),)),
                                        "v100", 4, nodes=2, nodelist=("nodea", "nodex"),
                                        gpu_request_style="gpus-per-node"),
    "batch-hostile": BatchRequest(_common(HOSTILE_NAME), Launch(HOSTILE_ARGV, LAUNCHER), "k80", 1),
    "het-gres": HetJobRequest(_common(), Launch(("python", "train.py"), LAUNCHER), HET_SHAPES, "gres",
                              (0.3, 0.3, 0.2, 0.2)),
    "het-gpus-per-node": HetJobRequest(_common(), Launch(("python", "train.py"), LAUNCHER, (("SEED", "1"),)),
                                       HET_SHAPES, "gpus-per-node"),
    "het-hostile": HetJobRequest(_common(HOSTILE_NAME), Launch(HOSTILE_ARGV, LAUNCHER),
                                 (GpuShape("v100", 1), GpuShape("k80", 1))),
    "array-gres": ArrayRequest(_common(), Launch(("python", "train.py"), LAUNCHER), GpuShape("t4", 2, 1, ("nodeb",)),
                               ArrayChunk(2, 3), throttle=3, round=4),
    "array-gpus-per-node-chunk": ArrayRequest(_common(), Launch(("true",), LAUNCHER), GpuShape("k80", 1),
                                              ArrayChunk(0, 1001, task_offset=2002), throttle=50,
                                              gpu_request_style="gpus-per-node"),
    "array-hostile": ArrayRequest(_common(HOSTILE_NAME), Launch(HOSTILE_ARGV, LAUNCHER), GpuShape("k80", 1),
                                  ArrayChunk(0, 2)),
    # Three variants of sweep "lr" planned on one t4 each, now: one array, task i runs variant i.
    "sweep-gres": SweepArrayRequest(replace(_common("lr"), also=(43, 44)), Launch((), LAUNCHER, (("OMP_NUM_THREADS", "4"),),
                                                                                 modules=("cuda/12.2",)),
                                    GpuShape("t4", 1),
                                    tuple(SweepMember(42 + i, f"lr-{lr}", ("python", "train.py", "--lr", lr),
                                                      (("SLURMHET_CHECKPOINT_DIR", f"/ckpt/lr-{lr}"),))
                                          for i, lr in enumerate(("1e-3", "3e-4", "1e-4")))),
    "sweep-hostile": SweepArrayRequest(replace(_common(HOSTILE_NAME), also=(43,)), Launch((), LAUNCHER),
                                       GpuShape("k80", 1, 1), (SweepMember(42, HOSTILE_NAME, HOSTILE_ARGV),
                                                               SweepMember(43, "b", HOSTILE_ARGV, (("X", HOSTILE_NAME),)))),
    "consolidation": ConsolidationRequest(_common(), SLURMHET, "/ckpt/resnet18", (0, 1, 2), after=("101", "102"),
                                          round=4, then=(*SLURMHET, "replan")),
    # Run again after a fault cut the first run off: the copies are over, so no --dependency.
    "consolidation-again": ConsolidationRequest(_common(), SLURMHET, "/ckpt/resnet18", (0, 1, 2), round=4,
                                                then=(*SLURMHET, "replan"), again=True),
    "consolidation-hostile": ConsolidationRequest(_common(HOSTILE_NAME), SLURMHET, "/ckpt/it's $(x);\nd", (0,),
                                                  after=("101",)),
    "pack-gres": PackRequest(_common(), LAUNCHER, SLURMHET, "v100",
                             (PackMember(42, "small-a", ("python", "a.py")),
                              PackMember(43, "small-b", ("python", "b.py"), (("SEED", "2"),), 40)),
                             nodelist=("nodea",)),
    "pack-gpus-per-node": PackRequest(_common(), LAUNCHER, SLURMHET, "v100",
                                      (PackMember(42, "a", ("x",)), PackMember(43, "b", ("y",))),
                                      gpu_request_style="gpus-per-node"),
    "pack-mps": PackRequest(replace(_common(), also=(43,)), LAUNCHER, SLURMHET, "v100",
                            (PackMember(42, "a", ("x",), (), 50), PackMember(43, "b", ("y",), (), 50)),
                            sharing="mps", share_count=100, nodelist=("nodea",)),
    # The site has slurmhet's SPANK plugin (profile.spank_plugin): --slurmhet-job everywhere, --slurmhet-mps for MPS packs.
    "batch-gres-spank": BatchRequest(replace(_common(), spank=True), Launch(("python", "train.py"), LAUNCHER), "t4", 2),
    "het-gres-spank": HetJobRequest(replace(_common(), spank=True), Launch(("python", "train.py"), LAUNCHER),
                                    HET_SHAPES, "gres"),
    "pack-mps-spank": PackRequest(replace(_common(), also=(43,), spank=True), LAUNCHER, SLURMHET, "v100",
                                  (PackMember(42, "a", ("x",), (), 50), PackMember(43, "b", ("y",), (), 50)),
                                  sharing="mps", share_count=100, nodelist=("nodea",)),
    "pack-shard": PackRequest(replace(_common(), also=(43,)), LAUNCHER, SLURMHET, "t4",
                              (PackMember(42, "a", ("x",)), PackMember(43, "b", ("y",))), sharing="shard",
                              share_count=2),
    "pack-hostile": PackRequest(_common(HOSTILE_NAME), LAUNCHER, SLURMHET, "k80",
                                (PackMember(42, HOSTILE_NAME, HOSTILE_ARGV), PackMember(43, "b", HOSTILE_ARGV))),
    # From a plan: one node of one type is not pinned (Slurm picks a v100 node); the type picks the partition.
    "plan-batch-one-node": _planned((("nodea", "v100", 2),)),
    # Several nodes: placement chose them, so they are pinned.
    "plan-batch-two-nodes": _planned((("nodea", "v100", 2), ("nodex", "v100", 2)),
                                     DEV_NODES + (Node("nodex", {"v100": 4}),)),
    # Het on the dev cluster's shape: no node holds two of its types, so no nodelist; a partition per component.
    "plan-het-per-type-nodes": _planned((("nodea", "v100", 2), ("nodeb", "t4", 1))),
    # One node holds v100 and t4: both components could land there, so they are pinned.
    "plan-het-shared-node": _planned((("nodea", "v100", 2), ("nodeb", "t4", 1)),
                                     DEV_NODES + (Node("nodem", {"v100": 2, "t4": 2}),)),
    # The spec's own --partition wins over the type's, once per component.
    "plan-het-spec-partition": _planned((("nodea", "v100", 2), ("nodeb", "t4", 1)), sbatch=(("partition", "mine"),)),
    # Resources and environment: CPUs and memory per task (= per GPU), the working directory, modules, and a
    # container as each runtime runs it (pyxis: the srun step in the image; apptainer: the program wrapped).
    "plan-batch-resources-pyxis": _planned((("nodea", "v100", 2),), runtime="pyxis", cpus_per_gpu=2,
                                           mem_per_gpu_mb=3000, workdir="/scratch/it's here",
                                           modules=("cuda/12.4", "nccl"), container="nvcr.io/nvidia/pytorch:24.05-py3"),
    "plan-het-apptainer": _planned((("nodea", "v100", 2), ("nodeb", "t4", 1)), runtime="apptainer",
                                   container="/images/torch.sif", modules=("cuda/12.4",), cpus_per_gpu=1),
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


def _recorder(bin_dir: Path, name: str, record: Path) -> Path:
    """A stand-in program that records its argv and stdin as JSON."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\nimport json,sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'stdin': sys.stdin.read()}}, open({str(record)!r}, 'w'))\n")
    path.chmod(0o755)
    return path


def _run(script: str, tmp_path: Path, **env: str) -> None:
    subprocess.run(["bash", "-c", script], check=True, cwd=tmp_path, stdin=subprocess.DEVNULL,
                   env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), **env})


@pytest.mark.parametrize("name", ["batch-hostile", "het-hostile", "array-hostile", "sweep-hostile"])
def test_hostile_values_stay_data(name: str, tmp_path: Path) -> None:
    """Run the rendered hostile script with a stand-in srun: the argv arrives byte-exact, nothing runs."""
    m = CASES[name].materialize()
    assert "\n#SBATCH" not in m.script  # options never reach sbatch's script parser
    record = tmp_path / "argv.json"
    _recorder(tmp_path / "bin", "srun", record)
    _run(m.script, tmp_path, SLURM_ARRAY_TASK_ID="1")
    got = json.loads(record.read_text())["argv"]
    assert got[-len(HOSTILE_ARGV):] == list(HOSTILE_ARGV)
    assert not (tmp_path / "pwned").exists()
    name_opt = [a for a in m.argv if a.startswith("--job-name=")][0]
    assert all(c.isalnum() or c in "._+-=" for c in name_opt.removeprefix("--job-name"))


def test_hostile_pack_members_reach_run_pack_intact(tmp_path: Path) -> None:
    record = tmp_path / "pack.json"
    slurmhet = _recorder(tmp_path / "bin", "slurmhet", record)
    request = replace(CASES["pack-hostile"], slurmhet=(str(slurmhet),))
    assert isinstance(request, PackRequest)
    _run(request.materialize().script, tmp_path)
    got = json.loads(record.read_text())
    assert got["argv"] == ["run-pack", "/dev/stdin"]
    members = json.loads(got["stdin"])["members"]
    assert [m["argv"][-len(HOSTILE_ARGV):] for m in members] == [list(HOSTILE_ARGV)] * 2
    assert [m["env"]["SLURMHET_JOB_ID"] for m in members] == ["42", "43"]
    assert not (tmp_path / "pwned").exists()


def test_hostile_checkpoint_dir_reaches_consolidate_intact(tmp_path: Path) -> None:
    ckpt = tmp_path / "it's $(touch pwned);\nd"
    ckpt.mkdir()
    (ckpt / "copy-0.pt").write_text("x")
    (ckpt / "copy-2.pt").write_text("x")
    record = tmp_path / "cons.json"
    slurmhet = _recorder(tmp_path / "bin", "slurmhet", record)
    request = ConsolidationRequest(_common(HOSTILE_NAME), (str(slurmhet),), str(ckpt), (0, 1, 2), after=("7",))
    _run(request.materialize().script, tmp_path)
    assert json.loads(record.read_text())["argv"] == [
        "consolidate", "--skip-bad", "--out", f"{ckpt}/consolidated.pt", f"{ckpt}/copy-0.pt", f"{ckpt}/copy-2.pt"]
    assert not (tmp_path / "pwned").exists()


def test_a_failed_replan_after_consolidation_does_not_fail_the_round(tmp_path: Path) -> None:
    """The chaos run's case: slurmctld was restarting when the round's replan ran, so the consolidation job
    exited 1 and the whole forked job was judged FAILED although its round was consolidated."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "copy-0.pt").write_text("x")
    record = tmp_path / "cons.json"
    slurmhet = _recorder(tmp_path / "bin", "slurmhet", record)
    failing = tmp_path / "bin" / "replan-fails"
    failing.write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
    failing.chmod(0o755)
    request = ConsolidationRequest(_common("forked"), (str(slurmhet),), str(ckpt), (0, 1), after=("7",),
                                   then=(str(failing),))
    done = subprocess.run(["bash", "-c", request.materialize().script], cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text())["argv"][:2] == ["consolidate", "--skip-bad"]
    assert "the next scheduled replan plans the next round" in done.stderr


@pytest.mark.parametrize("task", [0, 1, 2])
def test_a_sweep_array_task_runs_its_own_variant(task: int, tmp_path: Path) -> None:
    """Task i gets variant i's program and environment (its own SLURMHET_JOB_ID, no copy index)."""
    record = tmp_path / "argv.json"
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(f"#!{sys.executable}\nimport json,os,sys\njson.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, "
                    f"open({str(record)!r}, 'w'))\n")
    srun.chmod(0o755)
    request = replace(CASES["sweep-gres"], launch=Launch((), LAUNCHER))  # no modules: no `module` here
    _run(request.materialize().script, tmp_path, SLURM_ARRAY_TASK_ID=str(task))
    got = json.loads(record.read_text())
    lr = ("1e-3", "3e-4", "1e-4")[task]
    assert got["argv"] == ["--kill-on-bad-exit=1", *LAUNCHER, "python", "train.py", "--lr", lr]
    assert got["env"]["SLURMHET_JOB_ID"] == str(42 + task)
    assert got["env"]["SLURMHET_CHECKPOINT_DIR"] == f"/ckpt/lr-{lr}"
    assert "SLURMHET_ARRAY_INDEX" not in got["env"]


def test_a_sweep_array_task_with_no_variant_fails_loudly(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "-c", CASES["sweep-gres"].materialize().script], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "7"})
    assert done.returncode == 2 and "array task '7' is no variant of this sweep" in done.stderr
