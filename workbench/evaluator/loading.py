"""Import a Python file as a module under a given name: the task's reference and baseline, and the candidate.

One importer for the trusted process, the candidate worker and the profiler's driver. It is split in two steps
because the worker needs the module object even when running it fails: a Triton compile error raised at import is
mapped to its kernel's lines through the module's @triton.jit functions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def new_module(path: str | Path, name: str) -> ModuleType:
    """A module for the file at path, registered in sys.modules under name, not yet run.

    Raises:
        ImportError: the path cannot be loaded as Python source.
    """
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    return module


def run_module(module: ModuleType) -> ModuleType:
    """Execute a module made by new_module (whatever it raises propagates)."""
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(module)
    return module


def import_file(path: str | Path, name: str) -> ModuleType:
    """Import the file at path as module `name` (registered in sys.modules)."""
    return run_module(new_module(path, name))
