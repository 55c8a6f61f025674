"""The job spec: YAML -> typed, validated ``JobSpec`` objects.

A file holds one job (a mapping) or ``jobs: [...]``. Every error names the file,
line and column, the field, and a hint (the closest known field name when a key
is misspelt). Flags that slurmhet manages itself are refused in ``sbatch:``
because a user value would silently fight the plan.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError, mark_place, yaml_error
from slurmhet import sweep
from slurmhet.gpu_catalog import PRECISIONS

SYNC_MODES = ("allreduce", "ps", "local-sgd")

#: sbatch options slurmhet sets itself, with the reason shown when a user sets one.
MANAGED_SBATCH: Mapping[str, str] = {
    **dict.fromkeys(
        ("gres", "gpus", "G", "gpus-per-node", "gpus-per-task", "gpus-per-socket"),
        "the planner chooses GPU types and counts; use 'gpus: {min, max, types}'",
    ),
    **dict.fromkeys(("cpus-per-gpu", "cpus-per-task", "c", "mem-per-gpu", "mem-per-cpu", "mem"),
                    "the planner must see them to fit nodes; use 'cpus_per_gpu:' and 'mem_per_gpu:'"),
    **dict.fromkeys(("chdir", "D"), "use the spec's 'workdir:' field"),
    **dict.fromkeys(("container-image",), "use the spec's 'container:' field"),
    **dict.fromkeys(("constraint", "C", "nodelist", "w", "nodes", "N"), "the planner chooses the nodes"),
    **dict.fromkeys(("ntasks", "n", "ntasks-per-node"), "slurmhet launches one task per planned GPU"),
    **dict.fromkeys(("array", "a"), "slurmhet builds arrays itself (forked copies, chunking)"),
    **dict.fromkeys(("dependency", "d"), "slurmhet orders jobs itself (plan order, consolidation)"),
    **dict.fromkeys(("job-name", "J"), "use the spec's 'name:' field"),
    **dict.fromkeys(("time", "t"), "use the spec's 'time_limit:' field"),
    "comment": "slurmhet tags every job with --comment=slurmhet:<id>",
    **dict.fromkeys(("output", "o", "error", "e"), "slurmhet keeps job logs under its state directory"),
    "wrap": "give the program in 'command:' or 'entrypoint:'",
    "parsable": "slurmhet parses sbatch output itself",
    "signal": "slurmhet sets --signal for checkpoint-on-preemption",
    **dict.fromkeys(("hetjob", "het-group"), "slurmhet builds heterogeneous jobs from the plan"),
    "reservation": "slurmhet plans around reservations and cannot keep a job inside one; a MAGNETIC "
                   "reservation open to you is used without naming it",
}

_OPTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
_JOB_NAME = re.compile(r"^[^\x00]{1,200}$")


@dataclass(frozen=True)
class Workload:
    """What the throughput table is keyed by: a model name and a per-GPU batch size."""

    model: str
    batch_size: int
    #: The user's own samples/s per GPU type, used as a flagged prior until measured.
    samples_per_s_hint: tuple[tuple[str, float], ...] = ()
    #: "fp32" or "mixed" (FP16/BF16 autocast): which catalog roof a prior reads.
    precision: str = "fp32"
    #: FLOP per byte of memory traffic, when known: catalog priors by roofline.
    arithmetic_intensity: float | None = None

    @property
    def key(self) -> str:
        return f"{self.model} (batch size {self.batch_size})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "batch_size": self.batch_size}
        if self.samples_per_s_hint:
            out["samples_per_s_hint"] = dict(self.samples_per_s_hint)
        if self.precision != "fp32":
            out["precision"] = self.precision
        if self.arithmetic_intensity is not None:
            out["arithmetic_intensity"] = self.arithmetic_intensity
        return out


@dataclass(frozen=True)
class GpuRequest:
    min: int = 1
    max: int = 1
    types: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobSpec:
    """One job as the user asked for it; the unit the planner and the store work on."""

    name: str
    workload: Workload
    global_batch: int
    command: tuple[str, ...] = ()
    entrypoint: str | None = None
    args: tuple[Any, ...] = ()
    epochs: float | None = None
    dataset_size: int | None = None
    steps: int | None = None
    model_size_mb: float | None = None
    sync: str = "allreduce"
    gpus: GpuRequest = GpuRequest()
    weight: float = 1.0
    priority: int = 0
    colocate: bool = False
    gpu_memory_gb: float | None = None
    checkpoint_dir: str | None = None
    time_limit_min: int | None = None
    sbatch: tuple[tuple[str, str | None], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    #: A profiling run (what `slurmhet profile` submits): the launcher stops the command after this many steps.
    profile_steps: int | None = None
    #: Jobs listed, cancelled and reported together (a sweep's variants get their sweep's name).
    group: str | None = None
    #: Jobs this one starts after (each must complete first): names or groups in the same file, or
    #: stored job ids (the store keeps ids only).
    after: tuple[str | int, ...] = ()
    #: CPUs and memory (MB) per GPU: one task per GPU gets them; the planner fits them to nodes.
    cpus_per_gpu: int | None = None
    mem_per_gpu_mb: int | None = None
    #: Where the command runs (``--chdir``); a container image and environment modules to load first.
    workdir: str | None = None
    container: str | None = None
    modules: tuple[str, ...] = ()
    #: Where each field came from, "file:line:col"; for errors found later (cluster checks).
    places: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def total_samples(self) -> int:
        """Work amount in samples: epochs x dataset size, or steps x global batch."""
        if self.steps is not None:
            return self.steps * self.global_batch
        assert self.epochs is not None and self.dataset_size is not None
        return int(round(self.epochs * self.dataset_size))

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else -(-self.total_samples // self.global_batch)

    @property
    def forkable(self) -> bool:
        """Only local-SGD jobs may be forked into independent copies (HadarE)."""
        return self.sync == "local-sgd"

    def place(self, name: str) -> str:
        return self.places.get(name) or self.places.get("", "")

    def to_dict(self) -> dict[str, Any]:
        """The canonical mapping form, stored in the database and re-parseable by ``parse_job``."""
        out: dict[str, Any] = {
            "name": self.name,
            "workload": self.workload.to_dict(),
            "global_batch": self.global_batch,
            "sync": self.sync,
            "gpus": {"min": self.gpus.min, "max": self.gpus.max, "types": list(self.gpus.types)},
            "weight": self.weight,
            "priority": self.priority,
            "colocate": self.colocate,
        }
        if self.command:
            out["command"] = list(self.command)
        if self.entrypoint:
            out["entrypoint"] = self.entrypoint
            out["args"] = list(self.args)
        work: dict[str, Any] = {}
        if self.steps is not None:
            work["steps"] = self.steps
        else:
            work.update(epochs=self.epochs, dataset_size=self.dataset_size)
        out["work"] = work
        optional = {
            "model_size_mb": self.model_size_mb,
            "gpu_memory_gb": self.gpu_memory_gb,
            "checkpoint_dir": self.checkpoint_dir,
            "time_limit": self.time_limit_min,
            "profile_steps": self.profile_steps,
            "group": self.group,
        }
        if self.after:
            out["after"] = list(self.after)
        resources = {"cpus_per_gpu": self.cpus_per_gpu, "workdir": self.workdir, "container": self.container,
                     "mem_per_gpu": f"{self.mem_per_gpu_mb}M" if self.mem_per_gpu_mb else None}
        out.update({k: v for k, v in resources.items() if v is not None})
        if self.modules:
            out["modules"] = list(self.modules)
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.sbatch:
            out["sbatch"] = [f"--{k}={v}" if v is not None else f"--{k}" for k, v in self.sbatch]
        if self.env:
            out["env"] = dict(self.env)
        return out


# --------------------------------------------------------------------------- YAML with places


class _Located:
    """Mixin carrying the YAML marks of a mapping's keys and values."""

    mark: yaml.Mark | None = None
    key_marks: dict[Any, yaml.Mark]
    value_marks: dict[Any, yaml.Mark]


