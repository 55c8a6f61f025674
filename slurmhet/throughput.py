"""The (workload, GPU type) -> samples/s table every planner reads.

Three sources feed it, and every entry says which one it came from:

* measured tables: Gavel's ``simulation_throughputs.json`` ships as package data
  (``slurmhet/data/gavel``, MIT licence beside it); its job types already use the
  workload-key form ``"ResNet-18 (batch size 64)"``. Steps/s at scale factor 1
  are turned into samples/s per GPU (x batch size) because the job model
  composes per-GPU rates (seed 001, eq. 13);
* profiles and runtime measurements, refined by an exponentially weighted
  moving average (seed 001 section III-C) through :meth:`ThroughputTable.observe`;
* priors for workloads or GPU types nobody measured: a type ratio borrowed from
  the closest known workload, seed 003 eq. (10), or the built-in GPU catalog
  (:mod:`slurmhet.gpu_catalog`) applied to a spec's own rate hint or, on the live
  path, to a default rate. Priors are always flagged (``source == "prior"``) and
  never silently zero.

Site tables (``etc/throughput/*.yaml`` or ``.csv``) override and extend the
shipped data. A missing entry raises :class:`~slurmhet.errors.InputError`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from functools import cached_property, lru_cache
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from slurmhet.errors import InputError, yaml_error
from slurmhet.gpu_catalog import builtin as builtin_catalog

SOURCES = ("measured", "profile", "ewma", "prior")

#: Canonical spellings of model names; lookups ignore case and punctuation.
KNOWN_MODELS = (
    "ResNet-18", "ResNet-50", "ResNet-101", "VGG-11", "VGG-19", "AlexNet", "Transformer", "LM",
    "Recommendation", "A3C", "CycleGAN", "SE-ResNet-18",
)

#: GPU memory in GB per type, used when the inventory does not say (co-location memory checks).
DEFAULT_GPU_MEMORY_GB: Mapping[str, float] = {
    "k80": 12.0, "p100": 16.0, "t4": 16.0, "v100": 16.0, "a100": 40.0, "h100": 80.0, "h200": 141.0,
}

#: The default prior's anchor when a table has no measurement at all: a mid-sized CNN's samples/s on one V100.
DEFAULT_V100_SAMPLES_PER_S = 500.0

_KEY = re.compile(r"^\s*(?P<model>.+?)\s*\(batch size (?P<batch>\d+)\)\s*$")


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_ALIASES = {_squash(m): m for m in KNOWN_MODELS} | {"lstm": "LM", "resnet18": "ResNet-18", "vgg19": "VGG-19"}


def canonical_model(model: str) -> str:
    """``resnet18`` -> ``ResNet-18``; unknown names are kept as written."""
    return _ALIASES.get(_squash(model), model.strip())


def workload_key(model: str, batch_size: int) -> str:
    """The table key of a model at a per-GPU batch size, Gavel's spelling."""
    return f"{canonical_model(model)} (batch size {batch_size})"


@lru_cache(maxsize=65_536)
def canonical_key(key: str) -> str:
    """Normalise a user-written key so ``resnet18 (batch size 64)`` finds Gavel's entry (memoised: a planner
    looks the same few keys up hundreds of thousands of times per decision at scale)."""
    match = _KEY.match(key)
    if match:
        return workload_key(match.group("model"), int(match.group("batch")))
    return canonical_model(key)


def split_key(key: str) -> tuple[str, int | None]:
    match = _KEY.match(key)
    return (match.group("model"), int(match.group("batch"))) if match else (key, None)


@dataclass(frozen=True)
class ThroughputEntry:
    """One cell: samples/s of one GPU of ``gpu_type`` training ``workload``."""

    value: float
    source: str
    provenance: str = ""
    samples: int = 1

    @property
    def is_prior(self) -> bool:
        return self.source == "prior"


