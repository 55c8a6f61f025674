"""Pure emission rules: refusals Slurm would make, array chunking, plan -> Slurm form mapping."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.emit.from_plan import EmitSettings, gpu_shapes, pack_parts, requests_for, sweep_arrays
from slurmhet.emit.requests import (ArrayChunk, ArrayRequest, BatchRequest, Common, ConsolidationRequest, GpuShape,
                                    HetJobRequest, Launch, PackRequest, SweepArrayRequest, chunk_array)
from slurmhet.errors import InputError
from slurmhet.planner.model import Allocation, JobPlan
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import GpuRequest, JobSpec, Workload

LAUNCH = Launch(("true",), ("python", "-m", "slurmhet", "run", "--"))
PROFILE = SiteProfile("22.05.8", True, 1001, 10**6, "gres", False, True, True)
SETTINGS = EmitSettings("/logs", LAUNCH.launcher, ("python", "-m", "slurmhet"), pack_sharing="auto")


def _common(**kw: object) -> Common:
    return Common(job_id=1, name="j", log_dir="/logs", **kw)  # type: ignore[arg-type]


def _spec(**kw: object) -> JobSpec:
    return JobSpec(name="j", workload=Workload("ResNet-18", 64), global_batch=64, command=("train",), steps=10,
                   gpus=GpuRequest(1, 8), **kw)  # type: ignore[arg-type]


def _plan(slots: tuple[tuple[str, str, int], ...], weights: tuple[float, ...] = (), group: str | None = None) -> JobPlan:
    return JobPlan("1", Allocation(slots), weights, 1.0, 1.0, 0.0, 1.0, 1.0, 0, colocation_group=group)


def test_het_job_that_is_an_array_is_refused() -> None:
    req = HetJobRequest(_common(extra=(("array", "0-3"),)), LAUNCH, (GpuShape("v100", 1), GpuShape("t4", 1)))
    with pytest.raises(InputError, match="heterogeneous job cannot also be a job array"):
        req.materialize()


@pytest.mark.parametrize("extra", [(("gres", "mps:50"),), (("gres", "gpu:1,mps:50"),)])
def test_gpu_with_mps_is_refused(extra: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(InputError, match="gpu and mps cannot be requested together"):
        BatchRequest(_common(extra=extra), LAUNCH, "v100", 1).materialize()


def test_mps_pack_alone_is_accepted_and_requests_only_mps() -> None:
    pack = pack_parts([(1, _spec(), _plan((("nodea", "v100", 1),))), (2, _spec(), _plan((("nodea", "v100", 1),)))],
                      PROFILE, SETTINGS, _inventory())[0].request
    assert isinstance(pack, PackRequest)
    argv = pack.materialize().argv
    assert "--gres=mps:v100:100" in argv and not any(a.startswith("--gres=gpu") for a in argv)
    assert "--comment=slurmhet:1,2" in argv


def test_het_weights_must_cover_every_rank() -> None:
    req = HetJobRequest(_common(), LAUNCH, (GpuShape("v100", 2), GpuShape("t4", 1)), shard_weights=(0.5, 0.5))
    with pytest.raises(InputError, match="2 shard weights for 3 ranks"):
        req.materialize()


def test_one_component_is_not_a_het_job() -> None:
    with pytest.raises(InputError, match="at least two components"):
        HetJobRequest(_common(), LAUNCH, (GpuShape("v100", 2),)).materialize()


@pytest.mark.parametrize("first,count,limit,expected", [
    (0, 5, 1001, [(0, 5, 0)]),
    (2, 3, 1001, [(2, 3, 0)]),  # forked copies keep their task numbers
    (0, 5000, 1001, [(0, 1001, 0), (0, 1001, 1001), (0, 1001, 2002), (0, 1001, 3003), (0, 996, 4004)]),
    (999, 3, 1001, [(0, 3, 999)]),  # index 1001 would be refused: restart at 0 with an offset
])
def test_chunk_array(first: int, count: int, limit: int, expected: list[tuple[int, int, int]]) -> None:
    chunks = chunk_array(first, count, limit)
    assert [(c.first_index, c.count, c.task_offset) for c in chunks] == expected
    tasks = [c.task_offset + i for c in chunks for i in range(c.first_index, c.last_index + 1)]
    assert tasks == list(range(first, first + count)) and all(c.last_index < limit for c in chunks)


def test_array_spec_and_store_rows_per_task() -> None:
    from slurmhet.emit.multipart import SubmittedPart
    req = ArrayRequest(_common(), LAUNCH, GpuShape("k80", 1), ArrayChunk(0, 1001, 2002), throttle=5, round=3)
    assert "--array=0-1000%5" in req.materialize().argv
    rows = SubmittedPart("array", "77", req, ()).store_rows()
    assert len(rows) == 1001 and rows[-1]["array_task"] == 1000 and {r["round"] for r in rows} == {3}


def test_consolidation_needs_its_array_ids() -> None:
    with pytest.raises(InputError, match="array job ids"):
        ConsolidationRequest(_common(), ("slurmhet",), "/ckpt", (0, 1)).materialize()


def test_gpu_shapes_permute_weights_into_slurm_rank_order() -> None:
    # plan order (sorted slots): nodea/v100 x2, nodeb/t4 x1, nodec/v100 x1 -> v100 uneven: one component per node
    alloc = Allocation((("nodea", "v100", 2), ("nodeb", "t4", 1), ("nodec", "v100", 1)))
    shapes, weights = gpu_shapes(alloc, (0.3, 0.3, 0.1, 0.3))
    assert [(s.gpu_type, s.gpus_per_node, s.nodelist) for s in shapes] == [
        ("v100", 2, ("nodea",)), ("v100", 1, ("nodec",)), ("t4", 1, ("nodeb",))]
    assert weights == (0.3, 0.3, 0.3, 0.1)


def test_plan_shapes_map_to_slurm_forms() -> None:
    one = requests_for(1, _spec(), _plan((("nodea", "v100", 2), ("nodeb", "v100", 2))), PROFILE, SETTINGS)
    assert [type(p.request) for p in one] == [BatchRequest]
    assert one[0].request.nodes == 2 and one[0].request.nodelist == ("nodea", "nodeb")  # type: ignore[union-attr]
    two = requests_for(1, _spec(), _plan((("nodea", "v100", 1), ("nodeb", "t4", 1)), (0.7, 0.3)), PROFILE, SETTINGS)
    assert [type(p.request) for p in two] == [HetJobRequest]
    assert "SLURMHET_SHARD_WEIGHTS=0.700000,0.300000" in two[0].request.materialize().script


def test_forked_copies_become_arrays_then_a_dependent_consolidation() -> None:
    copies = (Allocation((("nodea", "v100", 2),)), Allocation((("nodeb", "t4", 2),)), Allocation((("nodex", "t4", 2),)))
    spec = _spec(sync="local-sgd", checkpoint_dir="/ckpt")
    parts = requests_for(1, spec, _plan(copies[0].slots), PROFILE, SETTINGS, copies=copies, round=2)
    assert [p.role for p in parts] == ["array", "array", "consolidation"]
    arrays = [p.request for p in parts[:2]]
    assert [a.array_spec() for a in arrays] == ["0%1", "1-2%2"]  # type: ignore[union-attr]
    assert parts[2].after == (0, 1) and parts[2].request.copy_tasks == (0, 1, 2)  # type: ignore[union-attr]
    assert "SLURMHET_CHECKPOINT_DIR=/ckpt" in arrays[0].materialize().script


def test_forked_job_without_checkpoint_dir_is_refused() -> None:
    copies = (Allocation((("nodea", "v100", 1),)), Allocation((("nodeb", "t4", 1),)))
    with pytest.raises(InputError, match="checkpoint_dir"):
        requests_for(1, _spec(sync="local-sgd"), _plan(copies[0].slots), PROFILE, SETTINGS, copies=copies)


def _inventory() -> Inventory:
    return Inventory((Node("nodea", {"v100": 4}, mps=400), Node("nodeb", {"t4": 4}, shards=8), Node("nodec", {"k80": 2})))


def test_pack_sharing_follows_the_node() -> None:
    def pack(node: str, gpu: str, sharing: str) -> PackRequest:
        s = EmitSettings("/logs", LAUNCH.launcher, ("slurmhet",), pack_sharing=sharing)
        plans = [(i, _spec(), _plan(((node, gpu, 1),))) for i in (1, 2)]
        return pack_parts(plans, PROFILE, s, _inventory())[0].request  # type: ignore[return-value]
    assert (pack("nodea", "v100", "auto").sharing, pack("nodea", "v100", "auto").share_count) == ("mps", 100)
    assert (pack("nodeb", "t4", "auto").sharing, pack("nodeb", "t4", "auto").share_count) == ("shard", 2)
    assert pack("nodec", "k80", "auto").sharing == "gpu" and pack("nodea", "v100", "gpu").sharing == "gpu"


def test_plan_facts_reach_the_runtime_environment() -> None:
    """Nominal workers (relaxed sync), the time limit (timeout vs preemption) and the settings' env are exported."""
    settings = EmitSettings("/logs", LAUNCH.launcher, ("python", "-m", "slurmhet"),
                            env=(("SLURMHET_PROGRESS_DIR", "/p"),))
    spec = JobSpec(name="j", workload=Workload("ResNet-18", 64), global_batch=256, command=("train",), steps=10,
                   gpus=GpuRequest(1, 8), time_limit_min=30, sync="local-sgd", checkpoint_dir="/ckpt")
    script = requests_for(1, spec, _plan((("nodea", "v100", 2),)), PROFILE, settings)[0].request.materialize().script
    for line in ("SLURMHET_NOMINAL_WORKERS=4", "SLURMHET_TIME_LIMIT_S=1800", "SLURMHET_PROGRESS_DIR=/p"):
        assert f"export {line}\n" in script
    copies = (Allocation((("nodea", "v100", 1),)), Allocation((("nodeb", "t4", 1),)))
    parts = requests_for(7, spec, _plan(copies[0].slots), PROFILE, settings, copies=copies)
    consolidation = parts[-1].resolved(["11", "12"]).materialize()
    assert "export SLURMHET_JOB_ID=7\n" in consolidation.script and "export SLURMHET_PROGRESS_DIR=/p\n" in consolidation.script
    assert "--open-mode=append" in consolidation.argv


