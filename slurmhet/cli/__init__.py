"""`slurmhet`'s command line (``slurmhet.cli:main``): one module per family of commands, each registering
its commands on the one group in :mod:`slurmhet.cli.app`."""

from slurmhet.cli import injob, jobs, planning, reporting, simulation  # noqa: F401  (they register commands)
from slurmhet.cli.app import main

__all__ = ["main"]
