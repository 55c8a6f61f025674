"""Policies over time by key, as the CLI and the JSON name them."""

from __future__ import annotations

from typing import Callable

from slurmhet.planner.baselines import (
    FirstFit, GavelFifo, ListScheduling, RandomPlacement, SchedAllox, SchedHomo, Srtf, Tiresias, YarnCs,
)
from slurmhet.planner.default_time import SlurmhetOverTime
from slurmhet.planner.gavel import GavelMaxMinFairness
from slurmhet.planner.hadar import Hadar
from slurmhet.planner.hadare import HadarE
from slurmhet.planner.hare import Hare
from slurmhet.planner.sjf_bco import SjfBco
from slurmhet.planner.time_base import TimePolicy

PolicyFactory = Callable[..., TimePolicy]

TIME_POLICIES: dict[str, PolicyFactory] = {
    "slurmhet": SlurmhetOverTime,
    "hare": Hare,
    "hadar": Hadar,
    "hadare": HadarE,
    "gavel-fifo": GavelFifo,
    "gavel-mmf": GavelMaxMinFairness,
    "srtf": Srtf,
    "sched-homo": SchedHomo,
    "sched-allox": SchedAllox,
    "tiresias": Tiresias,
    "yarn-cs": YarnCs,
    "sjf-bco": SjfBco,
    "ff": FirstFit,
    "ls": ListScheduling,
    "rand": RandomPlacement,
}