PARTITIONS = {"v100": "v100", "t4": "t4", "k80": "k80"}
TYPED = EmitSettings("/logs", LAUNCH.launcher, ("slurmhet",), partitions=PARTITIONS)


def _opts(argv: tuple[str, ...], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]


def test_one_node_of_one_type_is_left_to_slurm_and_several_nodes_stay_pinned() -> None:
    one = requests_for(1, _spec(), _plan((("nodea", "v100", 2),)), PROFILE, TYPED)[0].request.materialize().argv
    assert not _opts(one, "nodelist") and _opts(one, "nodes") == ["1"] and _opts(one, "partition") == ["v100"]
    two = requests_for(1, _spec(), _plan((("nodea", "v100", 2), ("nodeb", "v100", 2))), PROFILE, TYPED)
    assert _opts(two[0].request.materialize().argv, "nodelist") == ["nodea,nodeb"]


HET = (("nodea", "v100", 2), ("nodeb", "t4", 1))


def test_het_is_pinned_only_where_two_components_could_share_a_node() -> None:
    def nodelists(inventory: Inventory | None, slots: tuple[tuple[str, str, int], ...] = HET) -> list[str]:
        request = requests_for(1, _spec(), _plan(slots), PROFILE, TYPED, inventory=inventory)[0].request
        return _opts(request.materialize().argv, "nodelist")
    assert nodelists(_inventory()) == []  # the dev cluster: one type per node
    mixed = Inventory(_inventory().nodes + (Node("nodem", {"v100": 1, "t4": 1}),))
    assert nodelists(mixed) == ["nodea", "nodeb"]
    assert nodelists(None) == ["nodea", "nodeb"]  # nodes unknown: pinned, to be safe
    uneven = Inventory(_inventory().nodes + (Node("nodex", {"v100": 4}),))  # one type, two components
    assert nodelists(uneven, (("nodea", "v100", 2), ("nodex", "v100", 1))) == ["nodea", "nodex"]


