"""Expand Slurm hostlist expressions (``nodea,node[b-c]``, ``gpu[01-03,05]``) without ``scontrol``.

The launcher runs inside every task; calling ``scontrol show hostnames`` there
would hit the controller once per rank, so the grammar is parsed here instead.
"""

from __future__ import annotations

from slurmhet.errors import InputError


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise InputError(f"nested '[' in hostlist {text!r}", place="hostlist", hint="e.g. gpu[01-03,05]")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"unbalanced ']' in hostlist {text!r}", place="hostlist", hint="e.g. gpu[01-03,05]")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise InputError(f"unbalanced '[' in hostlist {text!r}", place="hostlist", hint="e.g. gpu[01-03,05]")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range(item: str, whole: str) -> list[str]:
    """``01-03`` -> ``01 02 03`` keeping the zero padding; ``a-c`` -> ``a b c`` (single letters)."""
    low, sep, high = item.partition("-")
    if not sep:
        if not low:
            raise InputError(f"empty range in hostlist {whole!r}", place="hostlist", hint="e.g. gpu[01-03,05]")
        return [low]
    if low.isdigit() and high.isdigit():
        lo, hi = int(low), int(high)
        if hi < lo:
            raise InputError(f"descending range {item!r} in hostlist {whole!r}", place="hostlist", hint="write low-high")
        width = len(low) if low.startswith("0") or len(low) == len(high) else 0
        return [str(n).zfill(width) for n in range(lo, hi + 1)]
    if len(low) == 1 and len(high) == 1 and low.isalpha() and high.isalpha() and low <= high:
        return [chr(c) for c in range(ord(low), ord(high) + 1)]
    raise InputError(f"cannot read range {item!r} in hostlist {whole!r}", place="hostlist", hint="e.g. gpu[01-03,05]")


def _expand_one(pattern: str, whole: str) -> list[str]:
    """Expand one comma-free host pattern, which may hold several bracket groups (``r[1-2]n[1-2]``)."""
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.index("]", open_at)
    prefix, body, rest = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    values = [v for item in body.split(",") for v in _expand_range(item.strip(), whole)]
    tails = _expand_one(rest, whole)
    return [prefix + v + t for v in values for t in tails]


def expand_hostlist(text: str) -> list[str]:
    """Return the host names of a Slurm hostlist expression, in Slurm's order, duplicates kept."""
    return [host for part in _split_top_level(text.strip()) for host in _expand_one(part, text)]