class LocatedDict(dict, _Located):  # type: ignore[type-arg]
    pass


class LocatedList(list, _Located):  # type: ignore[type-arg]
    pass


class _LocatedLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences remember where each entry was written."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LocatedDict:  # type: ignore[override]
        out = LocatedDict()
        out.mark, out.key_marks, out.value_marks = node.start_mark, {}, {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise InputError("mapping keys must be plain names", place=mark_place(key_node.start_mark),
                                 hint="name: value")
            if key in out:
                raise InputError(f"duplicate key {key!r}", place=mark_place(key_node.start_mark),
                                 hint="each field once")
            out[key] = self.construct_object(value_node, deep=True)
            out.key_marks[key], out.value_marks[key] = key_node.start_mark, value_node.start_mark
        return out

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> LocatedList:  # type: ignore[override]
        out = LocatedList(self.construct_object(child, deep=True) for child in node.value)
        out.mark, out.key_marks = node.start_mark, {}
        out.value_marks = {i: child.start_mark for i, child in enumerate(node.value)}
        return out


_LocatedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LocatedLoader.construct_mapping)
_LocatedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LocatedLoader.construct_sequence)


# --------------------------------------------------------------------------- field readers


class _Fields:
    """Reads one YAML mapping field by field, turning every problem into an InputError with a place."""

    def __init__(self, data: Any, source: str, where: str, known: Iterable[str]) -> None:
        self.source, self.where = source, where
        if not isinstance(data, dict):
            raise InputError(f"{where or 'job'} must be a mapping", place=self._place_of(data), hint="name: value lines")
        self.data = data
        known = tuple(known)
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"did you mean '{close[0]}'?" if close else "known fields: " + ", ".join(known)
                raise InputError(f"unknown field '{self.path(str(key))}'", place=self.key_place(key), hint=hint)

    def _place_of(self, data: Any) -> str:
        return mark_place(getattr(data, "mark", None), self.source)

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def key_place(self, key: Any) -> str:
        return mark_place(getattr(self.data, "key_marks", {}).get(key) or getattr(self.data, "mark", None), self.source)

    def value_place(self, key: Any) -> str:
        return mark_place(getattr(self.data, "value_marks", {}).get(key) or getattr(self.data, "mark", None),
                          self.source)

    def fail(self, key: str, cause: str, hint: str) -> InputError:
        return InputError(f"{self.path(key)}: {cause}", place=self.value_place(key), hint=hint)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def string(self, key: str, *, required: bool = False, default: str | None = None) -> str | None:
        if not self.has(key):
            if required:
                raise InputError(f"missing field '{self.path(key)}'", place=self._place_of(self.data), hint=f"add '{key}:'")
            return default
        value = self.data[key]
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {type(value).__name__}", f"{key}: text")
        return value

    def integer(self, key: str, *, minimum: int = 1, default: int | None = None) -> int | None:
        if not self.has(key):
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be a whole number, got {value!r}", f"{key}: {max(minimum, 1)}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}", f"{key}: {max(minimum, 1)}")
        return value

    def number(self, key: str, *, positive: bool = True, default: float | None = None) -> float | None:
        if not self.has(key):
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise self.fail(key, f"must be a number, got {value!r}", f"{key}: 1.5")
        if positive and value <= 0:
            raise self.fail(key, f"must be > 0, got {value}", f"{key}: 1.5")
        if not positive and value < 0:
            raise self.fail(key, f"must be >= 0, got {value}", f"{key}: 0")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}", f"{key}: true")
        return value

    def sub(self, key: str, known: Iterable[str]) -> "_Fields":
        return _Fields(self.data[key], self.source, self.path(key), known)


