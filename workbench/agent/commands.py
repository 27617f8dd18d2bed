"""Commands the person sends to a running agent; the runtime drains them at step boundaries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CommandKind = Literal["nudge", "pause", "resume", "revoke", "profile"]

REVOKE_PREFIX = "/revoke "
"""A nudge whose text starts with this revokes the persistent nudge named after it (the inbox carries only text)."""


@dataclass(frozen=True)
class Command:
    """One instruction from the UI (or the inbox); never applied mid-tool-call.

    For ``revoke``, ``text`` is the id of the persistent nudge to withdraw (a unique prefix is enough).
    """

    kind: CommandKind
    text: str = ""
    persistent: bool = False