@dataclass(frozen=True)
class ColocationProfile:
    """Kernel metrics of one workload on its own (thesis eqs. 4.2 and 4.3).

    ``occupancy`` is C = sum q_i t_i and ``membw`` is M = sum p_i t_i over one
    training iteration, as Nsight Compute reports them.
    """

    occupancy: float
    membw: float


@dataclass(frozen=True)
class WorkloadTraits:
    """What a spec says about how a workload computes, for catalog priors (roofline)."""

    precision: str = "fp32"
    #: FLOP per byte of memory traffic; None: use the geometric mean of compute and bandwidth ratios.
    arithmetic_intensity: float | None = None


@dataclass(frozen=True)
class ThroughputTable:
    """Immutable table; :meth:`observe` and :meth:`merged` return new tables."""

    entries: Mapping[tuple[str, str], ThroughputEntry] = field(default_factory=dict)
    #: (workload, partner, gpu_type) -> (own samples/s, partner samples/s) when sharing one GPU.
    colocated_pairs: Mapping[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)
    profiles: Mapping[str, ColocationProfile] = field(default_factory=dict)
    gpu_memory_gb: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_GPU_MEMORY_GB))
    ewma_alpha: float = 0.3
    traits: Mapping[str, WorkloadTraits] = field(default_factory=dict)
    #: The live path plans every model (a flagged default rate when nothing is known of it); benchmarks and
    #: traces keep this off so a workload missing from their table is an error, not a guess.
    default_prior: bool = False

    # ------------------------------------------------------------------ lookups

    def workloads(self) -> tuple[str, ...]:
        return tuple(sorted({w for w, _ in self.entries}))

    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for _, t in self.entries}))

    def get(self, workload: str, gpu_type: str, *, allow_prior: bool = True) -> ThroughputEntry:
        """The entry for one cell, a flagged prior, or an InputError naming the cell."""
        key, gpu = canonical_key(workload), gpu_type.lower()
        entry = self.entries.get((key, gpu))
        if entry is not None:
            return entry
        if allow_prior:
            prior = (self._closest_prior(key, gpu) or self._catalog_prior(key, gpu) or self._same_model_prior(key, gpu)
                     or self._default_prior(key, gpu))
            if prior is not None:
                return prior
        known = sorted(t for w, t in self.entries if w == key)
        uncatalogued = builtin_catalog().lookup(gpu) is None
        raise InputError(
            f"no throughput for workload {key!r} on GPU type {gpu!r}"
            + (f" (known types: {', '.join(known)})" if known else " and no prior for it")
            + (f"; {gpu!r} is not in the GPU catalog" if uncatalogued else ""),
            place=f"throughput[{key!r}][{gpu!r}]",
            hint="`slurmhet profile` the job on that GPU type, add it to a site table (etc/throughput/*.yaml)"
                 ", or give workload.samples_per_s_hint",
        )

    def rate(self, workload: str, gpu_type: str) -> float:
        return self.get(workload, gpu_type).value

    def _closest_prior(self, key: str, gpu: str) -> ThroughputEntry | None:
        """Prior from the closest known workload's ratio between GPU types.

        The workload must be known on at least one other GPU type (a profile);
        the ratio comes from the same model at the nearest batch size, else
        from the geometric mean over all workloads known on both types.
        """
        mine = {t: e for (w, t), e in self.entries.items() if w == key and not e.is_prior}
        if not mine:
            return None
        model, batch = split_key(key)
        scored = []
        for (w, t), e in sorted(self.entries.items()):
            if t != gpu or e.is_prior or w == key:
                continue
            refs = [r for r in sorted(mine) if (w, r) in self.entries and not self.entries[(w, r)].is_prior]
            if not refs:
                continue
            other_model, other_batch = split_key(w)
            same = other_model == model
            distance = abs(math.log(other_batch / batch)) if same and other_batch and batch else math.inf
            estimate = mine[refs[0]].value * e.value / self.entries[(w, refs[0])].value
            scored.append((not same, distance, w, refs[0], estimate))
        if not scored:
            return None
        scored.sort()
        if not scored[0][0]:
            _, _, w, ref, estimate = scored[0]
            return ThroughputEntry(estimate, "prior", f"prior: {gpu}/{ref} ratio of {w}")
        value = math.exp(sum(math.log(s[4]) for s in scored) / len(scored))
        return ThroughputEntry(value, "prior", f"prior: geometric mean {gpu} ratio over {len(scored)} workloads")

    def _same_model_prior(self, key: str, gpu: str) -> ThroughputEntry | None:
        """Same model at the nearest measured batch size, samples/s kept (flagged prior)."""
        model, batch = split_key(key)
        if batch is None:
            return None
        near = [
            (abs(math.log(b / batch)), w, e)
            for (w, t), e in self.entries.items()
            if t == gpu and not e.is_prior and (b := split_key(w)[1]) is not None and split_key(w)[0] == model
        ]
        if not near:
            return None
        _, w, e = min(near, key=lambda x: (x[0], x[1]))
        return ThroughputEntry(e.value, "prior", f"prior: samples/s of {w}")

    def _catalog_prior(self, key: str, gpu: str) -> ThroughputEntry | None:
        """This workload's own rate on another type (measured first, else a spec's hint) x the catalog ratio."""
        catalog = builtin_catalog()
        traits = self.traits.get(key, WorkloadTraits())
        anchors = sorted(((e.is_prior, t, e) for (w, t), e in self.entries.items() if w == key and t != gpu),
                         key=lambda a: (a[0], a[1]))
        for _, ref, entry in anchors:
            ratio = catalog.ratio(gpu, ref, traits.precision, traits.arithmetic_intensity)
            if ratio is not None:
                basis = catalog.basis(traits.precision, traits.arithmetic_intensity)
                return ThroughputEntry(entry.value * ratio, "prior",
                                       f"prior: catalog {gpu}/{ref} = {ratio:.3g} ({basis}) x {entry.provenance or entry.source}")
        return None

    def _default_prior(self, key: str, gpu: str) -> ThroughputEntry | None:
        """A workload nobody measured or hinted: the geometric mean of the measured workloads on this type
        (or, where none ran on it, on another type x the catalog ratio). Only when ``default_prior`` is on."""
        if not self.default_prior:
            return None
        catalog = builtin_catalog()
        traits = self.traits.get(key, WorkloadTraits())
        typical = self._typical_rates
        if gpu in typical:
            value, count = typical[gpu]
            return ThroughputEntry(value, "prior", f"prior: default, geometric mean of {count} measured workloads on {gpu}")
        for ref, (value, count) in sorted(typical.items(), key=lambda kv: (-kv[1][1], kv[0])):
            ratio = catalog.ratio(gpu, ref, traits.precision, traits.arithmetic_intensity)
            if ratio is not None:
                return ThroughputEntry(value * ratio, "prior", f"prior: default, geometric mean of {count} measured "
                                       f"workloads on {ref} x catalog {gpu}/{ref} = {ratio:.3g}")
        ratio = catalog.ratio(gpu, "v100", traits.precision, traits.arithmetic_intensity)
        if ratio is None:
            return None
        return ThroughputEntry(DEFAULT_V100_SAMPLES_PER_S * ratio, "prior",
                               f"prior: default {DEFAULT_V100_SAMPLES_PER_S:g} samples/s on v100 x catalog {ratio:.3g}")

    @cached_property
    def _typical_rates(self) -> dict[str, tuple[float, int]]:
        """Per GPU type: geometric mean samples/s over measured workloads and how many (computed once per table)."""
        logs: dict[str, list[float]] = {}
        for (_, t), e in self.entries.items():
            if not e.is_prior:
                logs.setdefault(t, []).append(math.log(e.value))
        return {t: (math.exp(sum(v) / len(v)), len(v)) for t, v in logs.items()}

    def with_hints(self, hints: Iterable[tuple[str, Mapping[str, float], WorkloadTraits, str]]) -> "ThroughputTable":
        """Fold specs' ``samples_per_s_hint`` (flagged priors) and traits in; a table's own cells win.

        Most specs say neither: then this is the table itself, not a copy (planners call it per decision, and
        a copy would also drop the memoised :attr:`_typical_rates`).
        """
        new_entries: dict[tuple[str, str], ThroughputEntry] = {}
        new_traits: dict[str, WorkloadTraits] = {}
        seen: set[str] = set()  # the first spec of a workload says its traits (the default ones are no entry)
        for workload, rates, trait, origin in hints:
            key = canonical_key(workload)
            if key not in seen and key not in self.traits and trait != WorkloadTraits():
                new_traits[key] = trait
            seen.add(key)
            for gpu, value in rates.items():
                cell = (key, gpu.lower())
                if cell not in self.entries:
                    new_entries.setdefault(cell, ThroughputEntry(float(value), "prior", f"hint in {origin}"))
        if not new_entries and not new_traits:
            return self
        return replace(self, entries={**self.entries, **new_entries}, traits={**self.traits, **new_traits})

    def colocated(self, workload: str, partner: str, gpu_type: str) -> tuple[float, float] | None:
        """Measured (own, partner) samples/s when the two share one GPU, if known and feasible."""
        pair = self.colocated_pairs.get((canonical_key(workload), canonical_key(partner), gpu_type.lower()))
        return pair if pair and pair[0] > 0 and pair[1] > 0 else None

    def profile(self, workload: str) -> ColocationProfile | None:
        return self.profiles.get(canonical_key(workload))

    # ------------------------------------------------------------------ updates

    def observe(self, workload: str, gpu_type: str, samples_per_s: float) -> "ThroughputTable":
        """Fold one runtime measurement in by EWMA: new = a*x + (1-a)*old (seed 001 III-C).

        A prior or missing cell is replaced outright: a real measurement beats any guess.
        """
        if not (isinstance(samples_per_s, (int, float)) and math.isfinite(samples_per_s) and samples_per_s > 0):
            raise InputError(f"throughput sample {samples_per_s!r} must be a positive number",
                             place=f"throughput[{workload!r}][{gpu_type!r}]", hint="samples per second")
        key, gpu = canonical_key(workload), gpu_type.lower()
        old = self.entries.get((key, gpu))
        if old is None or old.is_prior:
            new = ThroughputEntry(float(samples_per_s), "ewma", "runtime measurement", 1)
        else:
            value = self.ewma_alpha * samples_per_s + (1 - self.ewma_alpha) * old.value
            new = ThroughputEntry(value, "ewma", f"EWMA(alpha={self.ewma_alpha}) over {old.source}", old.samples + 1)
        return replace(self, entries={**self.entries, (key, gpu): new})

    def merged(self, other: "ThroughputTable") -> "ThroughputTable":
        """This table overridden by ``other`` (a site table over the shipped data)."""
        return ThroughputTable(
            {**self.entries, **other.entries},
            {**self.colocated_pairs, **other.colocated_pairs},
            {**self.profiles, **other.profiles},
            {**self.gpu_memory_gb, **other.gpu_memory_gb},
            other.ewma_alpha,
            {**self.traits, **other.traits},
            self.default_prior or other.default_prior,
        )

    def scaled(self, factors: Mapping[tuple[str, str], float]) -> "ThroughputTable":
        """A copy with some cells multiplied (benchmarks: prediction error epsilon)."""
        entries = {k: replace(e, value=e.value * factors.get(k, 1.0)) for k, e in self.entries.items()}
        return replace(self, entries=entries)

    # ------------------------------------------------------------------ loaders

    @classmethod
    def from_rates(cls, rates: Mapping[str, Mapping[str, float]], provenance: str = "given") -> "ThroughputTable":
        """Build from ``{workload: {gpu_type: samples/s}}`` (tests, benchmarks)."""
        entries = {}
        for workload, row in rates.items():
            for gpu, value in row.items():
                entries[(canonical_key(workload), gpu.lower())] = ThroughputEntry(
                    _positive(value, f"rates[{workload!r}][{gpu!r}]"), "measured", provenance)
        return cls(entries)

    @classmethod
    def gavel(cls, path: Path | None = None) -> "ThroughputTable":
        """Gavel's measured table (shipped package data unless ``path`` is given)."""
        if path is None:
            text = resources.files("slurmhet").joinpath("data/gavel/simulation_throughputs.json").read_text()
            where = "slurmhet/data/gavel/simulation_throughputs.json"
        else:
            text, where = Path(path).read_text(), str(path)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc}", place=where, hint="Gavel's simulation_throughputs.json") from exc
        return cls._from_gavel_dict(raw, where)

    @classmethod
    def _from_gavel_dict(cls, raw: Any, where: str) -> "ThroughputTable":
        if not isinstance(raw, dict):
            raise InputError("top level must map worker types", place=where, hint="{'v100': {...}}")
        entries: dict[tuple[str, str], ThroughputEntry] = {}
        pairs: dict[tuple[str, str, str], tuple[float, float]] = {}
        for worker, cells in raw.items():
            if worker.endswith("_unconsolidated") or not isinstance(cells, dict):
                continue  # only consolidated single-GPU cells compose per eq. (13)
            for cell_key, cell in cells.items():
                job_type, scale = _gavel_cell_key(cell_key, f"{where}:{worker}")
                if scale != 1:
                    continue
                place = f"{where}:{worker}[{cell_key}]"
                if not isinstance(cell, dict) or "null" not in cell:
                    raise InputError("cell lacks the isolated 'null' throughput", place=place, hint="Gavel format")
                batch = split_key(job_type)[1] or 1
                key = canonical_key(job_type if split_key(job_type)[1] else f"{job_type} (batch size 1)")
                steps = _number(cell["null"], place + "[null]")
                if steps > 0:
                    entries[(key, worker)] = ThroughputEntry(steps * batch, "measured", f"Gavel {worker}")
                for partner, both in cell.items():
                    if partner == "null":
                        continue
                    p_type, _ = _gavel_cell_key(partner, place)
                    p_batch = split_key(p_type)[1] or 1
                    p_key = canonical_key(p_type if split_key(p_type)[1] else f"{p_type} (batch size 1)")
                    if not (isinstance(both, list) and len(both) == 2):
                        raise InputError("co-located cell must be [own, partner]", place=f"{place}[{partner}]",
                                         hint="[steps/s, steps/s]")
                    own, other = (_number(v, f"{place}[{partner}]") for v in both)
                    pairs[(key, p_key, worker)] = (own * batch, other * p_batch)
        return cls(entries, pairs)

    @classmethod
    def load(cls, path: str | Path, base: "ThroughputTable | None" = None) -> "ThroughputTable":
        """Read a site table (YAML or CSV); YAML ``include: [gavel]`` starts from the shipped data."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read throughput table: {exc}", place=str(path), hint="check the path") from exc
        if path.suffix.lower() == ".csv":
            return (base or cls()).merged(_parse_csv(text, str(path)))
        return _parse_yaml(text, str(path), base)


def _gavel_cell_key(text: str, place: str) -> tuple[str, int]:
    match = re.fullmatch(r"\('(.+)', (\d+)\)", text)
    if not match:
        raise InputError(f"cannot read Gavel key {text!r}", place=place, hint="\"('<job type>', <scale>)\"")
    return match.group(1), int(match.group(2))


def _number(value: Any, place: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{value!r} is not a non-negative number", place=place, hint="samples per second, e.g. 880.5")
    return float(value)


def _positive(value: Any, place: str) -> float:
    number = _number(value, place)
    if number <= 0:
        raise InputError("throughput must be positive; leave the cell out instead of writing 0", place=place,
                         hint="missing cells are looked up as priors or reported")
    return number


def _parse_csv(text: str, source: str) -> ThroughputTable:
    """``workload,gpu_type,samples_per_s[,source[,provenance]]`` with a header line."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0][:3]] != ["workload", "gpu_type", "samples_per_s"]:
        raise InputError("CSV must start with 'workload,gpu_type,samples_per_s'", place=f"{source}:1",
                         hint="header: workload,gpu_type,samples_per_s,source,provenance")
    entries = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        place = f"{source}:{line}"
        if len(row) < 3 or not row[0].strip() or not row[1].strip():
            raise InputError("row needs workload, gpu_type and samples_per_s", place=place, hint="ResNet-18 (batch size 64),v100,1542")
        try:
            value = float(row[2])
        except ValueError:
            raise InputError(f"samples_per_s {row[2]!r} is not a number", place=f"{place}:samples_per_s",
                             hint="e.g. 1542.0") from None
        src = row[3].strip() if len(row) > 3 and row[3].strip() else "measured"
        if src not in SOURCES:
            raise InputError(f"unknown source {src!r}", place=f"{place}:source", hint=" | ".join(SOURCES))
        entries[(canonical_key(row[0]), row[1].strip().lower())] = ThroughputEntry(
            _positive(value, f"{place}:samples_per_s"), src, row[4].strip() if len(row) > 4 else source)
    return ThroughputTable(entries)


