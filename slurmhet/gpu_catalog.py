"""The built-in GPU catalog: peak compute, memory bandwidth and memory per GPU type (package data).

It exists so that no model is refused for want of a measurement: the ratio of two
types' speeds for a workload nobody measured follows from their peak figures
(roofline on the workload's arithmetic intensity when it is known, else the
geometric mean of the compute and bandwidth ratios). throughput.py turns the
ratio into a flagged prior; a measurement always replaces it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from typing import Any, Mapping

import yaml

from slurmhet.errors import InputError

#: How a workload computes: "fp32" reads the ordinary cores, "mixed" (FP16/BF16 autocast) the tensor cores.
PRECISIONS = ("fp32", "mixed")

_FORM = re.compile(r"^(sxm\d?|pcie|nvl)?(?:(\d+)gb?)?(sxm\d?|pcie|nvl)?$")


@dataclass(frozen=True)
class GpuModel:
    """One catalog row; figures are per device (what Slurm's gres counts)."""

    name: str
    fp32_tflops: float
    fp16_tflops: float | None
    tensor_tflops: float | None
    memory_gbps: float
    memory_gb: float
    source: str
    aliases: tuple[str, ...] = ()

    def peak_tflops(self, precision: str) -> float:
        """The compute roof for ``precision``: tensor cores for mixed precision when the device has them."""
        if precision == "mixed":
            return self.tensor_tflops or self.fp16_tflops or self.fp32_tflops
        return self.fp32_tflops

    def attainable_tflops(self, precision: str, intensity: float | None) -> float:
        """Roofline: min(peak compute, intensity x bandwidth); ``intensity`` in FLOP per byte of memory traffic."""
        peak = self.peak_tflops(precision)
        return peak if intensity is None else min(peak, intensity * self.memory_gbps / 1000.0)


def _squash(name: str) -> str:
    text = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidia", "tesla", "amd", "instinct"):
        text = text.removeprefix(prefix)
    return text


def _family(model: GpuModel) -> str:
    """``a100-80gb`` -> ``a100``: rows of one chip differ only by the size after the dash."""
    return _squash(model.name.split("-")[0])


@dataclass(frozen=True)
class GpuCatalog:
    models: Mapping[str, GpuModel]

    def lookup(self, gpu_type: str) -> GpuModel | None:
        """The catalog row for a site's GRES type name (``v100``, ``tesla_v100``, ``a100_80gb``), or None.

        A name matches a row's name or alias, exactly or followed by a form factor and memory size
        (``a100-sxm4-80gb``); a size picks the row with that much memory.
        """
        name = _squash(gpu_type)
        if name in self._names:
            return self._names[name]
        for family in self._families:
            form = _FORM.match(name[len(family):]) if name.startswith(family) else None
            if form is None:
                continue
            rows = [m for m in self.models.values() if _family(m) == family]
            sized = [m for m in rows if form.group(2) is not None and m.memory_gb == float(form.group(2))]
            return (sized or [m for m in rows if _squash(m.name) == family] or rows)[0]
        return None

    @cached_property
    def _names(self) -> dict[str, GpuModel]:
        """Every row's squashed name and aliases (built once: priors look types up per cell)."""
        out: dict[str, GpuModel] = {}
        for model in self.models.values():
            for alias in (model.name, *model.aliases):
                out.setdefault(_squash(alias), model)
        return out

    @cached_property
    def _families(self) -> list[str]:
        return sorted({_family(m) for m in self.models.values()}, key=len, reverse=True)

    def ratio(self, gpu_type: str, reference: str, precision: str = "fp32",
              intensity: float | None = None) -> float | None:
        """Predicted speed of ``gpu_type`` over ``reference`` for one workload, or None if either is unknown."""
        target, ref = self.lookup(gpu_type), self.lookup(reference)
        if target is None or ref is None:
            return None
        if intensity is not None:
            return target.attainable_tflops(precision, intensity) / ref.attainable_tflops(precision, intensity)
        compute = target.peak_tflops(precision) / ref.peak_tflops(precision)
        return math.sqrt(compute * target.memory_gbps / ref.memory_gbps)

    def basis(self, precision: str, intensity: float | None) -> str:
        """How :meth:`ratio` was reached, for a prior's label."""
        roof = "tensor" if precision == "mixed" else "FP32"
        if intensity is not None:
            return f"roofline at {intensity:g} FLOP/B ({roof})"
        return f"geometric mean of {roof} compute and bandwidth ratios"


def _figure(row: Mapping[str, Any], key: str, place: str, optional: bool = False) -> float | None:
    value = row.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InputError(f"{key} must be a positive number, got {value!r}", place=f"{place}.{key}",
                         hint="peak figures from the vendor's datasheet")
    return float(value)


def parse_catalog(data: Any, where: str) -> GpuCatalog:
    """``{types: {name: {fp32_tflops, fp16_tflops, tensor_tflops, memory_gbps, memory_gb, source, aliases}}}``."""
    if not isinstance(data, dict) or not isinstance(data.get("types"), dict):
        raise InputError("a GPU catalog maps 'types' to rows", place=where, hint="types: {v100: {fp32_tflops: 15.7, ...}}")
    models = {}
    for name, row in data["types"].items():
        place = f"{where}:types[{name!r}]"
        if not isinstance(row, dict):
            raise InputError("a catalog row must be a mapping", place=place, hint="{fp32_tflops: 15.7, ...}")
        models[str(name).lower()] = GpuModel(
            str(name).lower(), _figure(row, "fp32_tflops", place) or 0.0, _figure(row, "fp16_tflops", place, True),
            _figure(row, "tensor_tflops", place, True), _figure(row, "memory_gbps", place) or 0.0,
            _figure(row, "memory_gb", place) or 0.0, str(row.get("source") or ""),
            tuple(str(a) for a in row.get("aliases") or ()))
    return GpuCatalog(models)


@lru_cache(maxsize=1)
def builtin() -> GpuCatalog:
    """The shipped catalog (``slurmhet/data/gpu_catalog.yaml``)."""
    text = resources.files("slurmhet").joinpath("data/gpu_catalog.yaml").read_text()
    return parse_catalog(yaml.safe_load(text), "slurmhet/data/gpu_catalog.yaml")
