"""The vendor-neutral conversation step of an LLM backend: one model reply at a time, journaled turn by turn.

The backend holds no conversation of its own. Its context is the BackendContext's memory, a fold of the journal:
each llm.request journals only the user message it adds (tool results, new nudges, the state block), each
llm.response the assistant message, so a resume rebuilds the exact context from the journal and `workbench show
--prompt-at SEQ` can print it. What is vendor-specific (the request body, streaming, error classes, prices,
credentials) is the Transport's.

Retries are ours, not an SDK's: each failed try is journaled as an llm.response with ok: false, its error and the
wait chosen; a retry-after from the server is honoured (up to a cap), otherwise the wait backs off exponentially
with jitter, never above RetryPolicy.backoff_max (30 s), so an outage is noticed over within half a minute of its end.
A day-long run outlives a network blip: a retryable failure is tried again for as long as the model API has been
failing for less than the run's --max-api-wait (default RetryPolicy.max_api_wait, one hour); past it the run stops
cleanly, resumable. Every wait is announced ("waiting for the model API (retry n in s)"). A prompt the model finds
too long is compacted harder and sent once more.

Nothing here blocks the runtime's thread: the request is sent through `BackendContext.offload` and next_action
returns Wait until the reply (or the retry's wait) is over, then journals it. A stop ends the wait at once, and the
journaled request is simply sent again on resume. Evaluation results the model's evaluate calls left running reach
it as text in its next request, when they come in (SessionMemory.arrived).
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass

from workbench.agent.backends.base import BackendContext, Finish, ToolCall, Wait
from workbench.agent.backends.transport import BackendError, Transport, TransportError
from workbench.agent.context import build_prompt
from workbench.agent.memory import SessionMemory, estimate_tokens
from workbench.agent.prompts import (
    PROMPTS_VERSION,
    SILENT_TEXT,
    branch_text,
    intro_text,
    nudge_message,
    revoke_message,
    state_block,
    system_prompt,
)
from workbench.agent.tools import arrival_text, render_result, specs
from workbench.journal.events import Block, Endpoint, LlmRequest, Message, NudgeReceived
from workbench.session.revisions import sha256_text
from workbench.session.state import SessionState
from workbench.tasks import Task

DEFAULT_CONTEXT_TOKENS = 120_000
"""Compaction budget of an LLM backend: well inside a 200k-token window, leaving room for long tool results."""

MAX_SILENT_TURNS = 3
"""Replies in a row without a tool call after which the run finishes instead of paying for more."""

SHRINK = 0.6
"""After a context-length error, the window (the context less its pinned prefix) is compacted to this share."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before trying a failed request again, and when to give up."""

    max_retries: int | None = None
    """Failed tries after which the run fails (None: no count; the time budget, max_api_wait, decides)."""
    backoff_base: float = 1.0
    """Seconds before the first retry (doubling after each)."""
    backoff_max: float = 30.0
    """Longest back-off, jitter included."""
    max_wait: float = 900.0
    """Longest wait honoured from a retry-after header."""
    max_api_wait: float = 3600.0
    """Seconds the model API may go on failing before the run stops (resumable), when the run sets no
    --max-api-wait."""

    def wait(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after the `attempt`-th failed try."""
        if retry_after is not None:
            return min(retry_after, self.max_wait)
        backoff = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return backoff * random.uniform(0.75, 1.0)


class ConversationBackend:
    """An LLM strategy: each step runs the next tool call of the latest reply, or asks the model for a reply."""

    memory_kind = "messages"

    def __init__(self, name: str, transport: Transport, model: str, *, seed_source: str = "", max_tokens: int = 8192,
                 retry: RetryPolicy = RetryPolicy(), context_tokens: int = DEFAULT_CONTEXT_TOKENS,
                 endpoint: Endpoint | None = None) -> None:
        self.name = name
        """The registry name the session journals ('claude')."""
        self.transport = transport
        self.model = model
        self.endpoint = endpoint
        """The transport's endpoint as journaled (None: the transport takes its own from the environment)."""
        self.seed_source = seed_source
        """The kernel the session starts from (read_kernel shows it before any attempt exists)."""
        self.max_tokens = max_tokens
        self.retry = retry
        self.context_tokens = context_tokens
        """Default compaction budget (a run's --context-budget overrides it)."""
        self._ctx: BackendContext | None = None
        self._overhead: tuple[str, int] | None = None
        self._call: "Future[Reply] | None" = None
        """The request in flight (sent off the runtime's thread)."""
        self._sent = 0.0
        """When it was sent (time.monotonic)."""
        self._tries = 0
        """Tries of the journaled request so far."""
        self._retry_at: float | None = None
        """After a failed try: when to send it again."""
        self._shrunk = False
        """The request was already compacted harder after a context-length error."""
        self._body: dict | None = None
        """The request body being sent (rebuilt after a compaction)."""
        self._failing_since: float | None = None
        """When the first failed try of the journaled request was sent (what --max-api-wait counts from)."""

    # -- runtime hooks -------------------------------------------------------------------------
    def bind(self, ctx: BackendContext) -> None:
        """Called by the runtime when a run starts: the journal, the memory, waits and compaction come from it."""
        self._ctx = ctx

    @property
    def ctx(self) -> BackendContext:
        """The context of the run in progress."""
        if self._ctx is None:
            raise RuntimeError(f"{self.name}: next_action before bind (the runtime binds a backend when a run starts)")
        return self._ctx

    def context_overhead(self, state: SessionState) -> int:
        """Estimated tokens of the pinned prefix (system prompt and tool definitions)."""
        system = system_prompt(state.goal)
        if self._overhead is None or self._overhead[0] != system:
            tools = json.dumps([{"name": s.name, "description": s.description, "parameters": s.parameters}
                                for s in specs()])
            self._overhead = (system, estimate_tokens(system) + estimate_tokens(tools))
        return self._overhead[1]

    def acknowledge(self, nudge: NudgeReceived, state: SessionState, task: Task) -> str:
        """Nudges reach the model with its next request; persistent ones ride in every state block after that."""
        scope = "; repeated in every turn until revoked" if nudge.get("persistent") else ""
        return f"{self.name}: queued for the model's next turn{scope}"

    # -- the step ------------------------------------------------------------------------------
    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | Wait | None:
        """The next tool call of the latest reply; when all have run, a new request (journaled) and, once its reply
        is in, the reply's first call; Wait while the reply (or a retry's wait) is pending, or while the model has nothing
        to act on but evaluations in flight."""
        memory = self.ctx.memory
        for _ in range(MAX_SILENT_TURNS + 1):
            if not memory.pending:
                action = self._next_call(memory)
                if action is not None:
                    return action
                finished = self._finished(memory)
                if finished is not None:
                    return finished
                waiting = self._evaluating(state)
                if not memory.tool_uses() and memory.response is not None and waiting and not memory.arrived:
                    return Wait("evaluations in flight")  # a reply that waits for results costs nothing until one comes
                if memory.silent >= MAX_SILENT_TURNS and not waiting:
                    return Finish(f"the model replied {memory.silent} times in a row without calling a tool")
                self._request(state, memory)
            outcome = self._exchange(state, memory)
            if isinstance(outcome, Finish):
                return outcome
            if not outcome:
                if self._call is None and self._retry_at is not None:
                    return Wait("a retry's wait", until=self._retry_at)
                return Wait("the model's reply")
        return None

    def _evaluating(self, state: SessionState) -> bool:
        """Whether evaluations this branch's calls queued are still running."""
        return any(job.get("call") and job.get("branch", 0) == self.ctx.branch for job in state.jobs.values())

    @staticmethod
    def _next_call(memory: SessionMemory) -> ToolCall | None:
        for block in memory.tool_uses():
            if block["id"] in memory.calls:
                continue
            error = None
            if "malformed" in block:
                error = f"your arguments for {block['name']} were not valid JSON ({block['malformed']}); call it again"
            return ToolCall(block["name"], dict(block.get("input") or {}), ref=block["id"], error=error)
        return None

    @staticmethod
    def _finished(memory: SessionMemory) -> Finish | None:
        """Finish when the model's finish call succeeded in this run (a person who resumes after it gets a turn)."""
        for block in memory.tool_uses():
            if block["name"] != "finish":
                continue
            call = memory.calls.get(block["id"])
            result = call and call["result"]
            if result and result.get("ok") and call["result_seq"] > memory.run_started_seq:
                return Finish(f"the model finished: {block['input'].get('reason', '')}".strip())
        return None

    def _delta(self, state: SessionState, memory: SessionMemory) -> list[Message]:
        """The user message this request adds: tool results, the person's new words, the state block."""
        blocks: list[Block] = []
        if memory.response is None:
            blocks.append({"type": "text", "text": intro_text()})
            if self.ctx.branches > 1:
                blocks.append({"type": "text", "text": branch_text(self.ctx.branch, self.ctx.branches)})
        for block in memory.tool_uses():
            call = memory.calls.get(block["id"])
            content, is_error = render_result(call["call"] if call else {"tool": block["name"]},
                                              call["result"] if call else None, state)
            result: Block = {"type": "tool_result", "tool_use_id": block["id"], "content": content}  # type: ignore[typeddict-item]
            if is_error:
                result["is_error"] = True  # type: ignore[typeddict-unknown-key]
            blocks.append(result)
        blocks.extend({"type": "text", "text": arrival_text(state, n)} for n in memory.arrived)
        if memory.response is not None and not memory.tool_uses():
            blocks.append({"type": "text", "text": SILENT_TEXT})
        for nudge in state.nudges:
            if nudge["seq"] > memory.last_request_seq:
                blocks.append({"type": "text", "text": nudge_message(nudge)})
        by_id = {n["id"]: n for n in state.nudges}
        for seq, nudge_id in memory.revoked:
            if seq > memory.last_request_seq and nudge_id in by_id:
                blocks.append({"type": "text", "text": revoke_message(by_id[nudge_id])})
        blocks.append({"type": "text", "text": state_block(state)})
        return [{"role": "user", "content": blocks}]

    def _request(self, state: SessionState, memory: SessionMemory) -> None:
        """Journal the next request (compacting first when the context would pass its budget)."""
        delta = self._delta(state, memory)
        delta_tokens = sum(estimate_tokens(m["content"], memory.source_chars) for m in delta)
        # A compaction never touches the delta: it replaces older turns, and the delta is built from state.
        self.ctx.compact(delta_tokens)
        self.ctx.emit("llm.request", dict(LlmRequest(
            turn=memory.turn + 1,
            model=self.model,
            max_tokens=self.max_tokens,
            prompt_version=PROMPTS_VERSION,
            system_sha256=sha256_text(system_prompt(state.goal)),
            delta=delta,
            context_tokens=self.context_overhead(state) + memory.tokens() + delta_tokens,
            budget_tokens=self.ctx.context_limit,
        )))

    # -- one exchange with the API ---------------------------------------------------------------
    def _exchange(self, state: SessionState, memory: SessionMemory) -> bool | Finish:
        """Move the journaled request on: send it (off this thread), or journal its reply or its failed try.

        Returns:
            True when a reply is journaled, False while one is awaited (in flight, or a retry's wait); a Finish that
            is not final when the model API kept failing past the run's --max-api-wait (the request stays
            journaled: a resume sends it again).
        """
        if self._call is None:
            if self._retry_at is not None and time.monotonic() < self._retry_at:
                return False  # the runtime's loop waits (and sees a stop) meanwhile
            if self._body is None:
                self._body = self.transport.request_body(build_prompt(memory, state), model=self.model,
                                                         max_tokens=self.max_tokens)
            body, send = self._body, self.transport.send
            self._tries, self._retry_at, self._sent = self._tries + 1, None, time.monotonic()
            self._call = self.ctx.offload(lambda: send(body))
        if not self._call.done():
            return False
        call, self._call = self._call, None
        attempt = self._tries
        try:
            reply = call.result()
        except TransportError as exc:
            if exc.kind == "fatal":
                self._reset()
                raise BackendError(str(exc)) from None
            if exc.kind == "context_length":
                if self._shrunk or not self._shrink(state, memory, str(exc), attempt, exc.status):
                    self._reset()
                    raise BackendError(f"model API: the prompt is too long even after a compaction: {exc}") from None
                self._shrunk, self._body = True, None
                return False
            if self.retry.max_retries is not None and attempt > self.retry.max_retries:
                self._reset()
                raise BackendError(f"model API still failing after {attempt} tries: {exc}") from None
            if self._failing_since is None:
                self._failing_since = self._sent
            failing, limit = time.monotonic() - self._failing_since, self.api_wait_limit()
            if failing >= limit:
                self.ctx.emit("llm.response", {"ok": False, "turn": memory.turn, "try": attempt, "error": str(exc),
                                               "status": exc.status, "retry_after": exc.retry_after is not None})
                self._reset()
                return Finish(f"the model API kept failing for {failing:.0f} s (--max-api-wait {limit:g} s): "
                              f"{exc}; resume once it answers", final=False)
            wait = min(self.retry.wait(attempt, exc.retry_after), limit - failing)
            self.ctx.emit("llm.response", {
                "ok": False, "turn": memory.turn, "try": attempt, "error": str(exc), "status": exc.status,
                "retry_in": round(wait, 3), "retry_after": exc.retry_after is not None,
            })
            self.ctx.notify(f"waiting for the model API (retry {attempt} in {wait:.1f} s): {exc}", "warning")
            self._retry_at = time.monotonic() + wait
            return False
        cost, known = self.transport.cost(self.model, reply.usage)
        self.ctx.emit("llm.response", {
            "ok": True, "turn": memory.turn, "try": attempt, "content": reply.content,
            "stop_reason": reply.stop_reason, "id": reply.id, "model": reply.model, **reply.usage,
            "cost_usd": cost, "priced": known, "ms": round((time.monotonic() - self._sent) * 1000, 1),
        })
        self._reset()
        return True

    def _reset(self) -> None:
        """The request is answered (or given up): the next one starts from its first try."""
        self._call, self._tries, self._retry_at, self._shrunk, self._body = None, 0, None, False, None
        self._failing_since = None

    def api_wait_limit(self) -> float:
        """Seconds the model API may go on failing: the run's --max-api-wait, else the policy's default."""
        limit = self.ctx.budget.max_api_wait
        return self.retry.max_api_wait if limit is None else float(limit)

    def _shrink(self, state: SessionState, memory: SessionMemory, error: str, attempt: int, status: int) -> bool:
        """After a context-length error: journal the failed try, compact the window to SHRINK of what was sent."""
        self.ctx.emit("llm.response", {"ok": False, "turn": memory.turn, "try": attempt, "error": error,
                                       "status": status, "retry_in": 0.0, "retry_after": False})
        return self.ctx.compact(0, self.context_overhead(state) + int(memory.tokens() * SHRINK)) is not None