JOB_FIELDS = (
    "name", "command", "entrypoint", "args", "workload", "work", "global_batch", "model_size_mb", "sync",
    "gpus", "weight", "priority", "colocate", "gpu_memory_gb", "checkpoint_dir", "time_limit", "sbatch", "env",
    "profile_steps", "group", "sweep", "after", "cpus_per_gpu", "mem_per_gpu", "workdir", "container", "modules",
    "partition", "account", "qos",
)


def _workload(f: _Fields) -> Workload:
    if not f.has("workload"):
        raise InputError(
            f"missing field '{f.path('workload')}'", place=f._place_of(f.data),
            hint="workload: {model: ResNet-50, batch_size: 64} (keys the throughput table)",
        )
    raw = f.get("workload")
    if isinstance(raw, str):
        match = re.fullmatch(r"\s*(.+?)\s*\(batch size (\d+)\)\s*", raw)
        if not match:
            raise f.fail("workload", f"cannot read {raw!r}", "'ResNet-50 (batch size 64)' or {model, batch_size}")
        return Workload(match.group(1), int(match.group(2)))
    w = f.sub("workload", ("model", "batch_size", "samples_per_s_hint", "precision", "arithmetic_intensity"))
    model = w.string("model", required=True)
    batch = w.integer("batch_size")
    if batch is None:
        raise InputError(f"missing field '{w.path('batch_size')}'", place=w._place_of(w.data), hint="batch_size: 64")
    assert model is not None
    precision = w.string("precision", default="fp32")
    if precision not in PRECISIONS:
        raise w.fail("precision", f"unknown precision {precision!r}", " | ".join(PRECISIONS))
    return Workload(model.strip(), batch, _rate_hint(w), precision or "fp32", w.number("arithmetic_intensity"))


