"""Map a planned job to the Slurm forms that run it (pure: no Slurm, no store).

* one GPU type, the same count on every node -> BatchRequest
* several GPU types, or uneven counts per node -> HetJobRequest, one component
  per (type, even node group); ranks follow the components, so the plan's shard
  weights are permuted into that order
* forked copies (HadarE) -> one ArrayRequest per copy shape, disjoint index
  ranges, chunked to MaxArraySize, plus a ConsolidationRequest after them all
* a co-location group -> one PackRequest (see ``pack_parts``)
* variants of one sweep on one single-node shape now -> one SweepArrayRequest (see ``sweep_arrays``)

``--nodelist`` is pinned only where the plan's value depends on the node: on a
shared cluster a pinned job waits behind others while a twin node of its type
idles. Multi-node batch jobs (placement chose those nodes), packs (one shared
GPU) and forked copies stay pinned; a single-node batch job asks for its type
and count on ``--nodes=1`` and Slurm picks the node; het components are pinned
only where two of them could share a node (see ``het_needs_nodelist``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from slurmhet.cluster import Inventory
from slurmhet.emit.multipart import Part
from slurmhet.emit.requests import (ArrayChunk, ArrayRequest, BatchRequest, Common, ConsolidationRequest, GpuShape,
                                    HetJobRequest, Launch, PackMember, PackRequest, SweepArrayRequest, SweepMember)
from slurmhet.errors import InputError
from slurmhet.planner.model import Allocation, JobPlan
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import JobSpec

PACK_SHARING_SETTINGS = ("gpu", "auto")


@dataclass(frozen=True)
class EmitSettings:
    """Site and command settings emission needs besides the plan and the profile."""

    log_dir: str
    launcher: tuple[str, ...]  # e.g. (sys.executable, "-m", "slurmhet", "run", "--")
    slurmhet: tuple[str, ...]  # e.g. (sys.executable, "-m", "slurmhet")
    #: The site's default partition (config); it wins over ``partitions``.
    partition: str | None = None
    #: GPU type -> the partition its parts go to (from the cluster's partitions; may be empty).
    partitions: Mapping[str, str] = field(default_factory=dict)
    #: "gpu": packs take a whole GPU; "auto": gres/mps, else gres/shard, where the pack's node has them.
    pack_sharing: str = "gpu"
    #: What a consolidation runs after averaging so the next round gets planned (e.g. a replan command).
    after_consolidation: tuple[str, ...] = ()
    #: The store's instance id, appended to every ``--comment=slurmhet:<id>`` tag.
    store_tag: str = ""
    #: Variables every launched program gets (progress dir, node addresses, signal lead, emulation).
    env: tuple[tuple[str, str], ...] = ()


#: How a spec's ``sbatch:`` list names a partition.
PARTITION_OPTIONS = ("partition", "p")


def partition_for(spec: JobSpec, settings: EmitSettings, gpu_type: str | None) -> str | None:
    """The ``--partition`` slurmhet adds for a part on ``gpu_type``.

    None when the spec names its own (it wins and goes out once, with the spec's other
    options); else the site default, else the type's partition, else none (Slurm's default).
    """
    if any(name in PARTITION_OPTIONS for name, _ in spec.sbatch):
        return None
    return settings.partition or (settings.partitions.get(gpu_type) if gpu_type else None)


def het_needs_nodelist(shapes: Sequence[GpuShape], inventory: Inventory | None) -> bool:
    """Whether two het components could land on one node: some node holds GPUs of two of their types
    (components of one type count twice). Unknown nodes (no inventory): pin, to be safe."""
    if inventory is None:
        return True
    types = [s.gpu_type for s in shapes]
    return any(sum(node.gpus.get(t, 0) > 0 for t in types) >= 2 for node in inventory.nodes)


def _common(job_id: int, spec: JobSpec, settings: EmitSettings, gpu_type: str | None, also: tuple[int, ...] = (),
            profile: SiteProfile | None = None, after_ok: tuple[str, ...] = ()) -> Common:
    return Common(job_id=job_id, name=spec.name, log_dir=settings.log_dir, time_limit_min=spec.time_limit_min,
                  store_tag=settings.store_tag,
                  partition=partition_for(spec, settings, gpu_type), extra=spec.sbatch, also=also,
                  spank=bool(profile is not None and profile.spank_plugin), cpus_per_gpu=spec.cpus_per_gpu,
                  mem_per_gpu_mb=spec.mem_per_gpu_mb, workdir=spec.workdir, after_ok=after_ok)


def container_runtime_for(spec: JobSpec, profile: SiteProfile | None) -> str:
    """The runtime that will run the spec's container; a site without one refuses the spec (exit 2)."""
    runtime = profile.container_runtime if profile is not None else "none"
    if runtime not in ("pyxis", "apptainer", "singularity"):
        raise InputError(f"job {spec.name!r} asks for a container and this site has no container runtime "
                         "slurmhet knows", place=spec.place("container") or f"{spec.name}.container",
                         hint="pyxis (sbatch --help lists --container-image) or apptainer/singularity on PATH; "
                              "or set slurm.container_runtime")
    return runtime


