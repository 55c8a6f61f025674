"""Cluster inventory: nodes, their GPU types and counts, features and links.

The planner, the simulator and the CLI all speak this one vocabulary, whether the
inventory was read from the live cluster (``slurmhet.slurm``) or from a YAML file.
"""

from __future__ import annotations

from collections import Counter
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import yaml

from slurmhet.errors import InputError, yaml_error

#: Default link bandwidths in GB/s when the site says nothing (NVLink-less PCIe
#: inside a node, 10 GbE between nodes), as assumed in seed 001 section VI.
DEFAULT_INTRA_NODE_GBPS = 10.0
DEFAULT_INTER_NODE_GBPS = 1.25


@dataclass(frozen=True)
class Node:
    """One compute node; ``gpus`` maps a GPU type to how many of them it has."""

    name: str
    gpus: Mapping[str, int]
    features: tuple[str, ...] = ()
    state: str = "idle"
    cpus: int = 0
    memory_mb: int = 0
    gpu_memory_gb: Mapping[str, float] = field(default_factory=dict)
    mps: int = 0
    shards: int = 0
    #: Slurm's NodeAddr when it differs from the name (e.g. several slurmd on one host).
    addr: str = ""

    @property
    def available(self) -> bool:
        """A node takes new work unless Slurm has it drained, down or failing."""
        bad = ("drain", "down", "fail", "maint", "inval", "not_responding", "unknown")
        return not any(word in self.state.lower() for word in bad)