def test_partition_per_component_and_who_wins() -> None:
    def partitions(settings: EmitSettings, **kw: object) -> list[str]:
        request = requests_for(1, _spec(**kw), _plan(HET), PROFILE, settings, inventory=_inventory())[0].request
        return _opts(request.materialize().argv, "partition")
    assert partitions(TYPED) == ["v100", "t4"]
    assert partitions(TYPED, sbatch=(("partition", "mine"),)) == ["mine", "mine"]  # the spec's own, not duplicated
    site = EmitSettings("/logs", LAUNCH.launcher, ("slurmhet",), partition="site", partitions=PARTITIONS)
    assert partitions(site) == ["site", "site"]
    assert partitions(SETTINGS) == []  # nothing known: Slurm's default partition
    lone = EmitSettings("/logs", LAUNCH.launcher, ("slurmhet",), partitions={"t4": "t4"})
    assert partitions(lone) == ["t4"]  # a type without a partition: its component goes to Slurm's default


def test_forked_and_packed_parts_take_their_types_partition() -> None:
    copies = (Allocation((("nodea", "v100", 2),)), Allocation((("nodeb", "t4", 2),)), Allocation((("nodex", "t4", 2),)))
    spec = _spec(sync="local-sgd", checkpoint_dir="/ckpt")
    parts = requests_for(1, spec, _plan(copies[0].slots), PROFILE, TYPED, copies=copies)
    argvs = [p.resolved(["11", "12"]).materialize().argv for p in parts]
    # The consolidation needs no GPU: any of the copies' partitions, the first copy's first, so that one whose
    # nodes drained after the copies ran does not hold it (Slurm starts it in the first that can).
    assert [_opts(a, "partition") for a in argvs] == [["v100"], ["t4"], ["v100,t4"]]
    assert [_opts(a, "nodelist") for a in argvs] == [["nodea"], [], []]  # copies as before
    one_type = requests_for(1, spec, _plan(copies[1].slots), PROFILE, TYPED, copies=copies[1:])
    assert _opts(one_type[-1].resolved(["11"]).materialize().argv, "partition") == ["t4"]
    # A copy type without a partition goes to Slurm's default, which a list cannot name: the first copy's, as before.
    lone = EmitSettings("/logs", LAUNCH.launcher, ("slurmhet",), partitions={"v100": "v100"})
    default = requests_for(1, spec, _plan(copies[0].slots), PROFILE, lone, copies=copies)
    assert _opts(default[-1].resolved(["11", "12"]).materialize().argv, "partition") == ["v100"]
    site = EmitSettings("/logs", LAUNCH.launcher, ("slurmhet",), partition="site", partitions=PARTITIONS)
    assert _opts(requests_for(1, spec, _plan(copies[0].slots), PROFILE, site, copies=copies)[-1]
                 .resolved(["11", "12"]).materialize().argv, "partition") == ["site"]
    plans = [(i, _spec(), _plan((("nodeb", "t4", 1),))) for i in (1, 2)]
    pack = pack_parts(plans, PROFILE, TYPED, _inventory())[0].request.materialize().argv
    assert _opts(pack, "partition") == ["t4"] and _opts(pack, "nodelist") == ["nodeb"]


