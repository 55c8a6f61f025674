"""examples/train.py loaded as a module, for the tests that call its functions in-process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def example_train() -> ModuleType:
    """A fresh copy of examples/train.py (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("slurmhet_example_train", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
