"""Must give forbidden naming line 2: loads the task's trusted reference and calls it (HARNESS.md C5)."""
import importlib.util

import torch

_SPEC = importlib.util.spec_from_file_location("ref", "kernels/softmax/reference.py")
_REF = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_REF)


def forward(x: torch.Tensor) -> torch.Tensor:
    return _REF.forward(x).to(x.dtype)
