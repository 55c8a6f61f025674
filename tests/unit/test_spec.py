"""Job spec validation: good files parse; each class of bad input names its place and exits 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmhet.cli import main
from slurmhet.cluster import Inventory, Node
from slurmhet.errors import InputError
from slurmhet.spec import check_against_cluster, load_text

GOOD = """\
jobs:
  - name: resnet
    command: python train.py --lr '0.1 x'
    workload: {model: ResNet-18, batch_size: 64, samples_per_s_hint: {T4: 900}, precision: mixed,
               arithmetic_intensity: 40}
    cpus_per_gpu: 4
    mem_per_gpu: 16G
    workdir: /scratch/me
    modules: [cuda/12.4]
    container: /images/torch.sif
    partition: gpu
    work: {epochs: 2, dataset_size: 50000}
    gpus: {min: 1, max: 4, types: [V100, t4]}
    sbatch: ['--account=ml', '--exclusive']
    time_limit: "1:30"
  - name: lm
    entrypoint: mypkg.train:main
    args: [1, two]
    workload: "LM (batch size 20)"
    work: {steps: 1000}
    global_batch: 80
    sync: local-sgd
    colocate: true
    env: {OMP_NUM_THREADS: 4}
"""


def test_good_file_parses_to_typed_specs() -> None:
    a, b = load_text(GOOD, "jobs.yaml")
    assert a.command == ("python", "train.py", "--lr", "0.1 x")
    assert a.gpus.types == ("v100", "t4") and (a.gpus.min, a.gpus.max) == (1, 4)
    assert a.total_samples == 100000 and a.time_limit_min == 90
    assert a.workload.samples_per_s_hint == (("t4", 900.0),) and a.workload.precision == "mixed"
    assert a.workload.arithmetic_intensity == 40.0 and b.workload.precision == "fp32"
    assert (a.cpus_per_gpu, a.mem_per_gpu_mb, a.workdir, a.modules, a.container) == (
        4, 16384, "/scratch/me", ("cuda/12.4",), "/images/torch.sif")
    assert a.sbatch == (("account", "ml"), ("exclusive", None), ("partition", "gpu"))  # the field is the option
    assert b.workload.key == "LM (batch size 20)" and b.total_samples == 80000
    assert b.forkable and b.colocate and b.env == (("OMP_NUM_THREADS", "4"),)
    assert b.entrypoint == "mypkg.train:main" and b.args == (1, "two")


def test_round_trip_through_to_dict() -> None:
    for spec in load_text(GOOD, "jobs.yaml"):
        import yaml

        again = load_text(yaml.safe_dump(spec.to_dict()), "again.yaml")[0]
        assert again == spec


BASE = "name: a\ncommand: x\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n"


@pytest.mark.parametrize(
    ("text", "place", "words"),
    [
        ("name: a\ncomand: x\n", "f.yaml:2:1", "did you mean 'command'"),
        ("name: [a\n", "f.yaml:2:1", "YAML syntax error"),
        ("name: a\nname: b\ncommand: x\n", "f.yaml:2:1", "duplicate key 'name'"),
        ("jobs:\n  - {name: a, 3: [x], name: b}\n", "f.yaml:2:", "duplicate key 'name'"),
        (BASE + "gpus: {min: 3, max: 1}\n", "f.yaml:5:", "below min"),
        (BASE + "gpus: {min: 0}\n", "f.yaml:5:", ">= 1"),
        (BASE + "sbatch: ['--gres=gpu:2']\n", "f.yaml:5:", "managed by slurmhet"),
        (BASE + "sbatch: {constraint: volta}\n", "f.yaml:5:", "planner chooses the nodes"),
        (BASE + 'sbatch: ["--account=a\\nb"]\n', "f.yaml:5:", "line break"),
        (BASE + "weight: -1\n", "f.yaml:5:", "must be > 0"),
        (BASE + "sync: allreduc\n", "f.yaml:5:", "did you mean 'allreduce'"),
        (BASE + "env: {SLURM_JOB_ID: 3}\n", "f.yaml:5:", "set by Slurm"),
        (BASE.replace("work: {steps: 3}", "work: {epochs: 2}"), "f.yaml:4:", "needs steps, or epochs"),
        ("name: a\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n", "f.yaml:1:1", "exactly one of"),
        (BASE + "time_limit: soon\n", "f.yaml:5:", "time_limit"),
        (BASE.replace("batch_size: 2}", "batch_size: 2, samples_per_s_hint: {t4: 0}}"), "f.yaml:3:",
         "not a positive number of samples/s"),
        (BASE.replace("batch_size: 2}", "batch_size: 2, samples_per_s_hint: [900]}"), "f.yaml:3:",
         "must map GPU types to samples/s"),
        (BASE.replace("batch_size: 2}", "batch_size: 2, precision: fp8}"), "f.yaml:3:", "unknown precision"),
        (BASE + "cpus_per_gpu: 0\n", "f.yaml:5:", "must be >= 1"),
        (BASE + "mem_per_gpu: 12X\n", "f.yaml:5:", "is not an amount of memory"),
        (BASE + "mem_per_gpu: 0G\n", "f.yaml:5:", "is not an amount of memory"),
        (BASE + "modules: ['cuda 12']\n", "f.yaml:5:", "is not a module name"),
        (BASE + 'workdir: "a\\nb"\n', "f.yaml:5:", "line break"),
        (BASE + "account: ml\nsbatch: ['--account=ml']\n", "f.yaml:5:", "given both here and in 'sbatch:'"),
        (BASE + "qos: 'high; rm'\n", "f.yaml:5:", "is not a qos name"),
        (BASE + "colocate: true\ncontainer: img.sif\n", "f.yaml:5:", "co-located jobs share"),
        (BASE + "sbatch: ['--cpus-per-gpu=2']\n", "f.yaml:5:", "use 'cpus_per_gpu:'"),
        (BASE + "sbatch: ['--chdir=/x']\n", "f.yaml:5:", "use the spec's 'workdir:'"),
        (BASE + "sbatch: ['--reservation=maint']\n", "f.yaml:5:", "MAGNETIC reservation open to you"),
        (BASE.replace("batch_size: 2}", "batch_size: 2, arithmetic_intensity: -3}"), "f.yaml:3:", "must be > 0"),
        ("jobs: []\n", "f.yaml:1:", "non-empty list"),
        ("jobs:\n  - " + BASE.replace("\n", "\n    ").rstrip() + "\n  - " + BASE.replace("\n", "\n    ").rstrip() + "\n",
         "f.yaml:", "used twice"),
    ],
)
def test_bad_input_names_place_and_hint(text: str, place: str, words: str) -> None:
    with pytest.raises(InputError) as info:
        load_text(text, "f.yaml")
    message = str(info.value)
    assert message.startswith(place), message
    assert words in message
    assert "(hint: " in message
    assert "\n" not in message.split(" (hint:")[0]


def test_cpus_and_memory_per_gpu_must_fit_some_node() -> None:
    from slurmhet.cluster import Inventory, Node

    inv = Inventory((Node("nodea", {"v100": 4}, cpus=4, memory_mb=4000), Node("nodeb", {"t4": 4}, cpus=16)))
    spec = load_text(BASE + "cpus_per_gpu: 8\ngpus: {min: 1, max: 1, types: [v100]}\n", "f.yaml")[0]
    with pytest.raises(InputError, match="no node of its GPU types has the CPUs and memory for one GPU") as info:
        check_against_cluster(spec, inv)
    assert str(info.value).startswith("f.yaml:5:")
    two = load_text(BASE + "cpus_per_gpu: 2\nmem_per_gpu: 1G\ngpus: {min: 3, max: 4, types: [v100]}\n", "f.yaml")[0]
    with pytest.raises(InputError, match="at least 3 GPUs but the cluster has 2"):  # 4 CPUs feed 2 GPUs
        check_against_cluster(two, inv)
    check_against_cluster(load_text(BASE + "cpus_per_gpu: 4\n", "f.yaml")[0], inv)  # t4 nodes have the CPUs


def test_cluster_checks_type_and_size() -> None:
    inventory = Inventory((Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4})))
    typo = load_text(BASE + "gpus: {types: [v10]}\n", "f.yaml")[0]
    with pytest.raises(InputError, match="did you mean 'v100'"):
        check_against_cluster(typo, inventory)
    big = load_text(BASE + "gpus: {min: 5, types: [v100]}\n", "f.yaml")[0]
    with pytest.raises(InputError, match="at least 5 GPUs but the cluster has 4"):
        check_against_cluster(big, inventory)
    check_against_cluster(load_text(BASE + "gpus: 8\n", "f.yaml")[0], inventory)


def test_validate_command_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(BASE + "gpu: 2\n")
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", str(good)])
    assert ok.exit_code == 0 and "resnet" in ok.output
    result = runner.invoke(main, ["validate", str(good), str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:5:1: unknown field 'gpu'" in result.output and "did you mean 'gpus'" in result.output
