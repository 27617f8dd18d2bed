"""HeadlessSink: progress lines on stdout for runs without a terminal UI (one line per attempt)."""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future
from typing import TextIO

from workbench.agent.sink import FleetView
from workbench.journal import Event
from workbench.session.state import SessionState


def say(line: str, out: TextIO | None = None) -> bool:
    """Print one line and flush; False when the output is gone (a hung-up terminal, a closed pipe).

    A run must outlive its output: the journal is the record, so a failed print is dropped, and the descriptor is
    pointed at /dev/null so later prints and the flush at exit do not fail again.
    """
    out = out or sys.stdout
    try:
        print(line, file=out, flush=True)
        return True
    except OSError:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, out.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass
        return False


def progress_line(state: SessionState, n: int) -> str:
    """One progress line for a person following a headless run: an evaluated attempt and the best so far.

    (prompts.attempt_line is the model's line for an attempt: other reader, other words.)
    """
    attempt = state.attempts[n]
    speed = f"{attempt.speedup:.3f}x" if attempt.speedup is not None else "-"
    ms = f"{attempt.ms:.4f} ms" if attempt.ms is not None else "-"
    best = state.best_attempt
    best_text = f"best {best.speedup:.3f}x @{best.n}" if best and best.speedup is not None else "best -"
    flag = "" if attempt.timing_comparable else " (cpu-interpret: timing not comparable)"
    note = f"  [{attempt.note}]" if attempt.note else ""
    message = f"  {attempt.message}" if attempt.verdict != "ok" and attempt.message else ""
    where = f"  on {attempt.slot}" if state.workers > 1 and attempt.slot else ""
    confirming = "  (a new best once confirmed on the reference slot)" if attempt.confirming else ""
    return (f"attempt {n:4d}  {attempt.verdict:<13} {speed:>9} {ms:>14}  {best_text}{flag}{where}{confirming}"
            f"{note}{message}")


class HeadlessSink:
    """Prints a line per evaluated attempt, nudge and stop; reads the runtime's live state."""

    def __init__(self, state: SessionState, out: TextIO | None = None) -> None:
        self.state = state
        self.out = out or sys.stdout

    def emit(self, event: Event) -> None:
        """Print what a person following the run wants to see."""
        if event.type == "eval.finished" and event.data.get("check") == "heldout":
            summary = event.data.get("heldout", {})
            outcome = "passed" if summary.get("passed") else "FAILED: " + event.data["result"].get("message", "")
            self._print(f"attempt {event.data['attempt']:4d}  held-out check on {summary.get('shapes', 0)} "
                        f"hidden shapes {outcome}")
        elif event.type == "eval.finished":
            self._print(progress_line(self.state, event.data["attempt"]))
        elif event.type == "eval.failed" and not event.data.get("cancelled"):
            self._print(f"attempt {event.data['attempt']:4d}  not evaluated: {event.data.get('message', '')}")
        elif event.type == "fleet.slot":
            moved = f"; the reference slot is now {event.data['reference']}" if event.data.get("reference") else ""
            self._print(f"slot {event.data['slot'].get('slot', '?')} {event.data.get('state', '')}: "
                        f"{event.data.get('message', '')}{moved}")
        elif event.type == "nudge.acked":
            self._print(f"nudge {event.data['id']}: {event.data.get('note', '')}")
        elif event.type == "run.stopped":
            self._print(f"stopped: {event.data['reason']}")
        elif event.type == "error":
            self._print(f"error: {event.data['message']}")

    def notify(self, text: str, severity: str = "information") -> None:
        """Print a notice."""
        self._print(text)

    def fleet(self, view: FleetView) -> None:
        """Not printed: a slot's faults come as fleet.slot events, and its phases change too often for a log."""

    def ask(self, question: str) -> Future[str]:
        """Headless runs cannot answer: the question is printed and the future cancelled."""
        self._print(f"question (unanswered, headless): {question}")
        future: Future[str] = Future()
        future.cancel()
        return future

    def _print(self, line: str) -> None:
        say(line, self.out)
