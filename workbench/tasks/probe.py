"""Measure a task's reference: FLOPs, bytes, dispatched ops and peak memory on the meta device; errors and
determinism on real inputs. Shared by the task scaffolds (`task new`, the importers) and `task check`."""

from __future__ import annotations

import importlib.util
import math
import signal
import sys
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from workbench.evaluator.checks import as_outputs, rel_rms
from workbench.evaluator.guards.runtime import ALLOWED_OPS


class ProbeError(Exception):
    """The reference failed in a way a person must fix; the message is one line naming the field."""


def load_file(path: Path, name: str) -> ModuleType:
    """Import one file of a task folder as a fresh module, with the folder importable while it loads."""
    folder = str(path.parent)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise ProbeError when the block runs longer than `seconds` (main thread only; a no-op elsewhere)."""
    import threading

    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise ProbeError(f"{what} took longer than {seconds:g} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def describe(exc: BaseException) -> str:
    """An exception as one short line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:240]}" if text else type(exc).__name__


class _Recorder(TorchDispatchMode):
    """Counts dispatched aten ops and tracks the bytes of live tensors the ops create (views and in-place excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.live = 0
        self.peak = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # no dynamo guard: this mode never meets torch.compile
        return False

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        out = func(*args, **(kwargs or {}))
        aliased = any(r.alias_info is not None for r in func._schema.returns)
        if not aliased:
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    nbytes = t.numel() * t.element_size()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t, self._release, nbytes)
        return out


@dataclass
class MetaStats:
    """What one call of a reference costs, measured on meta tensors (no memory, no compute)."""

    flops: float
    """From torch's FLOP counter, which counts matmul, convolution and attention ops (pointwise work counts 0)."""
    input_bytes: int
    output_bytes: int
    peak_bytes: int
    """Bytes of inputs plus the most the call's own tensors held at once."""
    ops: dict[str, int]
    """aten op name -> calls."""
    outputs: list[tuple[tuple[int, ...], str]]
    """(shape, dtype) of each output."""
    numels: list[int] = field(default_factory=list)
    """Element count of each tensor input then each output, for the byte formula."""
    elem_sizes: list[int] = field(default_factory=list)


def tensor_bytes(values: Any) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def check_outputs(value: Any, what: str) -> list[torch.Tensor]:
    """A forward's return value as a list of tensors, or ProbeError naming what is wrong with it."""
    if value is None:
        raise ProbeError(f"{what} returned nothing (None); it must return the output tensor(s)")
    outs = as_outputs(value)
    if not outs:
        raise ProbeError(f"{what} returned an empty {type(value).__name__}; it must return the output tensor(s)")
    for i, out in enumerate(outs):
        if not isinstance(out, torch.Tensor):
            which = f"output {i}" if len(outs) > 1 else "its output"
            raise ProbeError(f"{what} returned a {type(out).__name__} as {which}, not a torch.Tensor")
    return outs


def meta_run(make_inputs: Callable[..., dict], forward: Callable[..., Any], params: dict[str, Any],
             what: str) -> MetaStats:
    """Build one shape's inputs on the meta device and call `forward` on them under the FLOP counter and recorder.

    Raises:
        ProbeError: the inputs or the call fail on meta tensors, or the call returns no tensors.
    """
    try:
        inputs = make_inputs(dict(params), 0, "meta")
    except Exception as exc:  # noqa: BLE001 - a problem's own code may raise anything
        raise ProbeError(f"make_inputs failed on the meta device for {what}: {describe(exc)}") from None
    recorder = _Recorder()
    counter = FlopCounterMode(display=False)
    try:
        with counter, recorder:
            value = forward(**inputs)
    except ProbeError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _diagnose(make_inputs, forward, params, inputs, what, exc) from None
    if value is None or any(not isinstance(o, torch.Tensor) for o in as_outputs(value)):
        raise _diagnose(make_inputs, forward, params, inputs, what, None)
    outs = check_outputs(value, f"forward ({what})")
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    in_bytes = tensor_bytes(tensors)
    return MetaStats(
        flops=float(counter.get_total_flops()),
        input_bytes=in_bytes,
        output_bytes=tensor_bytes(outs),
        peak_bytes=in_bytes + recorder.peak,
        ops=recorder.ops,
        outputs=[(tuple(o.shape), str(o.dtype).removeprefix("torch.")) for o in outs],
        numels=[t.numel() for t in tensors] + [o.numel() for o in outs],
        elem_sizes=[t.element_size() for t in tensors] + [o.element_size() for o in outs],
    )


REAL_DIAGNOSE_BYTES = 1 << 29
"""Inputs up to this size are also run for real when the meta run fails, to say exactly what went wrong."""


def _diagnose(make_inputs: Callable[..., dict], forward: Callable[..., Any], params: dict[str, Any],
              meta_inputs: dict[str, Any], what: str, meta_exc: BaseException | None) -> ProbeError:
    """The error to report when the reference fails on meta tensors: its real failure where the shape is small
    enough to run, else the meta one."""
    if tensor_bytes(meta_inputs.values()) <= REAL_DIAGNOSE_BYTES:
        try:
            inputs = make_inputs(dict(params), 0, "cpu")
            with deadline(120, f"the reference on {what}"), torch.no_grad():
                value = forward(**inputs)
        except ProbeError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001
            return ProbeError(f"the reference raised {describe(exc)} on {what}")
        try:
            check_outputs(value, f"the reference ({what})")
        except ProbeError as exc:
            return exc
    if meta_exc is None:
        return ProbeError(f"the reference returns no tensor on meta inputs ({what})")
    return ProbeError(f"the reference cannot run on the meta device, where shapes are sized ({what}): "
                      f"{describe(meta_exc)} (data-dependent ops such as .item() or nonzero() are not supported)")