def _rate_hint(w: _Fields) -> tuple[tuple[str, float], ...]:
    """``samples_per_s_hint: {t4: 900}``: per-GPU samples/s the user expects, by GPU type."""
    if not w.has("samples_per_s_hint"):
        return ()
    raw = w.get("samples_per_s_hint")
    example = "samples_per_s_hint: {t4: 900, v100: 2100}"
    if not isinstance(raw, dict) or not raw:
        raise w.fail("samples_per_s_hint", "must map GPU types to samples/s", example)
    out = []
    for gpu, value in raw.items():
        if not isinstance(gpu, str) or not gpu.strip():
            raise w.fail("samples_per_s_hint", f"{gpu!r} is not a GPU type name", example)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            raise w.fail("samples_per_s_hint", f"{gpu}: {value!r} is not a positive number of samples/s", example)
        out.append((gpu.strip().lower(), float(value)))
    return tuple(out)


def _command(f: _Fields) -> tuple[tuple[str, ...], str | None, tuple[Any, ...]]:
    has_cmd, has_entry = f.has("command"), f.has("entrypoint")
    if has_cmd == has_entry:
        raise InputError(
            "give exactly one of 'command' and 'entrypoint'", place=f._place_of(f.data),
            hint="command: [python, train.py]  or  entrypoint: mypkg.train:main",
        )
    if has_entry:
        entry = f.string("entrypoint")
        assert entry is not None
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", entry):
            raise f.fail("entrypoint", f"{entry!r} is not module:function", "entrypoint: mypkg.train:main")
        args = f.get("args") or []
        if not isinstance(args, list):
            raise f.fail("args", "must be a list", "args: [1, 'x']")
        return (), entry, tuple(args)
    if f.has("args"):
        raise f.fail("args", "'args' goes with 'entrypoint'; put a command's arguments in 'command'", "command: [prog, --flag]")
    raw = f.get("command")
    if isinstance(raw, str):
        try:
            argv = shlex.split(raw)
        except ValueError as exc:
            raise f.fail("command", f"cannot split the command line: {exc}", "balance the quotes, or give a list") from exc
    elif isinstance(raw, list) and all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in raw):
        argv = [str(a) for a in raw]
    else:
        raise f.fail("command", "must be a string or a list of strings", "command: [python, train.py, --epochs, '2']")
    if not argv or any("\x00" in a for a in argv):
        raise f.fail("command", "must name a program (and contain no NUL bytes)", "command: [python, train.py]")
    return tuple(argv), None, ()


def _work(f: _Fields, global_batch: int) -> tuple[float | None, int | None, int | None]:
    if not f.has("work"):
        raise InputError(
            f"missing field '{f.path('work')}'", place=f._place_of(f.data),
            hint="work: {epochs: 10, dataset_size: 50000}  or  work: {steps: 2000}",
        )
    w = f.sub("work", ("epochs", "dataset_size", "steps"))
    steps = w.integer("steps")
    epochs = w.number("epochs")
    size = w.integer("dataset_size")
    if steps is not None and (epochs is not None or size is not None):
        raise w.fail("steps", "give either steps or epochs with dataset_size, not both", "work: {steps: 2000}")
    if steps is None and (epochs is None or size is None):
        raise InputError(
            f"'{f.path('work')}' needs steps, or epochs and dataset_size", place=f.value_place("work"),
            hint="work: {epochs: 10, dataset_size: 50000}",
        )
    if size is not None and size < global_batch:
        raise w.fail("dataset_size", f"is smaller than global_batch {global_batch}", "check dataset_size")
    return epochs, size, steps