def _parse_yaml(text: str, source: str, base: ThroughputTable | None) -> ThroughputTable:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source, "check indentation and quoting on that line") from exc
    if not isinstance(data, dict):
        raise InputError("throughput table must be a mapping", place=source, hint="throughputs: {...}")
    unknown = set(data) - {"include", "throughputs", "derive", "profiles", "gpu_memory_gb", "ewma_alpha"}
    if unknown:
        raise InputError(f"unknown field {sorted(unknown)[0]!r}", place=source,
                         hint="include, throughputs, derive, profiles, gpu_memory_gb, ewma_alpha")
    table = base or ThroughputTable()
    for name in data.get("include") or []:
        if name != "gavel":
            raise InputError(f"unknown include {name!r}", place=f"{source}:include", hint="include: [gavel]")
        table = table.merged(ThroughputTable.gavel())
    entries: dict[tuple[str, str], ThroughputEntry] = {}
    for workload, row in (data.get("throughputs") or {}).items():
        if not isinstance(row, dict):
            raise InputError("must map GPU type to samples/s", place=f"{source}:throughputs[{workload!r}]",
                             hint="v100: 1542")
        for gpu, cell in row.items():
            place = f"{source}:throughputs[{workload!r}][{gpu!r}]"
            if isinstance(cell, dict):
                src = cell.get("source", "measured")
                if src not in SOURCES:
                    raise InputError(f"unknown source {src!r}", place=place, hint=" | ".join(SOURCES))
                if "value" not in cell:
                    raise InputError("missing 'value'", place=place, hint="{value: 1542, source: measured}")
                entry = ThroughputEntry(_positive(cell["value"], place), src, str(cell.get("provenance", source)))
            else:
                entry = ThroughputEntry(_positive(cell, place), "measured", source)
            entries[(canonical_key(str(workload)), str(gpu).lower())] = entry
    table = table.merged(ThroughputTable(entries))
    for i, rule in enumerate(data.get("derive") or []):
        table = _derive(table, rule, f"{source}:derive[{i}]")
    profiles = {}
    for workload, prof in (data.get("profiles") or {}).items():
        place = f"{source}:profiles[{workload!r}]"
        if not isinstance(prof, dict) or {"occupancy", "membw"} - set(prof):
            raise InputError("profile needs occupancy and membw", place=place, hint="{occupancy: 2.1e7, membw: 1.4e7}")
        profiles[canonical_key(str(workload))] = ColocationProfile(_number(prof["occupancy"], place + ".occupancy"),
                                                                   _number(prof["membw"], place + ".membw"))
    memory = {str(k).lower(): _positive(v, f"{source}:gpu_memory_gb[{k!r}]") for k, v in (data.get("gpu_memory_gb") or {}).items()}
    alpha = data.get("ewma_alpha", table.ewma_alpha)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
        raise InputError(f"ewma_alpha {alpha!r} must be in (0, 1]", place=f"{source}:ewma_alpha", hint="0.3")
    return replace(table, profiles={**table.profiles, **profiles},
                   gpu_memory_gb={**table.gpu_memory_gb, **memory}, ewma_alpha=float(alpha))


