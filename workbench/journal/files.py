"""Two file habits the journal and the session store share: a durable folder entry, and close-on-exit."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any


def fsync_dir(folder: Path) -> None:
    """Make renames and new entries in `folder` durable; a new or renamed file is not, until its folder is synced."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Closing:
    """A context manager that closes its object on the way out (the object defines an idempotent close())."""

    def close(self) -> None:
        """Release what the object holds."""
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
