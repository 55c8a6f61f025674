"""One typed settings object: defaults < /etc/slurmhet/config.yaml < user file < environment < CLI.

Sites set the database, admin group and Slurm overrides once in /etc; users may
point at their own database or state directory; tests use the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from slurmhet.errors import InputError, yaml_error

SYSTEM_CONFIG = Path("/etc/slurmhet/config.yaml")


def _xdg_state_home(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "state")
    return Path(base) / "slurmhet"


@dataclass(frozen=True)
class SlurmOverrides:
    """Values that replace what the site profile probes (for sites where probing lies)."""

    gpu_request_style: str | None = None  # "gres" or "gpus-per-node"
    max_array_size: int | None = None
    max_submit_jobs: int | None = None
    accounting: bool | None = None
    partition: str | None = None
    command_timeout_s: float = 30.0
    container_runtime: str | None = None  # "pyxis", "apptainer", "singularity" or "none"


@dataclass(frozen=True)
class Settings:
    state_dir: Path
    database_url: str
    throughput_table: Path | None = None
    admin_group: str | None = None
    default_policy: str = "slurmhet"
    #: A pending job that has waited this many hours goes ahead of all others, the GPUs it may use are
    #: kept for it as they free up, and it is queued in Slurm (None: the planner's order alone, which can
    #: starve a wide job).
    max_wait_h: float | None = None
    slurm: SlurmOverrides = field(default_factory=SlurmOverrides)

    @property
    def max_wait_s(self) -> float | None:
        return None if self.max_wait_h is None else 3600.0 * self.max_wait_h

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def progress_dir(self) -> Path:
        return self.state_dir / "progress"


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise yaml_error(exc, str(path), "fix or remove the file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read config: {exc}", place=str(path), hint="fix or remove the file") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError("config must be a mapping", place=str(path), hint="database_url: sqlite:///...")
    return data


def _apply(settings: Settings, data: Mapping[str, Any], source: str) -> Settings:
    known = {f.name for f in fields(Settings)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise InputError(f"unknown config key {key!r}", place=source, hint="known: " + ", ".join(sorted(known)))
        if key == "slurm":
            if not isinstance(value, dict):
                raise InputError("'slurm' must be a mapping", place=source, hint="slurm: {max_array_size: 1000}")
            slurm_known = {f.name for f in fields(SlurmOverrides)}
            bad = [k for k in value if k not in slurm_known]
            if bad:
                raise InputError(f"unknown key slurm.{bad[0]}", place=source, hint="known: " + ", ".join(sorted(slurm_known)))
            style = value.get("gpu_request_style")
            if style not in (None, "gres", "gpus-per-node"):
                raise InputError(f"slurm.gpu_request_style {style!r}", place=source, hint="gres | gpus-per-node")
            runtime = value.get("container_runtime")
            if runtime not in (None, "pyxis", "apptainer", "singularity", "none"):
                raise InputError(f"slurm.container_runtime {runtime!r}", place=source,
                                 hint="pyxis | apptainer | singularity | none")
            _check_overrides(value, source)
            changes["slurm"] = replace(settings.slurm, **value)
        elif key == "max_wait_h":
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise InputError(f"max_wait_h {value!r} is not a positive number of hours", place=source,
                                 hint="max_wait_h: 48 (or leave it out)")
            changes[key] = None if value is None else float(value)
        elif key in ("state_dir", "throughput_table"):
            if not (isinstance(value, str) and value) and not (key == "throughput_table" and value is None):
                raise InputError(f"{key} {value!r} is not a path", place=f"{source}: {key}", hint=f"{key}: /some/path")
            changes[key] = Path(value).expanduser() if value is not None else None
        elif key == "database_url":
            changes[key] = database_url(value, f"{source}: database_url")
        else:  # admin_group, default_policy (its key is checked against the planners where a command plans)
            if not (isinstance(value, str) and value) and not (key == "admin_group" and value is None):
                raise InputError(f"{key} {value!r} is not a name", place=f"{source}: {key}",
                                 hint=f"{key}: {'slurmhet' if key == 'default_policy' else 'hpcadmins'}")
            changes[key] = value
    return replace(settings, **changes)


#: The stores slurmhet runs on (``store.db``): the embedded default and the shared server.
DATABASE_BACKENDS = ("sqlite", "postgresql")


def database_url(value: Any, place: str) -> str:
    """A database URL slurmhet can open, refused here, where it was written, rather than when a command opens it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    hint = "sqlite:////path/to/slurmhet.db or postgresql+psycopg://user@host/db"
    if not isinstance(value, str) or not value:
        raise InputError(f"database URL {value!r} is not a URL", place=place, hint=hint)
    try:
        backend = make_url(value).get_backend_name()
    except ArgumentError:
        raise InputError(f"cannot read database URL {value!r}", place=place, hint=hint) from None
    if backend not in DATABASE_BACKENDS:
        raise InputError(f"database {backend!r} is not one slurmhet runs on ({', '.join(DATABASE_BACKENDS)})",
                         place=place, hint=hint)
    return value


