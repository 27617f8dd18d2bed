"""The evaluation service's pipes: messages up to its owner, requests to the current candidate process.

Every step announces itself to the owner before it starts, with its time limit and whose step it is: a candidate
step that runs past its limit is the candidate's timeout (the owner kills the candidate process), a trusted step
that does is a fault of the service (the owner restarts it). While the candidate runs a request it may report a
Triton compile starting and ending; the channel turns those into a compile-sized limit and back.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from workbench.evaluator import limits, wire

MAX_REPLY = 1 << 28
"""A reply frame larger than this is a candidate process misbehaving."""


class WorkerLost(Exception):
    """The candidate process closed its pipe or sent garbage: it died, or it is not playing by the protocol."""


class Channel:
    """The service's end of its pipes. Thread-safe for tell() (the environment thread reports beside the main one)."""

    def __init__(self, fd_parent: int) -> None:
        self.fd_parent = fd_parent
        self._lock = threading.Lock()
        self.stage: dict[str, Any] = {"stage": "idle"}
        """The step under way, as last announced (its name, whose it is, where: shape and seed)."""
        self.eval_id: int | None = None
        """The evaluation being served (stamped on every message), None while idle."""
        self.worker_out: int | None = None
        self.worker_in: int | None = None
        self.compiles: list[dict[str, Any]] = []
        """Compiles the candidate process reported during this evaluation (kernel, seconds)."""

    def tell(self, msg: dict[str, Any]) -> None:
        """Send one JSON message to the owner."""
        with self._lock:
            wire.write_frame(self.fd_parent, wire.dump_json({**msg, "eval": self.eval_id}))

    def announce(self, stage: str, budget_s: float | None, *, trusted: bool, **where: Any) -> None:
        """Say which step starts now, whose it is and how long it may take from now (None: no limit, idle)."""
        self.stage = {"stage": stage, "trusted": trusted, **where}
        budget = None if budget_s is None else round(budget_s, 3)
        self.tell({"type": "stage", "budget_s": budget, "t": time.monotonic(), **self.stage})

    # -- the candidate process -----------------------------------------------------------------------------------

    def attach(self, to_worker: int, from_worker: int) -> None:
        self.worker_out, self.worker_in = to_worker, from_worker
        self.compiles = []

    def detach(self) -> None:
        """Tell the candidate process to exit and close our ends of its pipes."""
        import os

        if self.worker_out is not None:
            try:
                wire.write_frame(self.worker_out, wire.dump_json({"op": "exit"}))
            except OSError:
                pass
        for fd in (self.worker_out, self.worker_in):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.worker_out = self.worker_in = None

    def read(self) -> dict[str, Any]:
        """The candidate process's next frame as a dict.

        Raises:
            WorkerLost: the pipe closed, or the frame is not a JSON object.
        """
        assert self.worker_in is not None
        try:
            frame = wire.read_frame(self.worker_in, MAX_REPLY)
        except wire.WireError as exc:
            raise WorkerLost(str(exc)) from None
        if frame is None:
            raise WorkerLost("the candidate process closed its pipe")
        try:
            msg = json.loads(frame)
        except ValueError as exc:
            raise WorkerLost(f"the candidate process sent an unreadable frame ({exc})") from None
        if not isinstance(msg, dict):
            raise WorkerLost("the candidate process sent a frame that is not an object")
        return msg

    def ask(self, msg: dict[str, Any], stage: str, budget_s: float, **where: Any) -> dict[str, Any]:
        """Send a request to the candidate process and wait for its reply, under a candidate step of budget_s.

        Compile reports in between switch the announced limit to a compile's and back (from the moment each
        arrives), so a long compile is not taken for a hang and a hang after a compile is still found quickly.

        Raises:
            WorkerLost: the pipe closed or the reply is not a status dict.
        """
        assert self.worker_out is not None
        self.announce(stage, budget_s, trusted=False, **where)
        try:
            wire.write_frame(self.worker_out, wire.dump_json(msg))
        except (BrokenPipeError, OSError) as exc:
            raise WorkerLost(str(exc)) from None
        started: float | None = None
        while True:
            reply = self.read()
            if reply.get("event") == "compile":
                kernel = str(reply.get("kernel", "?"))[:120]
                if reply.get("phase") == "start":
                    started = time.monotonic()
                    self.announce("compile", limits.COMPILE_S, trusted=False, kernel=kernel, **where)
                else:
                    if started is not None:
                        self.compiles.append({"kernel": kernel, "s": round(time.monotonic() - started, 3)})
                    started = None
                    self.announce(stage, budget_s, trusted=False, **where)
                continue
            if not isinstance(reply.get("ok"), bool):
                raise WorkerLost("the candidate process sent a reply that is not a status dict")
            return reply
