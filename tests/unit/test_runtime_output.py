"""Copies of a pack member's output: whole lines into the pack's shared file, everything into its own."""

from __future__ import annotations

import os
import time
from pathlib import Path

from slurmhet.runtime.output import LINE_MAX, Copier


def _copier(tmp_path: Path) -> tuple[int, Copier, int, Path, Path]:
    """A pipe whose write end the test holds, copied to a shared file (fd) and to an own file."""
    read_end, write_end = os.pipe()
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared_fd = os.open(shared, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    copier = Copier(os.fdopen(read_end, "rb", buffering=0), shared_fd, own.open("ab"))
    return write_end, copier, shared_fd, shared, own


def test_a_line_written_in_two_parts_is_never_split_by_another_members_line(tmp_path: Path) -> None:
    write_end, copier, shared_fd, shared, own = _copier(tmp_path)
    os.write(write_end, b"a-err ")
    time.sleep(0.3)  # the copy has read the first part by now
    os.write(shared_fd, b"b-err 1\n")  # another member's whole line lands in between
    os.write(write_end, b"1\n")
    os.close(write_end)
    copier.join(10)
    copier.own.close()
    os.close(shared_fd)
    assert shared.read_bytes() == b"b-err 1\na-err 1\n"
    assert own.read_bytes() == b"a-err 1\n"


def test_a_redrawn_progress_bar_and_a_newline_free_flood_go_on_without_waiting_for_a_newline(tmp_path: Path) -> None:
    write_end, copier, shared_fd, shared, own = _copier(tmp_path)
    os.write(write_end, b"10%\r20%\r")
    deadline = time.monotonic() + 10
    while shared.read_bytes() != b"10%\r20%\r":  # at its carriage return, not at the end of the run
        assert time.monotonic() < deadline, shared.read_bytes()
        time.sleep(0.05)
    flood = b"x" * (LINE_MAX + 10)
    os.write(write_end, flood)
    deadline = time.monotonic() + 10
    while len(shared.read_bytes()) < 8 + LINE_MAX:  # a line longer than LINE_MAX is passed on in pieces
        assert time.monotonic() < deadline, len(shared.read_bytes())
        time.sleep(0.05)
    os.write(write_end, b"tail with no newline")
    os.close(write_end)
    copier.join(10)
    copier.own.close()
    os.close(shared_fd)
    assert shared.read_bytes() == own.read_bytes() == b"10%\r20%\r" + flood + b"tail with no newline"
