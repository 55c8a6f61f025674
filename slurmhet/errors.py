"""The two failure classes every command maps to an exit code.

``InputError`` (exit 2) is the user's to fix: it carries a one-line cause, the
place (file:line:col or field) and a hint. ``SystemFailure`` (exit 1) is the
system's: Slurm down, database unreachable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import yaml


class SlurmhetError(Exception):
    exit_code = 1


class InputError(SlurmhetError):
    """Bad user input: a spec, a flag, a trace, a table, a checkpoint."""

    exit_code = 2

    def __init__(self, cause: str, *, place: str = "", hint: str = "") -> None:
        self.cause = cause
        self.place = place
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = f"{self.place}: {self.cause}" if self.place else self.cause
        text = f"{text} (hint: {self.hint})" if self.hint else text
        return " ".join(text.split()) if "\n" in text else text  # a library's multi-line message, on one line


def mark_place(mark: yaml.Mark | None, source: str | None = None) -> str:
    """The place of a YAML mark as ``file:line:column`` (1-based), the one form every bad-input error gives."""
    if mark is None:
        return source or ""
    return f"{source or mark.name}:{mark.line + 1}:{mark.column + 1}"


def yaml_error(exc: yaml.YAMLError, source: str, hint: str) -> InputError:
    """A YAML parser's complaint as an InputError at ``source:line:column`` where the parser marked one."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and (mark := exc.problem_mark or exc.context_mark) is not None:
        return InputError(f"YAML syntax error: {exc.problem or exc.context}", place=mark_place(mark, source),
                          hint=hint)
    return InputError(f"YAML error: {exc}", place=source, hint=hint)


class SystemFailure(SlurmhetError):
    """Something outside the user's input failed; the store is left as it was."""

    exit_code = 1
