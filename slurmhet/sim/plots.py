"""PNG plots of a simulation: JCT CDF per policy and busy GPUs over time."""

from __future__ import annotations

from pathlib import Path

from slurmhet.errors import InputError
from slurmhet.sim.metrics import SimReport


def write_plots(report: SimReport, directory: Path | str) -> list[Path]:
    """Write ``jct_cdf.png`` and ``utilization.png`` into ``directory``; returns their paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InputError("plots need matplotlib", place="--plot", hint="pip install 'slurmhet[plot]'") from exc
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in report.runs.items():
        jcts = sorted(r.finish - r.arrival for r in run.records)
        ax.step([j / 3600 for j in jcts], [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=name)
    # JCTs span minutes to weeks (the generator's long jobs, a type-blind policy's job stuck on a K80):
    # a log axis keeps the short jobs, most of the CDF, readable.
    ax.set_xscale("log")
    ax.set(xlabel="JCT (hours, log scale)", ylabel="fraction of jobs", title="JCT CDF")
    ax.legend(fontsize="small")
    cdf = out / "jct_cdf.png"
    fig.savefig(cdf, dpi=100, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in report.runs.items():
        xs, ys = [], []
        for start, end, busy in run.busy:
            xs += [start / 3600, end / 3600]
            ys += [busy / run.total_gpus] * 2
        ax.plot(xs, ys, label=name, linewidth=0.8)
    ax.set(xlabel="time (hours)", ylabel="allocated GPUs / all GPUs", title="Utilisation over time", ylim=(0, 1.05))
    ax.legend(fontsize="small")
    util = out / "utilization.png"
    fig.savefig(util, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [cdf, util]
