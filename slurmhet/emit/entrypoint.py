"""Runs a spec's ``module:function`` entrypoint inside the job (submitit pickles this, not user code)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def call_entrypoint(entrypoint: str, args: list[Any], workdir: str) -> Any:
    """Import the user's module in the job's working directory and call the function."""
    if workdir not in sys.path:
        sys.path.insert(0, workdir)
    os.chdir(workdir)
    module_name, _, function_name = entrypoint.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return function(*args)
