"""Why a kernel is as fast as it is: a kernel table per evaluation, Nsight Compute on request, roofline and advice.

Importing this package never imports torch: the parsers, the roofline classification, the rules and the deltas are
pure functions over plain data, so the CLI and the UI can use them anywhere. Only capture.py (run inside the
evaluator's processes) and drive.py (run under ncu) touch torch.
"""

from workbench.profiler.delta import diff
from workbench.profiler.kernels import attribute, kernel_table, per_call_ms, provenance
from workbench.profiler.roofline import classify
from workbench.profiler.rules import advise

__all__ = ["advise", "attribute", "classify", "diff", "kernel_table", "per_call_ms", "provenance"]
