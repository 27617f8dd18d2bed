"""Crash-safe file replacement: a reader (or a restart) sees the old file or the new one, never half."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from workbench.journal.files import fsync_dir


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: temp file in the same folder, flush, fsync, os.replace, fsync folder.

    The temp file shares the folder so os.replace is a rename within one filesystem (atomic); it is
    named '.<name>.<random>.tmp' so globs for '*.json' or '*.toml' never pick it up half-written.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """write_bytes_atomic for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write strict JSON (NaN and Infinity refused, so any tool can read it) atomically.

    Raises:
        ValueError: obj is not representable as strict JSON.
    """
    try:
        text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not writable as JSON: {exc}") from None
    write_text_atomic(path, text + "\n")


def write_toml_atomic(path: Path, data: dict) -> None:
    """Write `data` as TOML atomically.

    TOML has no null, so keys whose value is None are left out at every depth (read them back with
    .get()). tomli_w is imported here, not at module load, because the GPU box running
    `workbench eval` does not have it and never writes TOML.

    Raises:
        ValueError: data holds something TOML cannot represent (None inside a list, say).
    """
    import tomli_w

    try:
        text = tomli_w.dumps(drop_none(data))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not writable as TOML: {exc}") from None
    write_text_atomic(path, text)


def drop_none(value: Any, *, in_lists: bool = False) -> Any:
    """`value` with None-valued dict keys removed at every depth: what a TOML round trip gives back.

    Args:
        value: plain data (dicts, lists, scalars); dict keys become strings, as TOML has no other kind.
        in_lists: also drop None items of lists. A derived state may lose them; a caller's own data keeps them, so
            that writing it fails loudly instead of losing a position in a list.
    """
    if isinstance(value, dict):
        return {str(k): drop_none(v, in_lists=in_lists) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_none(v, in_lists=in_lists) for v in value if v is not None or not in_lists]
    return value