def _variants(slots: dict[str, tuple[tuple[str, str, int], ...]], group: str | None = "lr",
              **kw: object) -> list[tuple[int, JobSpec, object]]:
    out = []
    for i, (name, job_slots) in enumerate(slots.items(), start=10):
        spec = replace(_spec(group=group, **kw), name=name, command=("train", "--name", name))
        out.append((i, spec, requests_for(i, spec, _plan(job_slots), PROFILE, SETTINGS)[0]))
    return out


def test_variants_of_one_sweep_on_one_shape_become_one_array() -> None:
    from slurmhet.emit.multipart import SubmittedPart, shown_ids
    singles = _variants({"lr-a": (("nodea", "t4", 1),), "lr-b": (("nodeb", "t4", 1),),
                         "lr-c": (("nodec", "v100", 1),), "lr-d": (("nodea", "t4", 1),)})
    folded = sweep_arrays(singles, SETTINGS, 1001)  # type: ignore[arg-type]
    assert sorted(ids for ids, _, _ in folded) == [(10, 11, 13), (12,)]
    (ids, specs, parts), = [f for f in folded if len(f[0]) == 3]
    array = parts[0].request
    assert isinstance(array, SweepArrayRequest) and [s.name for s in specs] == ["lr-a", "lr-b", "lr-d"]
    m = array.materialize()
    assert "--array=0-2" in m.argv and "--comment=slurmhet:10,11,13" in m.argv and "--job-name=lr" in m.argv
    assert not any(a.startswith("--nodelist") for a in m.argv)  # Slurm picks the t4 nodes, as for one variant
    rows = SubmittedPart("sweep", "500", array, ()).store_rows(13)
    assert [(r["array_task"], r["gpu_type"]) for r in rows] == [(2, "t4")]  # job 13 owns task 2 alone
    assert shown_ids(rows) == ["500_2"]