def _gpus(f: _Fields) -> GpuRequest:
    if not f.has("gpus"):
        return GpuRequest()
    raw = f.get("gpus")
    if isinstance(raw, int) and not isinstance(raw, bool):
        n = f.integer("gpus")
        assert n is not None
        return GpuRequest(n, n, ())
    g = f.sub("gpus", ("min", "max", "types", "count"))
    count = g.integer("count")
    low = g.integer("min", default=count or 1)
    high = g.integer("max", default=count or low)
    assert low is not None and high is not None
    if high < low:
        raise g.fail("max", f"max {high} is below min {low}", f"max: {low}")
    types_raw = g.get("types") or []
    if isinstance(types_raw, str):
        types_raw = [types_raw]
    if not isinstance(types_raw, list) or not all(isinstance(t, str) and t.strip() for t in types_raw):
        raise g.fail("types", "must be a list of GPU type names", "types: [v100, t4]")
    types = tuple(dict.fromkeys(t.strip().lower() for t in types_raw))
    return GpuRequest(low, high, types)


def _time_limit(f: _Fields) -> int | None:
    if not f.has("time_limit"):
        return None
    raw = f.get("time_limit")
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    if isinstance(raw, str):
        match = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{2})(?::(\d{2}))?", raw.strip())
        if match:
            days, first, second, third = match.groups()
            if third is None:  # MM:SS in Slurm's grammar would be odd for a training job; read H:MM
                minutes = int(first) * 60 + int(second)
            else:
                minutes = int(first) * 60 + int(second) + (1 if int(third) else 0)
            minutes += int(days or 0) * 1440
            if minutes > 0:
                return minutes
    raise f.fail("time_limit", f"cannot read {raw!r}", "minutes (90), 'H:MM', 'H:MM:SS' or 'D-HH:MM:SS'")


def _sbatch(f: _Fields) -> tuple[tuple[str, str | None], ...]:
    if not f.has("sbatch"):
        return ()
    raw = f.get("sbatch")
    items: list[tuple[str, str | None, str]] = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            place = (mark_place(raw.key_marks.get(key), f.source) if isinstance(raw, LocatedDict)
                     else f.value_place("sbatch"))
            items.append((str(key), None if value is True else str(value), place))
    elif isinstance(raw, list):
        for i, entry in enumerate(raw):
            place = mark_place(getattr(raw, "value_marks", {}).get(i), f.source)
            if not isinstance(entry, str) or not entry.startswith("-"):
                raise InputError(f"sbatch[{i}]: {entry!r} is not an option", place=place, hint="'--account=ml'")
            name, sep, value = entry.lstrip("-").partition("=")
            items.append((name, value if sep else None, place))
    else:
        raise f.fail("sbatch", "must be a list of options or a mapping", "sbatch: ['--account=ml', '--qos=high']")
    out = []
    for name, value, place in items:
        if not _OPTION_NAME.match(name):
            raise InputError(f"sbatch option {name!r} is not an option name", place=place, hint="'--account=ml'")
        if name in MANAGED_SBATCH:
            raise InputError(f"sbatch option --{name} is managed by slurmhet", place=place, hint=MANAGED_SBATCH[name])
        if value is not None and any(c in value for c in "\n\r\x00"):
            raise InputError(f"sbatch option --{name} has a line break in its value", place=place, hint="one line")
        out.append((name, value))
    return tuple(out)