def _launch(spec: JobSpec, settings: EmitSettings, profile: SiteProfile | None) -> Launch:
    """The program, its modules, and its container as the site runs containers (the site profile says how).

    pyxis starts the srun step in the image, launcher included: the image must have slurmhet installed,
    and its own ``python`` runs it. Apptainer/Singularity wrap the program under slurmhet's launcher.
    """
    env, program, launcher, srun_options = _spec_env(spec, settings), spec.command, settings.launcher, ()
    if spec.container:
        runtime = container_runtime_for(spec, profile)
        if runtime == "pyxis":
            srun_options = (f"--container-image={spec.container}",)
            launcher = ("python", "-m", "slurmhet", "run", "--")
        else:
            program = (runtime, "exec", "--nv", spec.container, *program)
    return Launch(program=program, launcher=launcher, env=env, modules=spec.modules, srun_options=srun_options)


def _spec_env(spec: JobSpec, settings: EmitSettings) -> tuple[tuple[str, str], ...]:
    return settings.env + _own_env(spec)


def _own_env(spec: JobSpec) -> tuple[tuple[str, str], ...]:
    """The plan's facts the runtime needs: checkpoint dir, nominal workers (relaxed scale-fixed sync), the
    workload the table keys its rates by, a profiling run's step count, and the time limit (Slurm 22.05 sets
    no SLURM_JOB_END_TIME; it tells a timeout from a preemption); then the spec's own variables."""
    env = [("SLURMHET_NOMINAL_WORKERS", str(max(1, spec.global_batch // spec.workload.batch_size))),
           ("SLURMHET_WORKLOAD", spec.workload.key)]
    if spec.profile_steps:
        env.append(("SLURMHET_PROFILE_STEPS", str(spec.profile_steps)))
    if spec.checkpoint_dir:
        env.append(("SLURMHET_CHECKPOINT_DIR", spec.checkpoint_dir))
    if spec.time_limit_min:
        env.append(("SLURMHET_TIME_LIMIT_S", str(spec.time_limit_min * 60)))
    return tuple(env) + spec.env


def _sweep_key(spec: JobSpec, request: BatchRequest) -> tuple[object, ...] | None:
    """What must be equal for variants to share one array: everything sbatch sees but the job's name and id,
    and the launch around the program. None: this part cannot be an array task (no sweep, several nodes or
    a pinned node, uneven shard weights)."""
    if not spec.group or request.nodes != 1 or request.nodelist or len(set(request.shard_weights)) > 1 \
            or request.plan_env:
        return None
    launch = request.launch
    return (spec.group, request.gpu_type, request.gpus_per_node, request.gpu_request_style,
            replace(request.common, job_id=0, name=""), launch.launcher, launch.modules, launch.srun_options)


def sweep_arrays(singles: Sequence[tuple[int, JobSpec, Part]], settings: EmitSettings,
                 max_array_size: int) -> list[tuple[tuple[int, ...], tuple[JobSpec, ...], list[Part]]]:
    """Fold the variants of one sweep that the plan puts on one GPU shape now into job arrays.

    ``singles``: one-part jobs in plan order. Variants of one group with equal shapes become one
    SweepArrayRequest (at most ``max_array_size`` tasks each, so every index stays below MaxArraySize);
    anything else, and a shape only one variant has, stays as it was.
    """
    by_key: dict[tuple[object, ...], list[tuple[int, JobSpec, BatchRequest]]] = defaultdict(list)
    out: list[tuple[tuple[int, ...], tuple[JobSpec, ...], list[Part]]] = []
    for job_id, spec, part in singles:
        key = _sweep_key(spec, part.request) if isinstance(part.request, BatchRequest) else None
        if key is None:
            out.append(((job_id,), (spec,), [part]))
        else:
            by_key[key].append((job_id, spec, part.request))  # type: ignore[arg-type]
    for variants in by_key.values():
        for start in range(0, len(variants), max(1, max_array_size)):
            chunk = variants[start:start + max(1, max_array_size)]
            if len(chunk) == 1:
                job_id, spec, request = chunk[0]
                out.append(((job_id,), (spec,), [Part(request)]))
                continue
            lead = chunk[0][2]
            common = replace(lead.common, name=chunk[0][1].group or lead.common.name,
                             also=tuple(job_id for job_id, _, _ in chunk[1:]))
            members = tuple(SweepMember(job_id, spec.name, request.launch.program, _own_env(spec))
                            for job_id, spec, request in chunk)
            array = SweepArrayRequest(common, replace(lead.launch, env=settings.env), GpuShape(
                lead.gpu_type, lead.gpus_per_node), members, lead.gpu_request_style)
            out.append((tuple(m.job_id for m in members), tuple(spec for _, spec, _ in chunk), [Part(array)]))
    return out


def gpu_shapes(allocation: Allocation, weights: Sequence[float]) -> tuple[list[GpuShape], tuple[float, ...]]:
    """Group an allocation's slots into Slurm shapes (equal GPUs per node) and reorder weights to match.

    Slurm gives a component's tasks node by node, components in order; the plan
    numbers ranks in slot order. Both orders are expanded here so rank r of the
    emitted job gets the weight the plan gave that GPU.
    """
    slot_ranks: dict[tuple[str, str], list[int]] = {}
    rank = 0
    for node, gpu_type, count in allocation.slots:
        slot_ranks[(node, gpu_type)] = list(range(rank, rank + count))
        rank += count
    by_type: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for node, gpu_type, count in allocation.slots:
        by_type[gpu_type].append((node, count))
    shapes: list[GpuShape] = []
    for gpu_type, nodes in by_type.items():
        counts = {c for _, c in nodes}
        groups = [nodes] if len(counts) == 1 else [[n] for n in nodes]
        shapes += [GpuShape(gpu_type, g[0][1], len(g), tuple(n for n, _ in g)) for g in groups]
    order = [r for s in shapes for node in s.nodelist for r in slot_ranks[(node, s.gpu_type)]]
    return shapes, tuple(weights[r] for r in order) if weights else ()


def requests_for(job_id: int, spec: JobSpec, job_plan: JobPlan, profile: SiteProfile, settings: EmitSettings, *,
                 copies: Sequence[Allocation] = (), round: int = 0, round_steps: Sequence[int] = (),
                 inventory: Inventory | None = None, after_ok: tuple[str, ...] = ()) -> list[Part]:
    """The parts that run ``job_plan`` (``copies``: HadarE's forked copies this round, one allocation each;
    ``round_steps``: each copy's share of the round's steps, exported as ``SLURMHET_ROUND_STEPS``;
    ``inventory``: the cluster's nodes, which say whether het components must be pinned; ``after_ok``:
    Slurm jobs it must run after, its predecessors)."""
    launch = _launch(spec, settings, profile)
    if len(copies) > 1:
        if round_steps and len(round_steps) != len(copies):
            raise InputError(f"{len(round_steps)} round step counts for {len(copies)} copies", place=f"job {job_id}",
                             hint="one step count per copy")
        return _forked(job_id, spec, launch, copies, profile, settings, round, tuple(round_steps))
    if job_plan.allocation is None or not job_plan.allocation.slots:
        raise InputError(f"job {spec.name!r} has no allocation in this plan", place=f"job {job_id}",
                         hint=job_plan.wait_reason or "it waits for the next round")
    shapes, weights = gpu_shapes(job_plan.allocation, job_plan.shard_weights)
    style = profile.gpu_request_style
    if len(shapes) == 1:
        s = shapes[0]
        common = _common(job_id, spec, settings, s.gpu_type, profile=profile, after_ok=after_ok)
        nodelist = s.nodelist if s.nodes > 1 else ()  # one node of one type: any node of that type will do
        return [Part(BatchRequest(common, launch, s.gpu_type, s.gpus_per_node, s.nodes, nodelist, style, weights))]
    pin = het_needs_nodelist(shapes, inventory)
    components = tuple(replace(s, nodelist=s.nodelist if pin else (),
                               partition=partition_for(spec, settings, s.gpu_type)) for s in shapes)
    return [Part(HetJobRequest(_common(job_id, spec, settings, None, profile=profile, after_ok=after_ok), launch,
                               components, style,
                               weights))]


def _forked(job_id: int, spec: JobSpec, launch: Launch, copies: Sequence[Allocation],
            profile: SiteProfile, settings: EmitSettings, round: int,
            round_steps: tuple[int, ...] = ()) -> list[Part]:
    if not spec.checkpoint_dir:
        raise InputError(f"job {spec.name!r} is forked but has no checkpoint_dir to consolidate in",
                         place=spec.place("checkpoint_dir") or f"job {job_id}", hint="set checkpoint_dir")
    # One array per copy shape and step share: an array's tasks share one SLURMHET_ROUND_STEPS.
    groups: dict[tuple[str, int, int | None], list[str]] = defaultdict(list)
    for i, copy in enumerate(copies):
        if len(copy.slots) != 1:
            raise InputError(f"a forked copy of job {spec.name!r} spans {len(copy.slots)} node/type slots",
                             place=f"job {job_id}", hint="each copy is a gang on one node of one type")
        node, gpu_type, count = copy.slots[0]
        groups[(gpu_type, count, round_steps[i] if round_steps else None)].append(node)
    parts: list[Part] = []
    first = 0
    for (gpu_type, count, steps), nodes in groups.items():
        # One array per copy shape; pin nodes only when all its copies share one (per-task nodelists do not exist).
        pinned = tuple(sorted(set(nodes))) if len(set(nodes)) == 1 else ()
        common = _common(job_id, spec, settings, gpu_type, profile=profile)
        request = ArrayRequest(common, launch, GpuShape(gpu_type, count, 1, pinned), ArrayChunk(first, len(nodes)),
                               throttle=len(nodes), round=round, gpu_request_style=profile.gpu_request_style,
                               plan_env=(("SLURMHET_ROUND_STEPS", str(steps)),) if steps is not None else ())
        parts += [Part(chunk) for chunk in request.chunks(profile.max_array_size)]
        first += len(nodes)
    consolidation = consolidation_request(job_id, spec, [copy.slots[0][1] for copy in copies], first, profile,
                                          settings, round)
    return parts + [Part(consolidation, after=tuple(range(len(parts))))]


def consolidation_request(job_id: int, spec: JobSpec, copy_types: Sequence[str], copies: int, profile: SiteProfile,
                          settings: EmitSettings, round: int, again: bool = False) -> ConsolidationRequest:
    """The consolidation of a round of ``copies`` copies on ``copy_types`` (one per copy); ``again``: its second
    run, after a fault ended the first, perhaps before it wrote the average (see ``ConsolidationRequest.again``)."""
    # It needs no GPU: it runs in the first of the copies' types' partitions that can start it (Slurm's list of
    # partitions). Pinned to the first copy's alone, it waited for good once that partition's nodes drained
    # after the copies ended (a node Slurm drains for "Kill task failed" across a controller restart).
    types = list(dict.fromkeys(copy_types))
    partitions = [partition_for(spec, settings, t) for t in types]
    common = _common(job_id, spec, settings, types[0], profile=profile)
    if len(set(partitions)) > 1 and None not in partitions:  # None: Slurm's default partition, which has no name here
        common = replace(common, partition=",".join(dict.fromkeys(p for p in partitions if p)))
    return ConsolidationRequest(common, settings.slurmhet, spec.checkpoint_dir, tuple(range(copies)), round=round,
                                then=settings.after_consolidation, again=again,
                                env=(("SLURMHET_JOB_ID", str(job_id)), *settings.env))


def pack_parts(members: Sequence[tuple[int, JobSpec, JobPlan]], profile: SiteProfile, settings: EmitSettings,
               inventory: Inventory) -> list[Part]:
    """One pack for a co-location group: every member planned onto the same single GPU."""
    if settings.pack_sharing not in PACK_SHARING_SETTINGS:
        raise InputError(f"unknown pack sharing {settings.pack_sharing!r}", place="pack_sharing",
                         hint=" | ".join(PACK_SHARING_SETTINGS))
    slots = {jp.allocation.slots if jp.allocation else () for _, _, jp in members}
    if len(slots) != 1 or len(next(iter(slots))) != 1 or next(iter(slots))[0][2] != 1:
        raise InputError("a co-location group must share exactly one GPU", place=f"jobs {[m[0] for m in members]}",
                         hint="the planner puts a group on one GPU")
    (node_name, gpu_type, _), = next(iter(slots))
    sharing, share_count = "gpu", 1
    if settings.pack_sharing == "auto":
        node = inventory.node(node_name)
        per_gpu = max(node.gpus.get(gpu_type, 0), 1)
        if profile.has_mps and node.mps:
            sharing, share_count = "mps", node.mps // per_gpu
        elif profile.has_shard and node.shards:
            sharing, share_count = "shard", node.shards // per_gpu
    lead_id, lead_spec, _ = members[0]
    pack_members = tuple(PackMember(job_id, spec.name, spec.command, _spec_env(spec, settings)) for job_id, spec, _ in members)
    limits = [spec.time_limit_min for _, spec, _ in members]
    common = replace(_common(lead_id, lead_spec, settings, gpu_type, also=tuple(m[0] for m in members[1:]),
                             profile=profile),
                     time_limit_min=None if None in limits else max(limits))  # type: ignore[type-var]
    return [Part(PackRequest(common, settings.launcher, settings.slurmhet, gpu_type, pack_members, sharing,
                             share_count, (node_name,), profile.gpu_request_style))]
