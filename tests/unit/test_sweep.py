"""`sweep:` expansion: grid and list forms, placeholders, names, groups, and errors placed in the sweep block."""

from __future__ import annotations

import pytest
import yaml

from slurmhet.errors import InputError
from slurmhet.spec import load_text

GRID = """\
jobs:
  - name: resnet-{lr}
    sweep: {lr: [1e-3, 3e-4, 1e-4], seed: [0, 1]}
    command: [python, train.py, --lr, "{lr}", --seed, "{seed}", --tag, "${HOME}/{lr}"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
    env: {RUN_SEED: "{seed}"}
    checkpoint_dir: /ckpt/{lr}-{seed}
  - name: other
    command: [python, other.py]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
"""


def test_grid_expands_every_combination_with_placeholders_and_a_group() -> None:
    specs = load_text(GRID, "g.yaml")
    variants = specs[:6]
    assert [s.name for s in variants] == ["resnet-1e-3-seed0", "resnet-1e-3-seed1", "resnet-3e-4-seed0",
                                          "resnet-3e-4-seed1", "resnet-1e-4-seed0", "resnet-1e-4-seed1"]
    first = variants[0]
    assert first.command == ("python", "train.py", "--lr", "1e-3", "--seed", "0", "--tag", "${HOME}/1e-3")
    assert first.env == (("RUN_SEED", "0"),) and first.checkpoint_dir == "/ckpt/1e-3-0"
    assert {s.group for s in variants} == {"resnet"} and specs[6].name == "other" and specs[6].group is None
    again = load_text(yaml.safe_dump(variants[3].to_dict()), "stored")[0]
    assert again == variants[3]  # the store keeps a variant, not the sweep


def test_list_form_and_entrypoint_args_and_an_own_group() -> None:
    text = ("name: lm\ngroup: week48\nentrypoint: pkg.train:main\nargs: ['{lr}', 3]\n"
            "sweep: [{lr: 0.1}, {lr: 0.01}]\nworkload: {model: LM, batch_size: 20}\nwork: {steps: 5}\n")
    specs = load_text(text, "l.yaml")
    assert [(s.name, s.args, s.group) for s in specs] == [("lm-lr0.1", ("0.1", 3), "week48"),
                                                           ("lm-lr0.01", ("0.01", 3), "week48")]


BASE = "name: a-{lr}\ncommand: [x, '{lr}']\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n"


@pytest.mark.parametrize(("sweep", "words"), [
    ("sweep: {lr: []}", "sweep.lr must be a non-empty list"),
    ("sweep: {lr: [1, 1]}", "lists a value twice"),
    ("sweep: {lr: [[1]]}", "every value must be a number or a word"),
    ("sweep: {lr: [1], batch: [2]}", "sweep key 'batch' is used nowhere"),
    ("sweep: {1x: [1]}", "is not a name"),
    ("sweep: [{lr: 1}, {lr: 1}]", "both get the name 'a-1'"),
    ("sweep: [{lr: 1}, {rate: 2}]", "sweep[1] has keys ['rate']"),
    ("sweep: 3", "must be a non-empty mapping of lists"),
    ("sweep: {lr: [" + ", ".join(str(i) for i in range(40)) + "], s: [" + ", ".join(str(i) for i in range(30))
     + "]}", "the sweep makes 1200 variants"),
])
def test_bad_sweeps_point_into_the_sweep_block(sweep: str, words: str) -> None:
    text = BASE.replace("command: [x, '{lr}']", "command: [x, '{lr}', '{s}']") if "s:" in sweep else BASE
    with pytest.raises(InputError) as info:
        load_text(text + sweep + "\n", "f.yaml")
    message = str(info.value)
    assert message.startswith("f.yaml:5:"), message  # the sweep block's line
    assert words in message and "(hint: " in message and info.value.exit_code == 2


def test_a_variant_error_names_the_variant_and_the_line() -> None:
    text = BASE + "gpus: {min: '{lr}'}\nsweep: {lr: [1, 2]}\n"
    with pytest.raises(InputError) as info:
        load_text(text, "f.yaml")
    assert str(info.value).startswith("f.yaml:5:") and "sweep[0].gpus" in str(info.value)


def test_variant_names_must_not_clash_with_other_jobs() -> None:
    text = ("jobs:\n  - {name: a, command: x, workload: 'm (batch size 2)', work: {steps: 1}, sweep: {v: [1]},"
            " args: []}\n")
    with pytest.raises(InputError, match="is used nowhere"):
        load_text(text, "f.yaml")
    clash = ("jobs:\n  - {name: a-v1, command: x, workload: 'm (batch size 2)', work: {steps: 1}}\n"
             "  - {name: a, command: [x, '{v}'], workload: 'm (batch size 2)', work: {steps: 1}, sweep: {v: [1]}}\n")
    with pytest.raises(InputError, match="'a-v1' is used twice"):
        load_text(clash, "f.yaml")