def _env(f: _Fields) -> tuple[tuple[str, str], ...]:
    if not f.has("env"):
        return ()
    raw = f.get("env")
    if not isinstance(raw, dict):
        raise f.fail("env", "must be a mapping of NAME: value", "env: {OMP_NUM_THREADS: '4'}")
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise f.fail("env", f"{key!r} is not a variable name", "env: {OMP_NUM_THREADS: '4'}")
        if key.startswith(("SLURM_", "SLURMHET_")):
            raise f.fail("env", f"{key} is set by Slurm or slurmhet", "pick another variable name")
        if isinstance(value, (dict, list)) or value is None:
            raise f.fail("env", f"{key} must have a scalar value", f"env: {{{key}: '1'}}")
        out.append((key, str(value)))
    return tuple(out)


def _group(f: _Fields) -> str | None:
    group = f.string("group")
    if group is not None and not _JOB_NAME.match(group):
        raise f.fail("group", "must be 1-200 characters without NUL", "group: lr-sweep")
    return group


_MEMORY = re.compile(r"^(\d+)\s*([KMGT]?)B?$", re.IGNORECASE)
_MB_PER = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def _memory(f: _Fields, key: str) -> int | None:
    """Memory as Slurm writes it (``16G``, ``500M``, ``2048`` = MB), in MB."""
    if not f.has(key):
        return None
    raw = f.get(key)
    match = _MEMORY.match(str(raw).strip()) if isinstance(raw, (int, str)) and not isinstance(raw, bool) else None
    mb = math.ceil(int(match.group(1)) * _MB_PER[match.group(2).upper()]) if match else 0
    if mb < 1:
        raise f.fail(key, f"{raw!r} is not an amount of memory", f"{key}: 16G (K, M, G, T; a bare number is MB)")
    return mb


def _line(f: _Fields, key: str, hint: str) -> str | None:
    value = f.string(key)
    if value is not None and any(c in value for c in "\n\r\x00"):
        raise f.fail(key, "has a line break", hint)
    return value.strip() if value is not None else None


_MODULE = re.compile(r"^[A-Za-z0-9_.+/:@-]+$")


def _modules(f: _Fields) -> tuple[str, ...]:
    """``modules: [cuda/12.4, nccl]``: loaded with ``module load`` before the command, in this order."""
    if not f.has("modules"):
        return ()
    raw = f.get("modules")
    items = raw if isinstance(raw, list) else [raw]
    for item in items:
        if not isinstance(item, str) or not _MODULE.match(item):
            raise f.fail("modules", f"{item!r} is not a module name", "modules: [cuda/12.4, gcc/13]")
    return tuple(items)


def _placement_options(f: _Fields, sbatch: tuple[tuple[str, str | None], ...]) -> tuple[tuple[str, str | None], ...]:
    """``partition:``, ``account:``, ``qos:`` as the sbatch options they are (checked like them against what
    the user may use); one given both ways is refused."""
    out: list[tuple[str, str | None]] = []
    for key, short in (("partition", "p"), ("account", "A"), ("qos", "q")):
        value = _line(f, key, f"{key}: name")
        if value is None:
            continue
        if not re.fullmatch(r"[A-Za-z0-9_.,-]+", value):
            raise f.fail(key, f"{value!r} is not a {key} name", f"{key}: name")
        if any(name in (key, short) for name, _ in sbatch):
            raise f.fail(key, f"{key} is given both here and in 'sbatch:'", f"keep one: {key}: {value}")
        out.append((key, value))
    return tuple(out)


def _after(f: _Fields) -> tuple[str | int, ...]:
    """``after: [train, 12]``: job or group names of this file, or stored job ids."""
    if not f.has("after"):
        return ()
    raw = f.get("after")
    items = raw if isinstance(raw, list) else [raw]
    out: list[str | int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)) or (isinstance(item, int) and item < 1) \
                or (isinstance(item, str) and not item.strip()):
            raise f.fail("after", f"{item!r} is neither a job name nor a stored job id", "after: [train-resnet, 12]")
        out.append(item.strip() if isinstance(item, str) else item)
    return tuple(out)