def _derive(table: ThroughputTable, rule: Any, place: str) -> ThroughputTable:
    """``{type, from, ratio, per_model, provenance}``: fill a GPU type nobody measured, flagged prior."""
    if not isinstance(rule, dict) or {"type", "from", "ratio"} - set(rule):
        raise InputError("derive rule needs type, from and ratio", place=place, hint="{type: t4, from: v100, ratio: 0.47}")
    target, origin = str(rule["type"]).lower(), str(rule["from"]).lower()
    default = _positive(rule["ratio"], place + ".ratio")
    per_model = {canonical_model(str(m)): _positive(r, f"{place}.per_model[{m!r}]")
                 for m, r in (rule.get("per_model") or {}).items()}
    note = str(rule.get("provenance", f"derived from {origin}"))
    new = {}
    for (workload, gpu), entry in table.entries.items():
        if gpu != origin or (workload, target) in table.entries:
            continue
        ratio = per_model.get(split_key(workload)[0], default)
        new[(workload, target)] = ThroughputEntry(entry.value * ratio, "prior", f"prior: {origin} x {ratio:g}; {note}")
    return replace(table, entries={**table.entries, **new})


def eq10_prior(pmi: float, batch_size: int, pcie_scaling: float, model_weight: float, dataset_size: float) -> float:
    """Seed 003 eq. (10): PMI x batch x pcie_scaling / (model_weight x dataset_size).

    Its unit is relative (Hadar uses it to rank nodes before any measurement);
    :func:`eq10_type_ratios` turns it into ratios between GPU types.
    """
    for name, value in (("pmi", pmi), ("batch_size", batch_size), ("pcie_scaling", pcie_scaling),
                        ("model_weight", model_weight), ("dataset_size", dataset_size)):
        if not value > 0:
            raise InputError(f"{name} must be positive, got {value!r}", place=f"eq10.{name}", hint="see seed 003 eq. (10)")
    return pmi * batch_size * pcie_scaling / (model_weight * dataset_size)


