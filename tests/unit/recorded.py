"""Real Slurm outputs recorded by tests/fixtures/record.sh, one directory per Slurm series."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# Every series with a recording; the parser tests run over each of them.
SERIES = tuple(sorted(d.name.removeprefix("slurm-") for d in FIXTURES.glob("slurm-*") if (d / "job_ids.json").is_file()))


@dataclass(frozen=True)
class Recorded:
    """One series' recording: its files and the ids of the jobs record.sh submitted."""

    series: str

    @property
    def path(self) -> Path:
        return FIXTURES / f"slurm-{self.series}"

    @property
    def version(self) -> tuple[int, int]:
        major, minor = self.series.split(".")
        return int(major), int(minor)

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    @cached_property
    def ids(self) -> dict[str, int]:
        return json.loads(self.read("job_ids.json"))

    @cached_property
    def ow_ids(self) -> dict[str, int]:
        return json.loads(self.read("job_ids_openworld.json"))
