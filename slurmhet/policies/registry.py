"""Policies over time by key, as the CLI and the JSON name them."""

from __future__ import annotations

from typing import Callable

from slurmhet.policies.baselines import (
    FirstFit, ListScheduling, RandomPlacement, SchedAllox, SchedHomo, Srtf, Tiresias, YarnCs,
)
from slurmhet.policies.default import SlurmhetOverTime
from slurmhet.policies.gavel import GavelFifo, GavelMaxMinFairness, GavelMinTotalDuration
from slurmhet.policies.hadar import Hadar
from slurmhet.policies.hadare import HadarE
from slurmhet.policies.hare import Hare
from slurmhet.policies.sjf_bco import SjfBco
from slurmhet.policies.base import TimePolicy

PolicyFactory = Callable[..., TimePolicy]

TIME_POLICIES: dict[str, PolicyFactory] = {
    "slurmhet": SlurmhetOverTime,
    "hare": Hare,
    "hadar": Hadar,
    "hadare": HadarE,
    "gavel-fifo": GavelFifo,
    "gavel-mmf": GavelMaxMinFairness,
    "gavel-mtd": GavelMinTotalDuration,
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