def performance_memory_index(tflops: float, vram_gb: float) -> float:
    """PMI of seed 003: tensor TFLOPS and VRAM combined "in a square-root fashion", read as sqrt(TFLOPS x GB)."""
    return math.sqrt(tflops * vram_gb)


def eq10_type_ratios(gpu_specs: Mapping[str, tuple[float, float, float]], reference: str) -> dict[str, float]:
    """Throughput of each GPU type relative to ``reference`` by eq. (10); specs are (TFLOPS, VRAM GB, PCIe scaling).

    Workload terms (batch, model weight, dataset size) cancel in the ratio.
    """
    if reference not in gpu_specs:
        raise InputError(f"reference type {reference!r} has no spec", place="gpu_specs", hint="add its TFLOPS and VRAM")
    ref = gpu_specs[reference]
    base = eq10_prior(performance_memory_index(ref[0], ref[1]), 1, ref[2], 1, 1)
    return {t: eq10_prior(performance_memory_index(s[0], s[1]), 1, s[2], 1, 1) / base for t, s in gpu_specs.items()}


def load_tables(paths: Iterable[str | Path], include_gavel: bool = True) -> ThroughputTable:
    """Gavel's table overridden by each site table in turn."""
    table = ThroughputTable.gavel() if include_gavel else ThroughputTable()
    for path in paths:
        table = ThroughputTable.load(path, base=table)
    return table