@dataclass(frozen=True)
class Inventory:
    """All nodes plus the two link speeds the communication model needs."""

    nodes: tuple[Node, ...]
    intra_node_gbps: float = DEFAULT_INTRA_NODE_GBPS
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS

    def usable(self) -> "Inventory":
        """The inventory without drained or down nodes."""
        return Inventory(
            tuple(n for n in self.nodes if n.available), self.intra_node_gbps, self.inter_node_gbps
        )

    @cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for n in self.nodes for t, c in n.gpus.items() if c > 0}))

    @cached_property
    def _by_type(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for node in self.nodes:
            total.update(node.gpus)
        return {t: c for t, c in sorted(total.items()) if c > 0}

    def gpus_by_type(self) -> dict[str, int]:
        """GPUs per type (a fresh dict; the inventory is immutable and computes it once)."""
        return dict(self._by_type)

    @cached_property
    def _packing_order(self) -> dict[str, tuple[tuple[int, str], ...]]:
        out: dict[str, list[tuple[int, str]]] = {}
        for node in self.nodes:
            for gpu_type, count in node.gpus.items():
                if count > 0:
                    out.setdefault(gpu_type, []).append((count, node.name))
        return {t: tuple(sorted(v, key=lambda x: (-x[0], x[1]))) for t, v in out.items()}

    def packing_order(self, gpu_type: str) -> tuple[tuple[int, str], ...]:
        """(GPUs, node) of ``gpu_type``, largest first, then by name: the order that packs a job on the fewest nodes."""
        return self._packing_order.get(gpu_type, ())

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


@dataclass(frozen=True)
class Hold:
    """GPUs of one type on one node that slurmhet may not plan onto for a span of time.

    Someone else holds them: a job slurmhet did not submit (``kind="job"``, from its
    start until its expected end), a reservation slurmhet's jobs may not run in
    (``kind="reservation"``: every one but a MAGNETIC one open to the user), or a
    foreign pending job Slurm has already slated for these nodes at its expected
    start (``kind="pending"``). Times are absolute seconds; ``end_s`` is
    ``math.inf`` when nobody knows.
    """

    node: str
    gpu_type: str
    count: int
    start_s: float
    end_s: float
    kind: str
    #: Who holds them, for people: "job 244 (alice, partition v100)", "reservation maint".
    owner: str
    #: ``end_s`` is an estimate (learned from history), not a bound Slurm enforces.
    estimated: bool = False

    def active(self, at: float) -> bool:
        return self.start_s <= at < self.end_s


@dataclass(frozen=True)
class QueuedAhead:
    """A foreign pending job that Slurm will start ahead of ours, with no nodes chosen yet.

    It takes ``count`` GPUs of one of ``gpu_types`` as they free up, before any of
    slurmhet's waiting jobs but those in ``after``, and holds them for ``duration_s``.
    """

    gpu_types: tuple[str, ...]
    count: int
    duration_s: float
    owner: str
    #: Ids of slurmhet jobs already in Slurm's queue that Slurm starts first: it takes nothing before they start.
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpenWorld:
    """What the rest of a shared cluster takes from the inventory, as plain capacity facts.

    Read from Slurm by :mod:`slurmhet.slurm.world`; empty for the simulator, whose
    cluster belongs to its trace. The planner treats holds like pinned jobs and caps
    like any other limit, so one planner serves both.
    """

    holds: tuple[Hold, ...] = ()
    ahead: tuple[QueuedAhead, ...] = ()
    #: User -> most GPUs their jobs may hold at once (QOS ``MaxTRESPerUser=gres/gpu=N`` and the like).
    gpu_caps: Mapping[str, int] = field(default_factory=dict)
    #: A hold starting within this many seconds of now already takes its GPUs from the jobs placed now
    #: (Slurm will not start a job on nodes that a reservation claims before its time limit ends).
    lookahead_s: float = 0.0

    def __post_init__(self) -> None:
        for hold in self.holds:
            if hold.count < 0 or not hold.end_s > hold.start_s or math.isnan(hold.start_s):
                raise InputError(f"hold of {hold.count} {hold.gpu_type} on {hold.node} by {hold.owner} spans "
                                 f"[{hold.start_s}, {hold.end_s})", place="open_world.holds",
                                 hint="a hold needs a count >= 0 and an end after its start")
        for user, cap in self.gpu_caps.items():
            if cap < 0:
                raise InputError(f"GPU cap {cap} of user {user!r} is negative", place="open_world.gpu_caps",
                                 hint="a cap is a count of GPUs >= 0")

    def held(self, at: float, horizon: float = 0.0) -> list[Hold]:
        """Holds that take their GPUs at ``at``: active then, or starting before ``at + horizon``."""
        return [h for h in self.holds if h.start_s <= at + max(horizon, 0.0) and h.end_s > at]


def parse_cluster_spec(text: str, gpus_per_node: int = 4) -> Inventory:
    """Build an inventory from ``v100:20,p100:20,k80:20`` (GPUs per type).

    Each type fills whole nodes of ``gpus_per_node`` GPUs; a remainder makes a
    smaller last node. Used by the simulator and benchmarks.
    """
    if gpus_per_node <= 0:
        raise InputError("--gpus-per-node must be positive", place="--gpus-per-node", hint="e.g. 4")
    nodes: list[Node] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        gpu_type, sep, count_text = part.partition(":")
        if not sep or not gpu_type or not count_text.isdigit() or int(count_text) <= 0:
            raise InputError(
                f"bad cluster spec entry {part!r}", place="--cluster", hint="write TYPE:COUNT, e.g. v100:8,k80:4"
            )
        remaining = int(count_text)
        index = 0
        while remaining > 0:
            take = min(gpus_per_node, remaining)
            nodes.append(Node(f"{gpu_type}-{index}", {gpu_type.lower(): take}, (gpu_type.lower(),)))
            remaining -= take
            index += 1
    if not nodes:
        raise InputError("empty cluster spec", place="--cluster", hint="e.g. v100:8,k80:4")
    return Inventory(tuple(nodes))


def load_inventory_yaml(path: Path) -> Inventory:
    """Read a cluster YAML: ``nodes: [{name, gpus: {type: n}, features}]`` plus link speeds."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise yaml_error(exc, str(path), "a YAML mapping with 'nodes:'") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read cluster file: {exc}", place=str(path), hint="a YAML mapping with 'nodes:'") from exc
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise InputError("cluster file needs a 'nodes:' list", place=str(path), hint="nodes: [{name: a, gpus: {v100: 4}}]")
    nodes = []
    for i, entry in enumerate(data["nodes"]):
        place = f"{path}:nodes[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InputError("node needs a 'name'", place=place, hint="name: nodea")
        gpus = entry.get("gpus", {})
        if not isinstance(gpus, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in gpus.items()
        ):
            raise InputError("'gpus' must map GPU type to a count >= 0", place=f"{place}.gpus", hint="gpus: {v100: 4}")
        sizes = {}
        for key in ("cpus", "memory_mb"):
            value = entry.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"'{key}' must be a whole number >= 0", place=f"{place}.{key}", hint=f"{key}: 64")
            sizes[key] = value
        nodes.append(
            Node(
                entry["name"],
                {k.lower(): v for k, v in gpus.items()},
                tuple(entry.get("features", ()) or ()),
                gpu_memory_gb={k.lower(): float(v) for k, v in (entry.get("gpu_memory_gb") or {}).items()},
                **sizes,
            )
        )
    links = data.get("links", {}) or {}
    return Inventory(
        tuple(nodes),
        float(links.get("intra_node_gbps", DEFAULT_INTRA_NODE_GBPS)),
        float(links.get("inter_node_gbps", DEFAULT_INTER_NODE_GBPS)),
    )


def inventory_yaml(inventory: Inventory) -> str:
    """The cluster YAML :func:`load_inventory_yaml` reads (the cached inventory for planning without Slurm)."""
    nodes = [{"name": n.name, "gpus": dict(n.gpus), "features": list(n.features), "cpus": n.cpus,
              "memory_mb": n.memory_mb, **({"gpu_memory_gb": dict(n.gpu_memory_gb)} if n.gpu_memory_gb else {})}
             for n in inventory.usable().nodes]
    return yaml.safe_dump({"nodes": nodes, "links": {"intra_node_gbps": inventory.intra_node_gbps,
                                                     "inter_node_gbps": inventory.inter_node_gbps}}, sort_keys=False)


def cluster_option(text: str, gpus_per_node: int) -> Inventory:
    """``--cluster``: ``v100:4,t4:8`` or a cluster YAML file."""
    if text.lower().endswith((".yaml", ".yml")):
        return load_inventory_yaml(Path(text))
    return parse_cluster_spec(text, gpus_per_node)