def test_what_cannot_share_an_array_stays_alone() -> None:
    # No sweep; two nodes (pinned); chunked at MaxArraySize 2: 3 variants -> an array of 2 and one alone.
    assert [ids for ids, _, _ in sweep_arrays(_variants({"a": (("nodea", "t4", 1),), "b": (("nodeb", "t4", 1),)},
                                                        group=None), SETTINGS, 1001)] == [(10,), (11,)]  # type: ignore[arg-type]
    two_nodes = _variants({"a": (("nodea", "t4", 1), ("nodeb", "t4", 1)), "b": (("nodea", "t4", 1), ("nodeb", "t4", 1))})
    assert [ids for ids, _, _ in sweep_arrays(two_nodes, SETTINGS, 1001)] == [(10,), (11,)]  # type: ignore[arg-type]
    three = _variants({"a": (("nodea", "t4", 1),), "b": (("nodea", "t4", 1),), "c": (("nodea", "t4", 1),)})
    assert [ids for ids, _, _ in sweep_arrays(three, SETTINGS, 2)] == [(10, 11), (12,)]  # type: ignore[arg-type]
    # Different resources per GPU: different sbatch options, so not one array.
    mixed = _variants({"a": (("nodea", "t4", 1),)}) + _variants({"b": (("nodea", "t4", 1),)}, cpus_per_gpu=4)
    mixed[1] = (11, *mixed[1][1:])
    assert [ids for ids, _, _ in sweep_arrays(mixed, SETTINGS, 1001)] == [(10,), (11,)]  # type: ignore[arg-type]


def test_a_chained_job_goes_to_slurm_after_its_predecessors() -> None:
    batch = requests_for(1, _spec(), _plan((("nodea", "t4", 1),)), PROFILE, SETTINGS, after_ok=("12", "13_2"))[0]
    assert "--dependency=afterok:12:13_2" in batch.request.materialize().argv
    het = requests_for(1, _spec(), _plan((("nodea", "t4", 1), ("nodeb", "v100", 1))), PROFILE, SETTINGS,
                       after_ok=("12",))[0].request.materialize().argv
    assert het.count("--dependency=afterok:12") == 2  # sbatch propagates it; every component says the same
    plain = requests_for(1, _spec(), _plan((("nodea", "t4", 1),)), PROFILE, SETTINGS)[0].request.materialize().argv
    assert not any(a.startswith("--dependency") for a in plain)


@pytest.mark.parametrize(("limit_min", "warned"), [(None, True), (10, True), (4, True), (3, False), (1, False)])
def test_slurm_is_asked_for_a_time_limit_warning_only_when_it_cannot_come_as_the_job_starts(
        limit_min: int | None, warned: bool) -> None:
    # USR2 120 s before the limit, which Slurm may send up to 60 s early: a limit of 3 min or less could get it
    # at once, before the launcher traps it (a 1-min job in the open-world cluster test died of it at 0 s).
    options = Common(7, "j", "/logs", time_limit_min=limit_min).options()
    assert ("--signal=B:USR2@120" in options) is warned
    assert ("--time=" + str(limit_min) in options) is (limit_min is not None)
