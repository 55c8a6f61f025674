"""The caller's place on a shared cluster (slurmhet/shared_cluster.py): specs refused before Slurm sees them,
and jobs kept to the GPU types their user may reach; on hand-made Slurm records."""

from __future__ import annotations

import pytest

from slurmhet.cluster import Inventory, OpenWorld
from slurmhet.errors import InputError
from slurmhet.planner import plan_job_from_spec
from slurmhet.shared_cluster import SharedCluster, check_access, narrowed, within_reach
from slurmhet.slurm.world import access_of
from slurmhet.spec import JobSpec, load_text
from tests.unit.test_slurm_world import NODES, PARTS, assoc, world

#: No default partition over every node: k80 is only in the k80 partition, open to account ml alone.
PER_TYPE = PARTS[1:]


def spec(gpus: str = "{min: 1, max: 1}", sbatch: str = "") -> JobSpec:
    text = ("jobs:\n  - name: j\n    command: [sleep, '1']\n    workload: {model: ResNet-18, batch_size: 64}\n"
            f"    gpus: {gpus}\n    work: {{steps: 10}}\n" + (f"    sbatch: {sbatch}\n" if sbatch else ""))
    (parsed,) = load_text(text, "jobs.yaml")
    return parsed


def shared_for(user: str = "root", **kw: object) -> SharedCluster:
    w = world(**kw)
    return SharedCluster(w, access_of(w, user, ()), OpenWorld())


def refused(job: JobSpec, shared: SharedCluster) -> InputError:
    with pytest.raises(InputError) as info:
        check_access(job, shared)
    assert info.value.exit_code == 2
    return info.value


def test_a_spec_within_the_users_reach_passes() -> None:
    check_access(spec("{min: 2, max: 4, types: [v100, t4]}"), shared_for())
    check_access(spec(sbatch="['--partition=t4']"), shared_for())


def test_a_partition_that_does_not_exist_or_is_closed_to_the_user_is_refused_with_its_rule() -> None:
    err = refused(spec(sbatch="['--partition=a100']"), shared_for())
    assert "no partition 'a100'" in err.cause and "gpu, v100, t4, k80" in (err.hint or "")
    err = refused(spec(sbatch="['--partition=k80']"), shared_for())
    assert "partition 'k80' is not open to you" in err.cause and "AllowAccounts" in err.cause
    assert err.place == "jobs.yaml:7:13"  # the spec's sbatch line


def test_an_account_the_user_has_no_association_with_is_refused() -> None:
    err = refused(spec(sbatch="['--account=ml']"), shared_for())
    assert "may not use account 'ml'" in err.cause
    # With that association the account also opens the partition it is allowed on.
    check_access(spec("{min: 1, max: 1, types: [k80]}", "['--account=ml']"),
                 shared_for(partitions=PER_TYPE, assocs=(assoc("slurmhet", "root"), assoc("ml", "root"))))


def test_a_qos_outside_the_associations_list_is_refused() -> None:
    check_access(spec(sbatch="['--qos=normal']"), shared_for())
    err = refused(spec(sbatch="['--qos=gpu2']"), shared_for())
    assert "may not use QOS 'gpu2' under account slurmhet" in err.cause and err.hint == "allowed QOS: normal"


def test_gpu_types_only_closed_partitions_hold_are_refused() -> None:
    err = refused(spec("{min: 1, max: 1, types: [k80]}"), shared_for(partitions=PER_TYPE))
    assert "none of its GPU types (k80)" in err.cause and "AllowAccounts" in err.cause
    assert err.hint == "usable GPU types: t4, v100"


def test_a_job_needing_more_gpus_at_once_than_the_qos_allows_is_refused_naming_the_qos() -> None:
    capped = shared_for("bob", assocs=(assoc("capped", "bob", "gpu2"),), default_account="capped")
    check_access(spec("{min: 2, max: 4}"), capped)
    err = refused(spec("{min: 3, max: 3}"), capped)
    assert "needs 3 GPUs at once but QOS gpu2" in err.cause and "allows 2" in err.cause


def test_only_the_callers_jobs_are_kept_to_their_reach_and_only_narrows_further() -> None:
    shared = shared_for(partitions=PER_TYPE)
    reach = within_reach({1: "root", 2: "alice"}, shared, only={1: ("v100", "k80"), 3: ("t4",)})
    assert reach == {1: ("v100",), 3: ("t4",)}  # k80 is out of root's reach; alice's job 2 is as stored
    assert within_reach({1: "root"}, None) == {}


def test_narrowed_keeps_a_running_job_where_it_runs_and_an_unplaced_one_to_its_reach() -> None:
    inventory = Inventory(NODES)
    job = plan_job_from_spec("1", spec("{min: 1, max: 1, types: [v100, k80]}"), 0.0)
    assert narrowed(job, ("t4", "v100"), inventory).allowed_types == ("v100",)
    assert narrowed(job, None, inventory) is job
    anything = plan_job_from_spec("2", spec(), 0.0)
    assert narrowed(anything, ("t4", "v100"), inventory).allowed_types == ("t4", "v100")
