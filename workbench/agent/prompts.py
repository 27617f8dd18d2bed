"""What an LLM agent reads: the pinned system prompt, the per-turn state block and tool results as text.

Everything here is a pure function of journaled data (the goal, the state, tool.call/tool.result events), so the
context of any turn can be rebuilt from the journal and `workbench show --prompt-at` prints what the model saw.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.agent import ledger as ledger_mod
from workbench.agent.ledger import short_paths
from workbench.session.state import Attempt, SessionState

PROMPTS_VERSION = 2
"""Bumped when the wording or a tool's schema changes; journaled with each request so a replay can tell old prompts
from new (2: evaluate takes several attempts and a wait)."""

RULES = """\
You are a GPU-kernel engineer working alone for many hours on one task: make the candidate kernel faster than the
baseline while staying correct. You work only through the tools. The goal contract below is fixed for the whole
session; the <state> block at the end of each user message is the current truth (best result, strategy ledger,
instructions from the person in force).

How to work:
- Read the task (read_task) and the current kernel (read_kernel) first; read_file shows the reference and seed.
- Before trying an idea, record it in the strategy ledger (ledger action=add) with what you expect it to do.
  Tag every kernel you write with that strategy id (strategy="S3"). When the evidence is in, update the strategy:
  succeeded, failed (always say why), partial or dropped.
