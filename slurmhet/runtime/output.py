"""Whole-line writes to a job's shared output file.

A pack's members, the ranks of a job and run-pack itself write to one Slurm
output file. Under ``PYTHONUNBUFFERED`` ``print()`` hands the text and its
newline to the kernel in two write() calls, so another process's line can land
between them and two lines fuse into one. One write() per line keeps them apart.
"""
from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` and its newline in one call, then flush (stderr unless ``stream`` is given)."""
    out = sys.stderr if stream is None else stream
    out.write(line + "\n")
    out.flush()
