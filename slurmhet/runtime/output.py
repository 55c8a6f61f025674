"""Whole-line writes to a job's shared output file, and copies of one process's output to its own file.

A pack's members, the ranks of a job and run-pack itself write to one Slurm
output file. Under ``PYTHONUNBUFFERED`` ``print()`` hands the text and its
newline to the kernel in two write() calls, so another process's line can land
between them and two lines fuse into one. One write() per line keeps them apart.

A pack's member writes to a pipe instead, and :class:`Copier` passes its output
on to the pack's file (whole lines, one write each) and to the member's own
file, so each co-located job has logs of its own as well.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import BinaryIO, TextIO

#: Past this many bytes with no line end (a progress bar redrawn with no newline at all), a copy writes what it has.
LINE_MAX = 65536


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` and its newline in one call, then flush (stderr unless ``stream`` is given)."""
    out = sys.stderr if stream is None else stream
    out.write(line + "\n")
    out.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Copier:
    """Copies a pipe to a shared descriptor and to an own file, in a thread, until the pipe's writers close it.

    Text goes on at each line end (``\\n``, or ``\\r`` for a redrawn progress bar), so a line is never split
    between the pack's members; the own file is flushed as it goes, so a reader sees what the member wrote.
    """

    def __init__(self, pipe: BinaryIO, shared_fd: int, own: BinaryIO) -> None:
        self.pipe, self.shared_fd, self.own = pipe, shared_fd, own
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _emit(self, data: bytes) -> None:
        _write_all(self.shared_fd, data)
        try:
            self.own.write(data)
            self.own.flush()
        except (OSError, ValueError):  # a full own file, or closed after its wait: the shared one has it all
            pass

    def _run(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self.pipe.fileno(), LINE_MAX):
                pending += chunk
                cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
                if not cut and len(pending) < LINE_MAX:
                    continue
                cut = cut or len(pending)
                self._emit(pending[:cut])
                pending = pending[cut:]
            if pending:
                self._emit(pending)
        finally:
            self.pipe.close()

    def join(self, timeout_s: float) -> None:
        """Wait for the copy to end; a pipe a member's own child still holds open is left to the daemon thread."""
        self.thread.join(timeout_s)
