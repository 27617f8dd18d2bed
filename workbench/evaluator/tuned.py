"""A baseline's autotuning choices, recorded once per GPU model and replayed by every trusted process.

A library baseline such as FLA autotunes each kernel on its first call for each new key, and on a machine that has
never run it that means compiling and benchmarking every config of every kernel: most of a fresh machine's first
KDA evaluation. The choices depend on the GPU model and on the library's and Triton's versions, not on the machine,
so `workbench task check TASK --device cuda --save-choices` records them after a real autotuning run into the task
folder (`tuned/<gpu>.json`), and the trusted processes (the evaluation service, the precompile processes) put them
into the autotuners' caches before the first call. A choice is replayed only when the GPU name, Triton's version and
the library's version all match what recorded it, and only if it is one of the configs that autotuner itself
offers; any other key autotunes as before. The file is not part of the task hash: it changes how fast the baseline
gets ready, not what it computes, and it holds the configs the library's own autotuning picked on that GPU model.
Only trusted code runs here.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator, TypedDict

VERSION = 1
"""Bumped when the file's layout changes; a file of another version is ignored."""
FOLDER = "tuned"
"""The folder of a task that holds one file per GPU model."""
_SKIP = ("workbench", "triton", "torch")
"""Packages whose autotuners are not a baseline's (ours, and the frameworks')."""


class ConfigRecord(TypedDict):
    """One Triton config as the file keeps it."""

    kwargs: dict[str, Any]
    num_warps: int
    num_stages: int
    num_ctas: int
    maxnreg: int | None


class ChoicesFile(TypedDict):
    """tuned/<gpu>.json: what recorded the choices, and per autotuned kernel its key -> chosen config."""

    version: int
    gpu: str
    triton: str
    libraries: dict[str, str]
    """Top-level package -> its __version__, for every package whose kernels have choices here."""
    choices: dict[str, dict[str, ConfigRecord]]
    """Kernel ("module.function") -> repr of the autotuner's cache key -> config."""


def gpu_slug(name: str) -> str:
    """A file name for a GPU model: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def path_for(task_dir: Path | str, gpu: str) -> Path:
    """Where a task keeps the choices for a GPU model."""
    return Path(task_dir) / FOLDER / f"{gpu_slug(gpu)}.json"


def autotuners(modules: list[str] | None = None) -> Iterator[tuple[str, Any]]:
    """("module.function", Autotuner) for every Triton autotuner held by these modules (default: every imported
    module outside workbench, Triton and torch), under heuristics wrappers too."""
    from triton.runtime.autotuner import Autotuner

    names = sorted(sys.modules) if modules is None else sorted(modules)
    seen: set[int] = set()
    for name in names:
        if name.split(".")[0] in _SKIP:
            continue
        module = sys.modules.get(name)
        if module is None:
            continue
        for value in list(vars(module).values()):
            value = _unwrap(value, Autotuner)
            if value is not None and id(value) not in seen:
                seen.add(id(value))
                fn = value.base_fn
                yield f"{fn.__module__}.{fn.__name__}", value


def _unwrap(value: Any, autotuner: type) -> Any:
    """The autotuner a module attribute is or wraps (triton.heuristics keeps it as .fn), else None."""
    from triton.runtime.autotuner import Heuristics

    for _ in range(4):
        if isinstance(value, autotuner):
            return value
        if not isinstance(value, Heuristics):
            return None
        value = value.fn
    return None


def _config_record(config: Any) -> ConfigRecord:
    return {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages,
            "num_ctas": config.num_ctas, "maxnreg": config.maxnreg}


def _library_versions(kernels: list[str]) -> dict[str, str]:
    versions = {}
    for kernel in kernels:
        package = kernel.split(".")[0]
        version = getattr(sys.modules.get(package), "__version__", None)
        versions[package] = str(version) if version is not None else "unknown"
    return versions


def record(gpu: str, modules: list[str] | None = None) -> ChoicesFile:
    """The choices the autotuners of these modules hold now (call it after the baseline ran on every shape)."""
    import triton

    choices: dict[str, dict[str, ConfigRecord]] = {}
    for kernel, tuner in autotuners(modules):
        entries = {}
        for key, config in tuner.cache.items():
            text = repr(key)
            try:
                if ast.literal_eval(text) != key:
                    continue
            except (ValueError, SyntaxError):
                continue  # a key that does not survive the file (not a plain literal): it autotunes again
            entries[text] = _config_record(config)
        if entries:
            choices[kernel] = entries
    return {"version": VERSION, "gpu": gpu, "triton": triton.__version__,
            "libraries": _library_versions(list(choices)), "choices": choices}


def write(path: Path, table: ChoicesFile) -> None:
    """Write the file atomically (a check killed mid-write leaves the previous file, not half of one)."""
    from workbench.session.atomic import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(table, indent=1, sort_keys=True) + "\n")


class Replay(TypedDict):
    """What apply did, for the evaluation's phase information."""

    file: str
    applied: int
    """Cache entries put into autotuners."""
    skipped: str
    """Why the file was not used, or "" when it was."""


def load(path: Path, gpu: str) -> tuple[ChoicesFile | None, str]:
    """The file's choices if they were recorded for this GPU model and these versions, else (None, why not)."""
    import triton

    if not path.is_file():
        return None, f"no {path.name} for {gpu}"
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(table, dict) or table.get("version") != VERSION:
            return None, f"{path.name} is not a version-{VERSION} choices file"
        if table.get("gpu") != gpu:
            return None, f"{path.name} was recorded on {table.get('gpu')}, this GPU is {gpu}"
        if table.get("triton") != triton.__version__:
            return None, f"{path.name} was recorded with Triton {table.get('triton')}, this is {triton.__version__}"
        for package, version in dict(table.get("libraries", {})).items():
            have = getattr(sys.modules.get(package), "__version__", None)
            if have is not None and str(have) != version:
                return None, f"{path.name} was recorded with {package} {version}, this is {have}"
        return table, ""
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        return None, f"{path.name} cannot be read: {type(exc).__name__}: {exc}"[:200]


def apply(table: ChoicesFile, modules: list[str] | None = None) -> int:
    """Put the table's choices into the matching autotuners' caches; returns how many entries it put.

    An entry is used only if its config is one the autotuner offers (same kwargs, warps, stages, CTAs, registers),
    so a changed library cannot be handed a config it does not have; a key the autotuner already holds is left.
    """
    applied = 0
    choices = table.get("choices", {})
    for kernel, tuner in autotuners(modules):
        entries = choices.get(kernel)
        if not entries:
            continue
        offered = {json.dumps(_config_record(c), sort_keys=True): c for c in tuner.configs}
        for text, wanted in entries.items():
            try:
                key = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                continue
            config = offered.get(json.dumps(wanted, sort_keys=True))
            if config is not None and key not in tuner.cache:
                tuner.cache[key] = config
                applied += 1
    return applied


def replay(task_dir: Path | str, gpu: str, modules: list[str] | None = None) -> Replay:
    """Load the task's file for this GPU and apply it (see load and apply)."""
    path = path_for(task_dir, gpu)
    table, why = load(path, gpu)
    if table is None:
        return {"file": str(path), "applied": 0, "skipped": why}
    return {"file": str(path), "applied": apply(table, modules), "skipped": ""}
