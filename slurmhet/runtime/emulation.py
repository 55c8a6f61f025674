"""Emulated GPU speed for the CPU-only dev cluster (``SLURMHET_EMULATE_THROUGHPUT=1``).

On the dev cluster every "GPU" is a CPU slice, so every job would run at the
same speed and the planner's heterogeneity would be invisible in sacct. With
emulation on, the example workload sleeps so that each rank delivers the
samples/s that the throughput table gives for its node's GPU type. Anything
measured this way is labelled as emulated (progress records, logs). This
module is the only place that knows about it; production runs never pace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from slurmhet.errors import InputError

#: The dev cluster's table (etc/throughput/devcluster.yaml) used when the job's
#: environment names none, so the pace matches what the planner predicted.
DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "etc" / "throughput" / "devcluster.yaml"


def table_rate(table_path: Path, model: str, gpu_type: str) -> float:
    """The throughput table's per-GPU samples/s for ``model`` on ``gpu_type`` (any batch size row)."""
    from slurmhet.throughput import canonical_model, load_tables, split_key

    table = load_tables([table_path])
    rows = sorted((w, e.value) for (w, t), e in table.entries.items()
                  if t == gpu_type and canonical_model(split_key(w)[0]) == canonical_model(model))
    if not rows:
        raise InputError(f"no throughput for model {model!r} on GPU type {gpu_type!r} in {table_path}",
                         place="emulation", hint="add the model to the throughput table or set "
                         "SLURMHET_EMULATED_SAMPLES_PER_S")
    return rows[0][1]


def enabled(env: Mapping[str, str]) -> bool:
    return env.get("SLURMHET_EMULATE_THROUGHPUT", "").strip().lower() in ("1", "true", "yes", "on")


def parse_node_map(text: str) -> dict[str, str]:
    """``nodea=v100,nodeb=t4`` -> {node: gpu type}."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        node, sep, gpu = part.partition("=")
        if not sep or not node.strip() or not gpu.strip():
            raise InputError(f"bad entry {part!r} in SLURMHET_NODE_GPU_TYPES", place="SLURMHET_NODE_GPU_TYPES",
                             hint="nodea=v100,nodeb=t4,nodec=k80")
        out[node.strip()] = gpu.strip().lower()
    return out


def node_gpu_type(env: Mapping[str, str]) -> str | None:
    """This node's GPU type: the SPANK-exported ``SLURMHET_GPU_TYPE``, else ``SLURMD_NODENAME``
    looked up in ``SLURMHET_NODE_GPU_TYPES`` or in the inventory file ``SLURMHET_INVENTORY``."""
    if env.get("SLURMHET_GPU_TYPE"):
        return env["SLURMHET_GPU_TYPE"].strip().lower()
    node = env.get("SLURMD_NODENAME", "")
    if not node:
        return None
    if env.get("SLURMHET_NODE_GPU_TYPES"):
        mapped = parse_node_map(env["SLURMHET_NODE_GPU_TYPES"]).get(node)
        if mapped:
            return mapped
    if env.get("SLURMHET_INVENTORY"):
        from slurmhet.cluster import load_inventory_yaml

        try:
            gpus = load_inventory_yaml(Path(env["SLURMHET_INVENTORY"])).node(node).gpus
        except KeyError:
            return None
        types = [t for t, n in gpus.items() if n > 0]
        return types[0] if len(types) == 1 else None
    return None


def emulated_samples_per_s(env: Mapping[str, str], model: str, gpu_type: str | None) -> float:
    """Target rate: ``SLURMHET_EMULATED_SAMPLES_PER_S`` if set, else the throughput table's value for the job's
    workload (``SLURMHET_WORKLOAD``, else ``model``): ``SLURMHET_EMULATION_TABLE`` (a "true" speed the planner
    does not know, to test profiling), else the planner's own table.

    Under an MPS pack the member gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` percent
    of the GPU's rate, so co-location costs something in emulation too.
    """
    if env.get("SLURMHET_EMULATED_SAMPLES_PER_S"):
        try:
            rate = float(env["SLURMHET_EMULATED_SAMPLES_PER_S"])
        except ValueError:
            rate = -1.0
        if not rate > 0:
            raise InputError("SLURMHET_EMULATED_SAMPLES_PER_S must be a positive number",
                             place="SLURMHET_EMULATED_SAMPLES_PER_S", hint="e.g. 800")
    else:
        if not gpu_type:
            raise InputError("no GPU type known for this node", place="emulation",
                             hint="set SLURMHET_GPU_TYPE or SLURMHET_NODE_GPU_TYPES=nodea=v100,...")
        if env.get("SLURMHET_WORKLOAD"):  # the planner's key, exported by every emitted script
            from slurmhet.throughput import split_key

            model = split_key(env["SLURMHET_WORKLOAD"])[0]
        table = env.get("SLURMHET_EMULATION_TABLE") or env.get("SLURMHET_THROUGHPUT_TABLE") or DEFAULT_TABLE
        rate = table_rate(Path(table), model, gpu_type)
    share = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if share:
        rate *= min(100.0, max(1.0, float(share))) / 100.0
    return rate


@dataclass
class StepPacer:
    """Sleeps after each step so that the run's cumulative rate does not exceed ``samples_per_s``.

    Pacing on the cumulative count (not per step) absorbs jitter: a slow step is
    followed by a shorter sleep instead of drifting below the target.
    """

    samples_per_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _start: float | None = None
    _samples: int = 0

    def step(self, samples: int) -> None:
        if self._start is None:
            self._start = self.clock()
        self._samples += samples
        due = self._start + self._samples / self.samples_per_s
        wait = due - self.clock()
        if wait > 0:
            self.sleep(wait)
