"""The one LP/MIP backend every planner uses: HiGHS (highspy), declared explicitly, quiet.

highspy 1.16 prints a two-line banner to the process's stdout (file descriptor 1, from
C++) the first time a ``Highs`` object is made, whatever ``output_flag`` or pulp's
``msg`` say; in ``slurmhet simulate --json`` or ``bench.reproduce --json`` that banner
came before the JSON and made it unparseable. The banner is printed once per process,
so :func:`highs` and :func:`pulp_highs` make the first object with descriptor 1 pointed
at /dev/null and every later one is silent by itself.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

import highspy
import pulp

_banner_lock = threading.Lock()
_banner_done = False


def _swallow_banner() -> None:
    """Make the process's first ``Highs`` object with stdout's descriptor sent to /dev/null."""
    global _banner_done
    with _banner_lock:
        if _banner_done:
            return
        sys.stdout.flush()
        libc = ctypes.CDLL(None)
        libc.fflush(None)
        saved = os.dup(1)
        sink = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(sink, 1)
            highspy.Highs()
            libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(sink)
        _banner_done = True


def highs() -> highspy.Highs:
    """A silent ``highspy.Highs`` (no banner, ``output_flag`` off)."""
    _swallow_banner()
    model = highspy.Highs()
    model.setOptionValue("output_flag", False)
    return model


def pulp_highs(**options: Any) -> pulp.HiGHS:
    """pulp's HiGHS API solver (highspy), silent; ``options`` as pulp takes them (gapRel, timeLimit...)."""
    _swallow_banner()
    return pulp.HiGHS(msg=False, **options)
