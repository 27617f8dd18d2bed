"""Import a task folder's files by path for kernel tests: kernels/ holds task folders, not packages."""

import importlib.util
import os
import tomllib
from pathlib import Path
from types import ModuleType

KERNELS = Path(__file__).resolve().parent.parent / "kernels"

# Set for the whole process, not around the imports: Triton reads the flag again at first launch (when it loads
# its gluon layer), and these suites run where there is no GPU anyway.
os.environ["TRITON_INTERPRET"] = "1"


def load(task: str, name: str) -> ModuleType:
    """kernels/<task>/<name>.py as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"{task}_test_{name}", KERNELS / task / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spec(task: str) -> dict:
    """The task's task.toml as plain data."""
    return tomllib.loads((KERNELS / task / "task.toml").read_text())
