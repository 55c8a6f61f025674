"""``after:``: names checked per file, resolved to stored ids, and what predecessors' states mean."""

from __future__ import annotations

import pytest
import yaml

from slurmhet.dependencies import resolve, verdicts
from slurmhet.errors import InputError
from slurmhet.spec import load_text
from slurmhet.store import JobState

JOB = "  - {{name: {name}, command: x, workload: 'm (batch size 2)', work: {{steps: 1}}{extra}}}\n"


def specs(*jobs: tuple[str, str]) -> str:
    return "jobs:\n" + "".join(JOB.format(name=n, extra=e) for n, e in jobs)


def test_names_groups_and_ids_resolve_to_stored_ids() -> None:
    text = specs(("train", ", group: tr"), ("train2", ", group: tr"), ("eval", ", after: [train]"),
                 ("all", ", after: [tr, 40]"))
    parsed = load_text(text, "f.yaml")
    assert parsed[3].after == ("tr", 40)
    new = list(zip([11, 12, 13, 14], parsed))
    got = resolve(new, lambda i: ("alice", "old") if i == 40 else None, "alice")
    assert got == {13: (11,), 14: (11, 12, 40)}
    with pytest.raises(InputError, match="no stored job 40 of yours") as err:
        resolve(new, lambda i: ("bob", "old"), "alice")
    assert err.value.place.startswith("f.yaml:5:")
    again = load_text(yaml.safe_dump({**parsed[2].to_dict(), "after": [11]}), "stored")[0]
    assert again.after == (11,)


@pytest.mark.parametrize(("jobs", "words"), [
    ((("a", ", after: [b]"),), "after 'b': no job or group of that name in this file"),
    ((("a", ", after: [a]"),), "after makes a cycle: a -> a"),
    ((("a", ", after: [b]"), ("b", ", after: [c]"), ("c", ", after: [a]")), "cycle: a -> b -> c -> a"),
    ((("a", ", after: [0]"),), "is neither a job name nor a stored job id"),
    ((("a", ", after: [[x]]"),), "is neither a job name nor a stored job id"),
])
def test_bad_after_is_a_placed_error(jobs: tuple[tuple[str, str], ...], words: str) -> None:
    with pytest.raises(InputError) as info:
        load_text(specs(*jobs), "f.yaml")
    assert words in str(info.value) and str(info.value).startswith("f.yaml:") and info.value.exit_code == 2


def test_verdicts_hold_free_and_doom() -> None:
    states = {1: ("train", JobState.RUNNING), 2: ("prep", JobState.COMPLETED), 3: ("bad", JobState.FAILED)}
    held, doomed, chained = verdicts({10: [1, 2], 11: [2], 12: [2, 3], 13: [99]}, states)
    assert chained == {}  # no predecessor runs as its final Slurm job: slurmhet holds them
    assert held == {10: "waits for job 1 (train, RUNNING) to complete (after:)"}
    assert doomed == {12: "cancelled: job 3 (bad) it runs after ended FAILED",
                      13: "cancelled: job 99 (?) it runs after ended CANCELLED"}  # 11 may go: prep completed


def test_a_dependant_chains_in_slurm_only_when_every_open_predecessor_runs_as_its_final_slurm_job() -> None:
    states = {1: ("train", JobState.RUNNING), 2: ("prep", JobState.COMPLETED), 3: ("sweep", JobState.RUNNING),
              4: ("queued", JobState.SUBMITTED)}
    final = {1: ("501",), 3: ("600_2",), 4: ()}  # 4 is pending in Slurm: replan may still move it
    found = verdicts({10: [1, 2], 11: [1, 3], 12: [1, 4], 13: [2]}, states, final)
    assert found.chained == {10: ("501",), 11: ("501", "600_2")}
    assert set(found.held) == {10, 11, 12}  # chained ones still show why they wait until Slurm has them
    assert found.held[12] == "waits for job 1 (train, RUNNING), job 4 (queued, SUBMITTED) to complete (after:)"
