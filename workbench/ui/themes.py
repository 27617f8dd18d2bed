"""Themes as data: themes/*.toml files validated into textual.theme.Theme objects."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

from textual.color import Color, ColorParseError
from textual.theme import Theme

SHIPPED_THEMES_DIR = Path(__file__).resolve().parents[2] / "themes"
"""The themes that come with the workbench (repository root `themes/`)."""

DEFAULT_THEME = "workbench-dark"
"""Used when the person chose no theme and the terminal has truecolor."""

ANSI_THEME = "workbench-ansi"
"""Used when the person chose no theme and the terminal has fewer colours: it takes the terminal's palette."""

FALLBACK_THEMES = {False: "textual-dark", True: "ansi-dark"}
"""Textual's own themes, keyed by 'below truecolor': the last resort when no shipped theme loaded."""

_COLOUR_FIELDS = ("primary", "secondary", "warning", "error", "success", "accent", "foreground", "background",
                  "surface", "panel", "boost")
_BOOL_FIELDS = ("dark", "ansi")
_FLOAT_FIELDS = ("luminosity_spread", "text_alpha")
_KNOWN = {f.name for f in fields(Theme)}


class ThemeError(Exception):
    """A theme file that cannot be used; str() is one line naming the file and the problem."""


@dataclass
class ThemeSet:
    """The themes found on disk, plus one line for every file that was skipped."""

    themes: dict[str, Theme] = field(default_factory=dict)
    """Theme name -> Theme, later directories overriding earlier ones."""
    problems: list[str] = field(default_factory=list)
    """Why a file was skipped, shown to the person with notify() once the app is up."""


def theme_from_mapping(raw: dict[str, Any], source: str) -> Theme:
    """Validate one parsed theme table into a Theme.

    Args:
        raw: the TOML document: Theme fields at the top level plus an optional [variables] table.
        source: the file name, for messages.

    Raises:
        ThemeError: an unknown key, a missing name or primary, a colour Textual cannot parse, or a wrong type.
    """
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ThemeError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
    for key in ("name", "primary"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ThemeError(f"{source}: {key} is required and must be a non-empty string")
    for key in _COLOUR_FIELDS:
        if key in raw:
            value = raw[key]
            if not isinstance(value, str):
                raise ThemeError(f"{source}: {key} must be a colour string, not {type(value).__name__}")
            try:
                Color.parse(value)
            except ColorParseError:
                raise ThemeError(f"{source}: {key} = {value!r} is not a colour") from None
    for key in _BOOL_FIELDS:
        if key in raw and not isinstance(raw[key], bool):
            raise ThemeError(f"{source}: {key} must be true or false")
    for key in _FLOAT_FIELDS:
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], (int, float))):
            raise ThemeError(f"{source}: {key} must be a number")
    variables = raw.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise ThemeError(f"{source}: [variables] must be a table of name = \"value\" strings")
    return Theme(**{**raw, "variables": dict(variables)})


def load_theme_file(path: Path) -> Theme:
    """Read and validate one theme file.

    Raises:
        ThemeError: unreadable, not TOML, or not a valid theme.
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ThemeError(f"{path}: {exc}") from None
    return theme_from_mapping(raw, str(path))


def load_themes(directories: Iterable[Path | None]) -> ThemeSet:
    """Load every *.toml theme from the directories, in order; a bad file is skipped and reported.

    A missing directory is not a problem (the user themes folder is optional), so it adds nothing.
    """
    found = ThemeSet()
    for directory in directories:
        if directory is None or not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            try:
                theme = load_theme_file(path)
            except ThemeError as exc:
                found.problems.append(f"theme skipped: {exc}")
                continue
            found.themes[theme.name] = theme
    return found


def choose_theme(requested: str, available: Iterable[str], *, truecolor: bool) -> tuple[str, str | None]:
    """Pick the theme to start with.

    Args:
        requested: the configured theme name, '' for the automatic choice.
        available: names registered with the app (shipped, user and Textual's own).
        truecolor: whether the terminal shows 24-bit colour; below it the ANSI theme reads better.

    Returns:
        (theme name, a line for notify() when the request could not be honoured, else None).
    """
    names = set(available)
    automatic = DEFAULT_THEME if truecolor else ANSI_THEME
    if not requested and automatic in names:
        return automatic, None
    if requested in names:
        return requested, None
    fallback = automatic if automatic in names else FALLBACK_THEMES[not truecolor]
    if requested:
        return fallback, f"theme {requested!r} is not available; using {fallback!r}"
    return fallback, f"theme {automatic!r} did not load; using {fallback!r}"
