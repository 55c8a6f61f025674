"""Jinja2 rendering of sbatch scripts, with shell quoting as the only way values enter a script."""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jinja2

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


def shell_quote(value: Any) -> str:
    """Quote one word for bash; every spec value passes through this."""
    return shlex.quote(str(value))


def shell_words(values: Iterable[Any]) -> str:
    return " ".join(shell_quote(v) for v in values)


def comment_safe(value: Any) -> str:
    """Text for a ``#`` comment line: control characters (newlines) become spaces."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))


def slurm_job_name(name: str) -> str:
    """Slurm job names are shown in squeue/sacct columns: keep a safe, short form (the store keeps the full name)."""
    safe = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_")
    return (safe or "job")[:64]


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["words"] = shell_words
    env.filters["comment"] = comment_safe
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