def _check_overrides(value: Mapping[str, Any], source: str) -> None:
    """The types of ``slurm:`` overrides, whose values replace what the site profile probes."""
    for key in ("max_array_size", "max_submit_jobs"):
        got = value.get(key)
        if got is not None and (isinstance(got, bool) or not isinstance(got, int) or got < 1):
            raise InputError(f"slurm.{key} {got!r} is not a positive whole number", place=f"{source}: slurm.{key}",
                             hint=f"slurm: {{{key}: 1000}}")
    timeout = value.get("command_timeout_s", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise InputError(f"slurm.command_timeout_s {timeout!r} is not a positive number of seconds",
                         place=f"{source}: slurm.command_timeout_s", hint="slurm: {command_timeout_s: 30}")
    if value.get("accounting") is not None and not isinstance(value["accounting"], bool):
        raise InputError(f"slurm.accounting {value['accounting']!r} is not true or false",
                         place=f"{source}: slurm.accounting", hint="slurm: {accounting: false}")
    if not isinstance(value.get("partition") or "", str):
        raise InputError(f"slurm.partition {value['partition']!r} is not a partition name",
                         place=f"{source}: slurm.partition", hint="slurm: {partition: gpu}")


def load_settings(env: Mapping[str, str] | None = None, user_file: Path | None = None) -> Settings:
    """Resolve settings from every layer; the last layer to set a value wins."""
    env = os.environ if env is None else env
    state = Path(env["SLURMHET_STATE_DIR"]) if env.get("SLURMHET_STATE_DIR") else _xdg_state_home(env)
    settings = Settings(state_dir=state, database_url=f"sqlite:///{state / 'slurmhet.db'}")
    settings = _apply(settings, _read_file(SYSTEM_CONFIG), str(SYSTEM_CONFIG))
    user = user_file or (Path(env["SLURMHET_CONFIG"]) if env.get("SLURMHET_CONFIG") else
                         Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config") / "slurmhet" / "config.yaml")
    user_data = _read_file(Path(user))
    settings = _apply(settings, user_data, str(user))
    if env.get("SLURMHET_STATE_DIR"):
        settings = replace(settings, state_dir=Path(env["SLURMHET_STATE_DIR"]))
        if "database_url" not in user_data and not env.get("SLURMHET_DB"):
            settings = replace(settings, database_url=f"sqlite:///{settings.state_dir / 'slurmhet.db'}")
    if env.get("SLURMHET_DB"):
        settings = replace(settings, database_url=database_url(env["SLURMHET_DB"], "SLURMHET_DB"))
    if env.get("SLURMHET_THROUGHPUT_TABLE"):
        settings = replace(settings, throughput_table=Path(env["SLURMHET_THROUGHPUT_TABLE"]))
    return settings
