"""Python entrypoints the real-cluster tests submit (``entrypoint: tests.cluster.entry_targets:add``)."""

from __future__ import annotations


def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


def boom() -> None:
    raise ValueError("boom from the entrypoint")