def check_after(specs: Sequence[JobSpec]) -> None:
    """Names in ``after`` must be jobs or groups of the same file; no job may wait for itself, even round about."""
    jobs = {s.name for s in specs}
    groups: dict[str, list[str]] = {}
    for s in specs:
        if s.group:
            groups.setdefault(s.group, []).append(s.name)
    edges: dict[str, set[str]] = {}
    for s in specs:
        for item in s.after:
            if isinstance(item, int):
                continue
            targets = [item] if item in jobs else groups.get(item)
            if not targets:
                close = difflib.get_close_matches(item, [s.name for s in specs] + list(groups), n=1)
                raise InputError(f"job {s.name!r}: after {item!r}: no job or group of that name in this file",
                                 place=s.place("after"), hint=f"did you mean '{close[0]}'?" if close else
                                 "name a job of this file, or give a stored job id")
            edges.setdefault(s.name, set()).update(targets)
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(edges.get(name, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [name, nxt]
                spec = next(x for x in specs if x.name == name)
                raise InputError(f"job {name!r}: after makes a cycle: {' -> '.join(cycle)}", place=spec.place("after"),
                                 hint="a job cannot wait for itself")
            if state.get(nxt) is None:
                visit(nxt, path + [nxt])
        state[name] = 2

    for s in specs:
        if state.get(s.name) is None:
            visit(s.name, [s.name])


def parse_job(data: Any, source: str, where: str = "") -> JobSpec:
    """Validate one job mapping; ``source`` names the file for error places."""
    f = _Fields(data, source, where, JOB_FIELDS)
    name = f.string("name", required=True)
    assert name is not None
    if not _JOB_NAME.match(name):
        raise f.fail("name", "must be 1-200 characters without NUL", "name: resnet50-cifar")
    workload = _workload(f)
    global_batch = f.integer("global_batch", default=workload.batch_size)
    assert global_batch is not None
    command, entrypoint, args = _command(f)
    epochs, dataset_size, steps = _work(f, global_batch)
    sync = f.string("sync", default="allreduce")
    if sync not in SYNC_MODES:
        close = difflib.get_close_matches(str(sync), SYNC_MODES, n=1)
        raise f.fail("sync", f"unknown sync mode {sync!r}", f"did you mean '{close[0]}'?" if close else " | ".join(SYNC_MODES))
    sbatch = _sbatch(f)
    if f.boolean("colocate", False) and (f.has("container") or f.has("modules")):
        raise f.fail("colocate", "co-located jobs share one process tree under MPS: a container or modules per "
                     "job cannot apply", "drop colocate, or the container/modules")
    places = {"": mark_place(getattr(data, "mark", None), source)}
    places.update({str(k): f.value_place(k) for k in data})
    return JobSpec(
        name=name,
        workload=workload,
        global_batch=global_batch,
        command=command,
        entrypoint=entrypoint,
        args=args,
        epochs=epochs,
        dataset_size=dataset_size,
        steps=steps,
        model_size_mb=f.number("model_size_mb"),
        sync=sync,
        gpus=_gpus(f),
        weight=f.number("weight", default=1.0) or 1.0,
        priority=f.integer("priority", minimum=-1000, default=0) or 0,
        colocate=f.boolean("colocate", False),
        gpu_memory_gb=f.number("gpu_memory_gb"),
        checkpoint_dir=f.string("checkpoint_dir"),
        time_limit_min=_time_limit(f),
        sbatch=sbatch + _placement_options(f, sbatch),
        env=_env(f),
        profile_steps=f.integer("profile_steps"),
        group=_group(f),
        after=_after(f),
        cpus_per_gpu=f.integer("cpus_per_gpu"),
        mem_per_gpu_mb=_memory(f, "mem_per_gpu"),
        workdir=_line(f, "workdir", "workdir: /scratch/me/run1"),
        container=_line(f, "container", "container: nvcr.io/nvidia/pytorch:24.05-py3"),
        modules=_modules(f),
        places=places,
    )


def load_text(text: str, source: str) -> list[JobSpec]:
    """Parse a YAML document holding one job or ``jobs: [...]``."""
    loader = _LocatedLoader(text)
    loader.name = source  # marks name the file, not "<unicode string>" (errors raised while loading use them)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source, "check indentation and quoting on that line") from exc
    finally:
        loader.dispose()
    if data is None:
        raise InputError("the file holds no job", place=source, hint="write one job mapping or 'jobs: [...]'")
    if isinstance(data, dict) and "jobs" in data:
        extra = [k for k in data if k != "jobs"]
        if extra:
            raise InputError(f"unknown top-level field '{extra[0]}'",
                             place=mark_place(data.key_marks.get(extra[0]), source),
                             hint="a jobs file holds only 'jobs:'")
        jobs = data["jobs"]
        if not isinstance(jobs, list) or not jobs:
            raise InputError("'jobs' must be a non-empty list", place=mark_place(data.value_marks.get("jobs"), source),
                             hint="jobs:\n  - name: a ...")
        specs = [spec for i, job in enumerate(jobs) for spec in _expanded(job, source, f"jobs[{i}]")]
    else:
        specs = _expanded(data, source, "")
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise InputError(f"job name {spec.name!r} is used twice in this file", place=spec.place("name"),
                             hint="give every job its own name")
        seen[spec.name] = i
    check_after(specs)
    return specs


def _expanded(data: Any, source: str, where: str) -> list[JobSpec]:
    """One job, or its sweep's variants (slurmhet/sweep.py), each validated like any job."""
    if isinstance(data, dict) and data.get("sweep") is not None:
        f = _Fields(data, source, where, JOB_FIELDS)
        variants = sweep.expand(data, lambda cause, hint: f.fail("sweep", cause, hint))
        return [parse_job(v, source, f"{where}.sweep[{k}]" if where else f"sweep[{k}]")
                for k, v in enumerate(variants)]
    return [parse_job(data, source, where)]


def load_file(path: str | Path) -> list[JobSpec]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read job file: {exc.__class__.__name__}: {exc}", place=str(path),
                         hint="check the path and that it is UTF-8 text") from exc
    return load_text(text, str(path))


def per_node_fit(spec: JobSpec, cpus: int, memory_mb: int) -> int:
    """How many of the spec's GPUs a node's CPUs and memory can feed (unknown sizes do not limit)."""
    fits = [1 << 30]
    if spec.cpus_per_gpu and cpus:
        fits.append(cpus // spec.cpus_per_gpu)
    if spec.mem_per_gpu_mb and memory_mb:
        fits.append(memory_mb // spec.mem_per_gpu_mb)
    return min(fits)


def check_against_cluster(spec: JobSpec, inventory: Inventory) -> None:
    """Refuse GPU types the cluster lacks and requests larger than the cluster. ``inventory`` is every node,
    drained and down ones too: a node out for repair makes a job wait, not its spec wrong."""
    have = inventory.gpus_by_type()
    unknown = [t for t in spec.gpus.types if t not in have]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(have), n=1)
        raise InputError(
            f"job {spec.name!r}: GPU type {unknown[0]!r} is not in the cluster", place=spec.place("gpus"),
            hint=(f"did you mean '{close[0]}'? " if close else "") + "the cluster has " + ", ".join(have),
        )
    allowed = spec.gpus.types or tuple(have)
    if spec.cpus_per_gpu or spec.mem_per_gpu_mb:
        fit = {t: sum(min(n.gpus.get(t, 0), per_node_fit(spec, n.cpus, n.memory_mb)) for n in inventory.nodes)
               for t in allowed}
        if not any(fit.values()):
            field_name = "cpus_per_gpu" if spec.cpus_per_gpu else "mem_per_gpu"
            raise InputError(f"job {spec.name!r}: no node of its GPU types has the CPUs and memory for one GPU "
                             f"({spec.cpus_per_gpu or '-'} CPUs, {spec.mem_per_gpu_mb or '-'} MB per GPU)",
                             place=spec.place(field_name), hint="ask for less per GPU, or allow other GPU types")
        have = {t: fit.get(t, 0) for t in have}
    capacity = sum(have[t] for t in allowed)
    if spec.gpus.min > capacity:
        raise InputError(
            f"job {spec.name!r}: asks for at least {spec.gpus.min} GPUs but the cluster has {capacity}"
            + (f" of types {', '.join(allowed)}" if spec.gpus.types else ""),
            place=spec.place("gpus"), hint=f"lower gpus.min to {capacity} or allow more types",
        )
