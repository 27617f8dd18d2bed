"""KernelView: one attempt's source in a read-only code editor, or its diff against the parent, the best or a mark."""

from __future__ import annotations

from typing import Mapping

from textual.app import ComposeResult
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import TextArea
from textual.widgets.text_area import Selection

from workbench.session.revisions import counts, unified
from workbench.session.state import Attempt
from workbench.ui import formatting as fmt
from workbench.ui.widgets.code_view import CodeView
from workbench.ui.widgets.diff_view import DiffView
from workbench.ui.widgets.pane import Pane

VIEWS = ("source", "parent", "best")
"""What `d` steps through; 'marked' joins them while an attempt is marked for comparison (review)."""

_ROLE = {"parent": "parent", "best": "best", "marked": "marked"}


class KernelView(Pane):
    """Shows one attempt: its source (syntax-highlighted) or a diff from another attempt to it."""

    DEFAULT_CSS = """
    KernelView > TextArea { border: none; padding: 0; height: 1fr; background: $surface; }
    KernelView > TextArea:focus { border: none; }
    KernelView > DiffView { display: none; height: 1fr; }
    KernelView.-diff > DiffView { display: block; }
    KernelView.-diff > TextArea { display: none; }
    """

    view: reactive[str] = reactive("source", init=False)
    """'source', 'parent', 'best' or 'marked': what the pane shows; drives the -diff class."""

    def __init__(self, *, cursor_blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self._cursor_blink = cursor_blink
        """False in tests: a blinking cursor makes snapshots depend on timing."""
        self.shown: tuple[int, str] | None = None
        """(attempt number, sha256) of the source in the editor."""
        self.attempt: Attempt | None = None
        """The attempt on show."""
        self.attempts: Mapping[int, Attempt] = {}
        """Every attempt of the session, to find the parent, the best and the marked one."""
        self.best: int | None = None
        """The best attempt's number."""
        self.evaluating = False
        """An evaluation of the attempt on show is queued or running."""
        self.marked: int | None = None
        """The attempt marked for comparison (review), or None."""
        self.diff_shown: tuple[object, ...] | None = None
        """What the diff pane was last computed from, so an unchanged tick costs no difflib run."""

    def compose(self) -> ComposeResult:
        # theme="css" every time: code_editor defaults to monokai, which ignores the app theme.
        # max_checkpoints=1: each new attempt is an edit of the document (below), and nobody undoes a read-only view.
        editor = CodeView.code_editor("", language="python", read_only=True, theme="css", id="kernel-source",
                                      max_checkpoints=1)
        editor.cursor_blink = self._cursor_blink
        yield editor
        yield DiffView(id="kernel-diff")

    def on_mount(self) -> None:
        self.border_title = "kernel"
        self.border_subtitle = "no attempt yet"

    @property
    def views(self) -> tuple[str, ...]:
        """The views `d` cycles through now."""
        return VIEWS + (("marked",) if self.marked is not None else ())

    def cycle_view(self) -> str:
        """Step to the next view (source → diff vs parent → diff vs best → [diff vs marked] → source)."""
        views = self.views
        self.view = views[(views.index(self.view) + 1) % len(views)] if self.view in views else views[0]
        return self.view

    def watch_view(self, view: str) -> None:
        self.set_class(view != "source", "-diff")
        self._redraw()

    def compare_with(self, marked: int | None) -> None:
        """Mark attempt `marked` (None clears the mark) and show the diff from it to the attempt on show."""
        self.marked = marked
        if marked is not None:
            if self.view == "marked":
                self._redraw()
            self.view = "marked"
        elif self.view == "marked":
            self.view = "source"

    def show(self, attempt: Attempt | None, *, best: int | None, attempts: Mapping[int, Attempt] | None = None,
             evaluating: bool = False) -> None:
        """Show `attempt` in the current view and describe it in the border.

        Args:
            attempt: the attempt to show (the latest written, live; the selected one, review); None before any.
            best: the best attempt's number, to mark this one when it is the best and to diff against.
            attempts: every attempt of the session by number (for the parent, the best and the mark).
            evaluating: an evaluation of it is queued or running (live), so "evaluating…" rather than "not
                evaluated yet".
        """
        if attempt is None:
            return
        self.attempt, self.best, self.evaluating = attempt, best, evaluating
        if attempts is not None:
            self.attempts = attempts
        self._redraw()

    def _other(self) -> tuple[Attempt | None, str]:
        """The attempt to diff against in the current view, or None and the reason there is none."""
        attempt = self.attempt
        assert attempt is not None
        if self.view == "parent":
            if attempt.parent is None:
                return None, f"attempt {attempt.n} has no parent: it is the session's first version."
            parent = self.attempts.get(attempt.parent)
            return parent, "" if parent else f"parent attempt {attempt.parent} is not in this session's state."
        if self.view == "best":
            if self.best is None:
                return None, "no attempt is correct yet: there is no best to compare with."
            if self.best == attempt.n:
                return None, f"attempt {attempt.n} is the best: nothing to compare with."
            return self.attempts.get(self.best), ""
        if self.marked is None:
            return None, "no attempt is marked (m marks the selected one)."
        if self.marked == attempt.n:
            return None, f"attempt {attempt.n} is the marked one: select another attempt to compare with it."
        return self.attempts.get(self.marked), ""

    def _redraw(self) -> None:
        attempt = self.attempt
        if attempt is None or not self.is_mounted:
            return
        subtitle: str
        if self.view == "source":
            key = (attempt.n, attempt.sha256)
            if key != self.shown:
                editor = self.query_one(TextArea)
                if self.shown is None:
                    editor.load_text(attempt.source)
                else:
                    # read_only stops the person, not the program. An edit of the existing document re-parses it
                    # incrementally; load_text would build a new one and compile the highlight query again, which
                    # cost ~40 ms per attempt here. Only the lines that differ are replaced (a tuner's attempt
                    # changes its CONFIG line: 1 ms against 7 for the whole of a 489-line kernel), and the whole text
                    # where that did not give the new source. The replacement would leave the cursor at the end of
                    # the new text and scroll there, so the person's cursor and scroll position are put back.
                    cursor, scroll = editor.cursor_location, editor.scroll_offset
                    _replace_changed_lines(editor, attempt.source)
                    row = min(cursor[0], editor.document.line_count - 1)
                    editor.selection = Selection.cursor((row, min(cursor[1], len(editor.document.get_line(row)))))
                    editor.scroll_to(x=scroll.x, y=scroll.y, animate=False)
                self.shown = key
            details = [attempt.note] if attempt.note else []
            if attempt.params:
                details.append(fmt.compact(attempt.params, 60))
            subtitle = fmt.shorten(" · ".join(details), 90) if details else f"sha {attempt.sha256[:10]}"
        else:
            other, note = self._other()
            role = _ROLE[self.view]
            key = (self.view, attempt.n, attempt.sha256, other.n if other else None, other.sha256 if other else note)
            if key != self.diff_shown:
                text = unified(other.source, attempt.source, f"attempt {other.n} ({role})", f"attempt {attempt.n}") \
                    if other is not None else ""
                if other is not None and not text:
                    note = f"attempt {other.n} ({role}) and attempt {attempt.n} have the same source."
                self.query_one(DiffView).show(text, note)
                self.diff_shown = key
            text = self.query_one(DiffView).text
            if other is not None and text:
                added, removed = counts(text)
                subtitle = f"diff from {role} #{other.n} · +{added} −{removed} lines · d: next view"
            else:
                subtitle = f"diff vs {role} · d: next view"
        # Only new titles: the tick redraws this pane whenever any event arrives, and each assignment would repaint
        # the whole pane, the editor's lines included (about 3 ms of the main thread a time).
        self.set_titles(self._title(attempt), Content(subtitle))

    def _title(self, attempt: Attempt) -> Content:
        parent = f" ← {attempt.parent}" if attempt.parent is not None else ""
        if attempt.verdict is None:
            waiting = "evaluating…" if self.evaluating else "no result" if attempt.eval_error else "not evaluated yet"
            result = (waiting, "$foreground-muted")
        elif attempt.verdict == "ok":
            result = (f"ok {fmt.speedup(attempt.speedup)}", "$text-success")
        else:
            result = (attempt.verdict, "$text-error")
        star = (" ★ best", "bold $text-accent") if self.best == attempt.n else ""
        view = ("" if self.view == "source" else (f" · diff vs {_ROLE[self.view]}", "bold $text-accent"))
        # Agent attempts are the rule; a person's edit and the starting kernel are worth the room in a narrow title.
        author = {"agent": "", "start": " · starting kernel"}.get(attempt.author, f" · {attempt.author}")
        # Content, not a str: border titles parse markup, and notes are free text.
        return Content.assemble(f"kernel · attempt {attempt.n}{parent}{author} · ", result, star, view)


def changed_lines(old: list[str], new: list[str]) -> tuple[int, int, int]:
    """(first, old_stop, new_stop): old[first:old_stop] is what new[first:new_stop] replaces, the lines before and
    after being the same in both."""
    first, most = 0, min(len(old), len(new))
    while first < most and old[first] == new[first]:
        first += 1
    tail = 0
    while tail < most - first and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return first, len(old) - tail, len(new) - tail


def _replace_changed_lines(editor: TextArea, source: str) -> None:
    """Make the editor's text `source` by replacing the lines that differ, each with its newline; the whole text if
    the edit reaches the last line or did not give `source`."""
    old, new = editor.text.split("\n"), source.split("\n")
    first, old_stop, new_stop = changed_lines(old, new)
    if old_stop < len(old) and new_stop < len(new):
        editor.replace("".join(line + "\n" for line in new[first:new_stop]), (first, 0), (old_stop, 0))
    if editor.text != source:
        editor.replace(source, (0, 0), editor.document.end)
