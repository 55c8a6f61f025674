"""Settings layers, and bad config files as one-line errors with the place."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmhet.config import load_settings
from slurmhet.errors import InputError


def test_layers_environment_wins(tmp_path: Path) -> None:
    user = tmp_path / "config.yaml"
    user.write_text("database_url: sqlite:////x.db\nslurm: {max_array_size: 50, gpu_request_style: gres}\n")
    settings = load_settings({"HOME": str(tmp_path), "SLURMHET_CONFIG": str(user)})
    assert settings.database_url == "sqlite:////x.db" and settings.slurm.max_array_size == 50
    env = {"HOME": str(tmp_path), "SLURMHET_CONFIG": str(user), "SLURMHET_DB": "postgresql+psycopg://h/db",
           "SLURMHET_STATE_DIR": str(tmp_path / "s")}
    settings = load_settings(env)
    assert settings.database_url == "postgresql+psycopg://h/db" and settings.state_dir == tmp_path / "s"


def test_a_wait_limit_in_hours_reaches_the_planner_in_seconds(tmp_path: Path) -> None:
    user = tmp_path / "config.yaml"
    assert load_settings({"HOME": str(tmp_path), "SLURMHET_CONFIG": str(user)}).max_wait_s is None
    user.write_text("max_wait_h: 48\n")
    assert load_settings({"HOME": str(tmp_path), "SLURMHET_CONFIG": str(user)}).max_wait_s == 48 * 3600.0


@pytest.mark.parametrize(("text", "words"), [
    ("databse_url: x\n", "unknown config key 'databse_url'"),
    ("- a\n", "config must be a mapping"),
    ("slurm: {max_arrays: 3}\n", "unknown key slurm.max_arrays"),
    ("slurm: {gpu_request_style: gpus}\n", "slurm.gpu_request_style 'gpus'"),
    ("slurm: [1]\n", "'slurm' must be a mapping"),
    ("a: [\n", ":2:1: YAML syntax error: expected the node content, but found '<stream end>' (hint: fix"),
    ("database_url: nonsense://x\n", ": database_url: database 'nonsense' is not one slurmhet runs on"),
    ("database_url: ':not a url'\n", ": database_url: cannot read database URL ':not a url'"),
    ("database_url: 5\n", ": database_url: database URL 5 is not a URL"),
    ("default_policy: [a]\n", ": default_policy: default_policy ['a'] is not a name"),
    ("admin_group: 7\n", ": admin_group: admin_group 7 is not a name"),
    ("state_dir: ''\n", ": state_dir: state_dir '' is not a path"),
    ("slurm: {max_array_size: many}\n", ": slurm.max_array_size: slurm.max_array_size 'many' is not a positive"),
    ("slurm: {max_submit_jobs: 0}\n", "slurm.max_submit_jobs 0 is not a positive whole number"),
    ("slurm: {command_timeout_s: .nan}\n", "slurm.command_timeout_s nan is not a positive number of seconds"),
    ("slurm: {accounting: 1}\n", "slurm.accounting 1 is not true or false"),
    ("slurm: {partition: [a, b]}\n", "slurm.partition ['a', 'b'] is not a partition name"),
    ("max_wait_h: 0\n", "max_wait_h 0 is not a positive number of hours"),
    ("max_wait_h: two days\n", "max_wait_h 'two days'"),
    ("max_wait_h: true\n", "max_wait_h True"),
])
def test_bad_config_files(tmp_path: Path, text: str, words: str) -> None:
    user = tmp_path / "config.yaml"
    user.write_text(text)
    with pytest.raises(InputError) as info:
        load_settings({"HOME": str(tmp_path), "SLURMHET_CONFIG": str(user)})
    assert words in str(info.value) and str(user) in str(info.value) and info.value.exit_code == 2
    assert "\n" not in str(info.value)  # one line, whatever the YAML parser wrote


def test_a_database_url_from_the_environment_is_checked_where_it_was_set(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_settings({"HOME": str(tmp_path), "SLURMHET_DB": "mysql://h/db"})
    assert str(info.value).startswith("SLURMHET_DB: database 'mysql' is not one slurmhet runs on (sqlite, postgresql)")
