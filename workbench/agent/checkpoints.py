"""Checkpoints: session.toml rewritten as a cache of the state every so many events, and when a run ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from workbench.journal.events import CheckpointWritten
from workbench.session.replay import checkpoint_record

if TYPE_CHECKING:
    from workbench.journal import Event
    from workbench.session.state import SessionState
    from workbench.session.store import SessionFiles


class Checkpoints:
    """Writes session.toml (atomically) and journals checkpoint.written; `due` says when the next one is."""

    def __init__(self, files: "SessionFiles", emit: Callable[[str, dict[str, Any]], "Event"], *, every: int,
                 last_seq: int) -> None:
        self.files = files
        self._emit = emit
        self.every = every
        """Events between two checkpoints: bounds what a resume folds after the cached state."""
        self.last_seq = last_seq
        """The seq the latest checkpoint holds (a resume starts from the one it found)."""

    def due(self, state: "SessionState") -> bool:
        """Whether `every` events have been journaled since the last checkpoint."""
        return state.last_seq - self.last_seq >= self.every

    def write(self, state: "SessionState") -> None:
        """Write session.toml as a checkpoint of the state at its current seq; journal that it was written."""
        self.files.write_checkpoint(checkpoint_record(state), seq=state.last_seq)
        self._emit("checkpoint.written", dict(CheckpointWritten(seq=state.last_seq)))
        self.last_seq = state.last_seq