def compute_ops(ops: dict[str, int]) -> list[str]:
    """The aten ops among `ops` that compute (everything but the allocation, view and copy ops a candidate may use)."""
    return sorted(op for op in ops if op not in ALLOWED_OPS)


_ALIASES = {
    "convolution": ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"],
    "addmm": ["linear", "matmul", "mm"],
    "mm": ["matmul", "linear"],
    "bmm": ["matmul"],
    "baddbmm": ["matmul"],
    "_softmax": ["softmax"],
    "_log_softmax": ["log_softmax"],
    "native_layer_norm": ["layer_norm"],
    "native_group_norm": ["group_norm"],
    "native_batch_norm": ["batch_norm"],
    "_native_batch_norm_legit": ["batch_norm"],
    "_native_batch_norm_legit_functional": ["batch_norm"],
    "_native_batch_norm_legit_no_training": ["batch_norm"],
    "_scaled_dot_product_flash_attention": ["scaled_dot_product_attention"],
    "_scaled_dot_product_efficient_attention": ["scaled_dot_product_attention"],
    "_scaled_dot_product_flash_attention_for_cpu": ["scaled_dot_product_attention"],
    "max_pool2d_with_indices": ["max_pool2d"],
    "max_pool3d_with_indices": ["max_pool3d"],
    "_adaptive_avg_pool2d": ["adaptive_avg_pool2d"],
    "_adaptive_avg_pool3d": ["adaptive_avg_pool3d"],
}
"""aten names whose Python spelling differs: what a candidate would write to reach the same kernel."""

ALWAYS_FORBIDDEN = ("matmul", "mm", "bmm", "einsum", "scaled_dot_product_attention")
"""Library compute every generated task forbids, whatever the reference dispatches."""


def _python_methods() -> set[str]:
    names: set[str] = set()
    for kind in (list, dict, str):
        names.update(n for n in dir(kind) if not n.startswith("_"))
    return names


def forbidden_names(ops: list[str]) -> list[str]:
    """The torch names task.toml's forbidden.torch_ops lists for a set of compute aten ops.

    The static guard matches these names as torch.X, torch.nn.functional.X and tensor methods .X(), so names that
    are also methods of Python's own types (index, sort, count, ...) are left out: they would flag ordinary launcher
    code, and the evaluator's run-time op check refuses every aten compute op anyway.
    """
    avoid = _python_methods()
    names: set[str] = set(ALWAYS_FORBIDDEN)
    for op in ops:
        spelled = _ALIASES.get(op)
        if spelled is None:
            base = op.lstrip("_").removeprefix("native_").removesuffix("_with_indices").removesuffix("_forward")
            spelled = [base]
        names.update(spelled)
    return sorted(n for n in names if n and n not in avoid and n.isidentifier())


def real_outputs(forward: Callable[..., Any], inputs: dict[str, Any], what: str, timeout_s: float) -> list[torch.Tensor]:
    """Call forward on (cloned) real inputs; ProbeError with one line when it raises, hangs or returns no tensors."""
    cloned = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    try:
        with deadline(timeout_s, what), torch.no_grad():
            value = forward(**cloned)
    except ProbeError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ProbeError(f"{what} raised {describe(exc)}") from None
    return [o.detach() for o in check_outputs(value, what)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """0.0 when two output lists are bit-identical, else their worst rel_rms (inf for a shape or dtype change)."""
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return math.inf
        if torch.equal(x, y) or (x.is_floating_point() and torch.equal(x.isnan(), y.isnan()) and
                                 torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))):
            continue
        worst = max(worst, rel_rms(x, y))
    return worst


def memory_bytes(stats: MetaStats, oracle: MetaStats | None, seeds: int = 3) -> int:
    """Device memory one evaluation of a shape needs, estimated: the trusted side keeps `seeds` input sets with their
    expected outputs, and computes the oracle (its own peak) and the baseline."""
    oracle_peak = oracle.peak_bytes if oracle is not None else 2 * stats.peak_bytes
    return seeds * (stats.input_bytes + stats.output_bytes) + max(oracle_peak, stats.peak_bytes)


def available_memory(device: str) -> int:
    """Bytes free on `device`: the GPU's free memory, or the machine's available RAM for the CPU."""
    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**26 else f"{nbytes / 2**20:.3g} MiB"


DTYPE_EPS = {"float64": 2.2e-16, "float32": 1.19e-7, "float16": 9.77e-4, "bfloat16": 7.81e-3,
             "float8_e4m3fn": 0.125, "float8_e5m2": 0.25}
"""Machine epsilon per floating output dtype."""
EXACT_EPS = 5e-10
"""What integer and boolean outputs get instead: they must match the oracle exactly, give or take a tie."""


def eps_of(dtype: str) -> float:
    return DTYPE_EPS.get(dtype, EXACT_EPS)