- Change the kernel with edit_kernel (exact search/replace on an attempt's source, default the latest) or
  write_kernel (a whole file). Each write is a new numbered attempt; numbers are never reused.
- evaluate runs the attempt in a fresh process: correctness on every shape first, then timing against the
  baseline. An incorrect kernel is worth nothing, however fast.
- Never retry a strategy the ledger marks failed unless you have a new reason; evaluate refuses a change that
  repeats one until you pass force=true, so say in the note what is different this time.
- The person may send instructions (nudges) between your turns. They override your plan; persistent ones stay
  in force until revoked. ask_person sends a question without waiting; the answer arrives as a message later.
- Older turns may be replaced by a MEMORY summary; trust it and the <state> block, and re-read a kernel when you
  need its source.
- Call finish when the kernel is as good as you can make it, with a one-line reason.
"""


def dumps(value: Any) -> str:
    """Deterministic compact JSON (sorted keys): the same data always gives the same prompt bytes."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def goal_text(goal: dict[str, Any]) -> str:
    """The goal contract as pinned text: task, shapes, tolerance, baseline, metric, banned libraries, budget."""
    if not goal:
        return "GOAL CONTRACT: (not set)"
    lines = ["GOAL CONTRACT (pinned; never compacted)"]
    lines.append(f"task: {goal.get('name', '?')} - {goal.get('description', '')}")
    if goal.get("entry"):
        lines.append(f"entry point: {goal['entry']}(...) with the reference's parameters; outputs: "
                     f"{', '.join(goal.get('outputs', []))}")
    tol = goal.get("tolerance") or {}
    if tol:
        per = f", per output {dumps(tol['per_output'])}" if tol.get("per_output") else ""
        lines.append(f"correctness: {tol.get('metric')} <= {tol.get('value')}{per} on every shape and seed")
    lines.append("metric: geometric-mean speedup over the baseline across the shapes (higher is better)")
    if goal.get("device"):
        lines.append(f"device: {goal['device']}")
    shapes = goal.get("shapes") or {}
    for group, rows in shapes.items():
        if rows:
            lines.append(f"shapes ({group}): " + "; ".join(
                f"{r.get('name')} {dumps(r.get('params', {}))}"
                + (f" floor {r['floor_ms']:.4g} ms" if isinstance(r.get('floor_ms'), (int, float)) else "")
                for r in rows))
    forbidden = goal.get("forbidden") or {}
    if forbidden:
        lines.append(f"forbidden imports: {', '.join(forbidden.get('imports', [])) or 'none'}")
        lines.append(f"forbidden torch ops: {', '.join(forbidden.get('torch_ops', [])) or 'none'}")
    if goal.get("roofline"):
        lines.append(f"roofline work: {dumps(goal['roofline'])}")
    if goal.get("plausible_speedup"):
        lines.append(f"a speedup above {goal['plausible_speedup']:g}x is treated as implausible (a measurement bug "
                     f"or a cheat) and rejected")
    lines.append("held-out shapes you never see are evaluated too: do not special-case the shapes above")
    if goal.get("budget"):
        lines.append(f"budget at start: {dumps(goal['budget'])}")
    return "\n".join(lines)


def system_prompt(goal: dict[str, Any]) -> str:
    """The pinned prefix: working rules plus the goal contract (cached by the API, never compacted)."""
    return RULES + "\n" + goal_text(goal) + "\n"


# -- lines shared by the state block and the compaction summary ---------------------------------------
def attempt_line(a: Attempt) -> str:
    """One line per attempt: number, parent, verdict, speed, strategy tag and note."""
    speed = f" {a.speedup:.3f}x" if a.speedup is not None else ""
    ms = f" {a.ms:.4g} ms" if a.ms is not None else ""
    parent = f" <- #{a.parent}" if a.parent is not None else ""
    tag = f" [{a.params['strategy']}]" if a.params.get("strategy") else ""
    note = f' "{a.note[:80]}"' if a.note else ""
    message = f" - {short_paths(a.message)[:120]}" if a.verdict not in (None, "ok") and a.message else ""
    return f"#{a.n}{parent} {a.verdict or 'not evaluated'}{speed}{ms}{tag}{note}{message}"


def best_line(state: SessionState) -> str:
    """The best result so far, or that there is none."""
    best = state.best_attempt
    if best is None:
        return "best: no correct attempt yet"
    flag = "" if best.timing_comparable else " (interpreter timing, not comparable)"
    return f"best: attempt {best.n}{flag}: {attempt_line(best)}"


def profile_headline(state: SessionState) -> str:
    """The latest profiler result in one line ('' when nothing was profiled)."""
    p = state.profile
    if not p:
        return ""
    for key in ("headline", "summary", "message"):
        if isinstance(p.get(key), str) and p[key].strip():
            return f"profile (attempt {p.get('attempt', '?')}): {p[key].strip()[:300]}"
    return f"profile (attempt {p.get('attempt', '?')}): " + dumps({k: v for k, v in p.items() if k != "rows"})[:300]


def nudge_line(nudge: dict[str, Any]) -> str:
    """An instruction from the person, in full (its wording is the point)."""
    return f"[{nudge['id']}] {nudge['text']}"


def persistent_nudges(state: SessionState) -> list[dict[str, Any]]:
    """Persistent nudges not revoked: repeated in every turn and kept by every compaction."""
    return [n for n in state.nudges if n.get("persistent") and n.get("active")]


def state_block(state: SessionState) -> str:
    """The compact state that rides in every user turn: counters, best, latest, profile, ledger, nudges."""
    lines = ["<state>",
             f"tool_calls={state.tool_calls} attempts={len(state.attempts)} evaluated={state.evaluated}"]
    if state.budget:
        lines.append("limits: " + ", ".join(f"{k}={v}" for k, v in sorted(state.budget.items())))
    lines.append(best_line(state))
    latest = state.current
    if latest is not None and latest.n != state.best:
        lines.append(f"latest: {attempt_line(latest)}")
    headline = profile_headline(state)
    if headline:
        lines.append(headline)
    if state.ledger:
        lines.append("strategy ledger (failed ones must not be retried without a new reason):")
        lines.extend(f"- {ledger_mod.line(e)}" for e in state.ledger)
    else:
        lines.append("strategy ledger: empty (add your plan with the ledger tool)")
    nudges = persistent_nudges(state)
    if nudges:
        lines.append("instructions from the person in force (until revoked):")
        lines.extend(f"- {nudge_line(n)}" for n in nudges)
    lines.append("</state>")
    return "\n".join(lines)


def intro_text() -> str:
    """The first user message of a session."""
    return ("Start: attempt 1 is the kernel this session starts from (not evaluated yet). Read the task and that "
            "kernel, record your first strategies in the ledger, then improve the kernel. Work with tool calls only.")


def branch_text(branch: int, branches: int) -> str:
    """What a branch's first message adds when the run drives several conversations from the goal."""
    return (f"You are branch {branch + 1} of {branches}: {branches} agents work on this goal at once, each with its "
            "own conversation. The strategy ledger, the attempts and the best result are shared (the <state> block "
            "shows them); pick strategies the ledger does not already hold, so the branches explore apart.")


def nudge_message(nudge: dict[str, Any]) -> str:
    """A nudge as the model first sees it."""
    scope = "persistent until revoked" if nudge.get("persistent") else "one-off"
    return f"Message from the person (nudge {nudge['id']}, {scope}):\n{nudge['text']}"


def revoke_message(nudge: dict[str, Any]) -> str:
    """Tells the model a persistent instruction no longer applies."""
    return f"The person revoked instruction [{nudge['id']}]: \"{nudge['text']}\" no longer applies."


SILENT_TEXT = "You replied without calling a tool. Call a tool to continue, or call finish if you are done."


# -- evaluation results as the model reads them ------------------------------------------------------
def report_lines(report: dict[str, Any]) -> list[str]:
    """An evaluation's agent report (evaluator.result.agent_report) as lines: verdict, message, geomean, shapes."""
    lines = [f"verdict: {report.get('verdict')}"]
    if report.get("message"):
        lines.append(f"message: {short_paths(report['message'])}")
    if report.get("speedup") is not None:
        comparable = "" if report.get("timing_comparable") else " (interpreter timing: not comparable)"
        lines.append(f"speedup (geomean): {report['speedup']:.4g}x{comparable}")
    for s in report.get("shapes", []):
        cells = [str(s.get("name"))]
        for key, fmt in (("correct", "{}"), ("rel_err", "{:.3g}"), ("ms", "{:.4g}"), ("baseline_ms", "{:.4g}"),
                         ("speedup", "{:.3f}x"), ("floor_ms", "{:.4g}")):
            if s.get(key) is not None:
                cells.append(f"{key}=" + fmt.format(s[key]))
        lines.append("  " + " ".join(cells))
    return lines
