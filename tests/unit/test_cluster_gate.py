"""The cluster tests' gate: which sinfo states count as out of service, and the jobs an earlier test left (no Slurm
needed)."""

from __future__ import annotations

from tests.conftest import _clear_leftovers, _job_rows, _kill_task_failed, _out_of_service, _wait_in_service


def test_states_that_take_jobs_pass() -> None:
    nodes = "nodea|idle|none\nnodeb|mixed|none\nnodec|allocated|none\nnodea|completing|none\nnodeb|reserved|none\n"
    assert _out_of_service(nodes) == []


def test_each_out_of_service_state_is_named_with_its_reason() -> None:
    nodes = ("nodea|down*|Not responding\nnodeb|drained|slurmhet test\nnodec|idle*|none\n"
             "noded|draining|a|b\nnodee|fail|bad gpu\nnodef|idle|none\n")
    assert _out_of_service(nodes) == ["nodea down* (Not responding)", "nodeb drained (slurmhet test)",
                                      "nodec idle* (none)", "noded draining (a|b)", "nodee fail (bad gpu)"]


def test_an_answer_without_nodes_is_out_of_service() -> None:
    assert _out_of_service("") == ["sinfo listed no node"]
    assert _out_of_service("sinfo -> 1: slurm_load_node: Unable to contact slurm controller") == [
        "sinfo -> 1: slurm_load_node: Unable to contact slurm controller"]


class _Clock:
    """A clock that `sleep` moves on, and a reader that answers a script of sinfo outputs (the last one repeats)."""

    def __init__(self, answers: list[str]) -> None:
        self.now, self.answers, self.reads = 0.0, answers, 0

    def read(self) -> str:
        self.reads += 1
        return self.answers[min(self.reads, len(self.answers)) - 1]

    def sleep(self, seconds: float) -> None:
        self.now += seconds


UP = "nodea|idle|none\nnodeb|idle|none\n"
NODEB_OUT = "nodea|idle|none\nnodeb|drained|Kill task failed\n"


def test_a_node_that_returns_within_the_wait_lets_the_test_run() -> None:
    clock, gave_up = _Clock([NODEB_OUT, NODEB_OUT, UP]), set[str]()
    assert _wait_in_service(clock.read, 150, gave_up, clock=lambda: clock.now, sleep=clock.sleep) is None
    assert clock.reads == 3 and clock.now == 4 and gave_up == set()


def test_a_node_given_up_on_fails_later_tests_at_once_and_another_node_is_still_waited_for() -> None:
    clock, gave_up = _Clock([NODEB_OUT]), set[str]()
    why = _wait_in_service(clock.read, 150, gave_up, clock=lambda: clock.now, sleep=clock.sleep)
    assert why == "dev cluster node(s) out of service for 150s before the test: nodeb drained (Kill task failed)"
    assert gave_up == {"nodeb"} and 150 < clock.now <= 154

    again = _Clock([NODEB_OUT])  # the next test: no second 150 s wait for the same node
    why = _wait_in_service(again.read, 150, gave_up, clock=lambda: again.now, sleep=again.sleep)
    assert why == "dev cluster node(s) still out of service, as an earlier test found: nodeb drained (Kill task failed)"
    assert again.reads == 1 and again.now == 0

    both = _Clock(["nodea|down*|Not responding\nnodeb|drained|Kill task failed\n", UP])  # nodea is new: waited for
    assert _wait_in_service(both.read, 150, gave_up, clock=lambda: both.now, sleep=both.sleep) is None
    assert both.reads == 2


def test_only_an_emptied_node_drained_for_kill_task_failed_is_resumed() -> None:
    nodes = ("nodea|drained|Kill task failed\nnodeb|draining|Kill task failed\nnodec|drained|slurmhet test\n"
             "noded|drained*|Kill task failed\nnodee|idle|none\n")
    assert _kill_task_failed(nodes) == ["nodea"]  # draining: a job still ends there; drained*: slurmd not answering


def test_the_gate_resumes_a_node_drained_for_kill_task_failed_and_the_test_runs() -> None:
    clock, gave_up, resumed = _Clock([NODEB_OUT, UP]), set[str](), list[str]()
    assert _wait_in_service(clock.read, 150, gave_up, resume=resumed.append, clock=lambda: clock.now,
                            sleep=clock.sleep) is None
    assert resumed == ["nodeb"] and clock.reads == 2 and gave_up == set()


LEFT = "4113|root|RUNNING|w-blocker3\n4120|slurmhet-noise|PENDING|wrap\n"


def test_queue_rows_name_each_job_once_by_its_id() -> None:
    assert _job_rows(LEFT + "\n") == {"4113": "root RUNNING w-blocker3", "4120": "slurmhet-noise PENDING wrap"}
    assert _job_rows("") == {}


def test_an_empty_queue_cancels_nothing() -> None:
    clock, cancelled = _Clock([""]), list[list[str]]()
    assert _clear_leftovers(clock.read, cancelled.append, 240, set(), clock=lambda: clock.now,
                            sleep=clock.sleep) is None
    assert cancelled == [] and clock.reads == 1


def test_jobs_an_earlier_test_left_are_cancelled_and_waited_for_until_gone() -> None:
    clock, cancelled, waited = _Clock([LEFT, "4113|root|COMPLETING|w-blocker3\n", ""]), list[list[str]](), set[str]()
    said = _clear_leftovers(clock.read, cancelled.append, 240, waited, clock=lambda: clock.now, sleep=clock.sleep)
    assert cancelled == [["4113", "4120"]]
    assert said == ("dev cluster: cancelled job(s) an earlier test left in the queue: 4113 (root RUNNING w-blocker3); "
                    "4120 (slurmhet-noise PENDING wrap)")
    assert clock.reads == 3 and clock.now == 2 and waited == set()


def test_a_job_that_outlasts_the_wait_is_named_and_not_waited_for_again() -> None:
    stuck, waited = "4113|root|COMPLETING|w-blocker3\n", set[str]()
    clock, cancelled = _Clock([stuck]), list[list[str]]()
    said = _clear_leftovers(clock.read, cancelled.append, 240, waited, clock=lambda: clock.now, sleep=clock.sleep)
    assert said is not None and said.endswith("; still there after 240s: 4113 (root COMPLETING w-blocker3)")
    assert waited == {"4113"} and 240 < clock.now <= 244

    again = _Clock([stuck])  # the next test: cancelled again, but no second wait for the same job
    said = _clear_leftovers(again.read, cancelled.append, 240, waited, clock=lambda: again.now, sleep=again.sleep)
    assert said == "dev cluster: cancelled job(s) an earlier test left in the queue: 4113 (root COMPLETING w-blocker3)"
    assert again.reads == 2 and again.now == 0


def test_a_job_that_requeues_itself_on_the_cancel_is_cancelled_again() -> None:
    """26.05 in CI: a cancelled slurmhet job went from COMPLETING back to PENDING (its wrapper requeued it on the
    cancel's SIGTERM) and held a V100 through the next test."""
    script = [LEFT, "4113|root|COMPLETING|hidden\n", "4113|root|PENDING|hidden\n", ""]
    clock, cancelled, waited = _Clock(script), list[list[str]](), set[str]()
    said = _clear_leftovers(clock.read, cancelled.append, 240, waited, clock=lambda: clock.now, sleep=clock.sleep)
    assert cancelled == [["4113", "4120"], ["4113"]]
    assert said is not None and said.endswith("; cancelled again after requeueing themselves: 4113")
    assert waited == set() and clock.reads == 4
