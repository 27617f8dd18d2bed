"""Themes as TOML: shipped themes load, bad files are refused with one line, the app falls back and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.color import Color

from tests.snapshot_apps.live_app import capture_notes, make_live_app, settle, wait_for
from workbench.ui.themes import (
    ANSI_THEME,
    DEFAULT_THEME,
    SHIPPED_THEMES_DIR,
    ThemeError,
    choose_theme,
    load_theme_file,
    load_themes,
    theme_from_mapping,
)


def test_shipped_themes_load_cleanly() -> None:
    found = load_themes([SHIPPED_THEMES_DIR])
    assert found.problems == []
    assert {"workbench-dark", "workbench-light", "workbench-ansi"} <= set(found.themes)
    assert found.themes["workbench-ansi"].ansi is True
    assert found.themes["workbench-light"].dark is False
    assert found.themes["workbench-dark"].variables["footer-key-foreground"] == "#E8A93B"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"name": "x", "primary": "#fff", "primray": "#000"}, "unknown key 'primray'"),
        ({"primary": "#fff"}, "name is required"),
        ({"name": "x"}, "primary is required"),
        ({"name": "x", "primary": "#ff"}, "primary = '#ff' is not a colour"),
        ({"name": "x", "primary": "#fff", "surface": "bluish"}, "surface = 'bluish' is not a colour"),
        ({"name": "x", "primary": "#fff", "dark": "yes"}, "dark must be true or false"),
        ({"name": "x", "primary": "#fff", "text_alpha": "0.9"}, "text_alpha must be a number"),
        ({"name": "x", "primary": "#fff", "variables": {"a": 1}}, "[variables] must be a table"),
    ],
)
def test_bad_theme_tables_are_refused_with_the_reason(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ThemeError) as caught:
        theme_from_mapping(raw, "mine.toml")
    assert str(caught.value).startswith("mine.toml: ") and problem in str(caught.value)


def test_a_bad_file_is_skipped_and_reported_while_good_ones_load(tmp_path: Path) -> None:
    (tmp_path / "good.toml").write_text('name = "good"\nprimary = "#336699"\n[variables]\n"footer-key-foreground" = "#fff"\n')
    (tmp_path / "broken.toml").write_text('name = "broken"\nprimary = \n')
    (tmp_path / "typo.toml").write_text('name = "typo"\nprimary = "#123456"\nbackgroud = "#000000"\n')
    found = load_themes([tmp_path, tmp_path / "missing"])
    assert set(found.themes) == {"good"}
    assert len(found.problems) == 2
    assert any("broken.toml" in p for p in found.problems) and any("'backgroud'" in p for p in found.problems)


def test_user_theme_overrides_a_shipped_one_of_the_same_name(tmp_path: Path) -> None:
    (tmp_path / "dark.toml").write_text('name = "workbench-dark"\nprimary = "#ff0000"\n')
    found = load_themes([SHIPPED_THEMES_DIR, tmp_path])
    assert found.themes["workbench-dark"].primary == "#ff0000"


def test_unreadable_theme_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ThemeError, match="bad.toml"):
        load_theme_file(path)


def test_choose_theme() -> None:
    names = ["workbench-dark", "workbench-ansi", "textual-dark", "ansi-dark"]
    assert choose_theme("", names, truecolor=True) == (DEFAULT_THEME, None)
    assert choose_theme("", names, truecolor=False) == (ANSI_THEME, None)
    assert choose_theme("textual-dark", names, truecolor=False) == ("textual-dark", None)
    name, note = choose_theme("solarised", names, truecolor=True)
    assert name == DEFAULT_THEME and note is not None and "'solarised'" in note
    name, note = choose_theme("", ["textual-dark", "ansi-dark"], truecolor=True)
    assert name == "textual-dark" and note is not None


async def test_app_falls_back_and_notifies_on_a_missing_theme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLORTERM", "truecolor")
    app, runtime = make_live_app(theme="no-such-theme")
    notes = capture_notes(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        assert app.theme == DEFAULT_THEME
    assert any("'no-such-theme'" in note for note in notes)


async def test_user_theme_from_themes_dir_is_used(tmp_path: Path) -> None:
    (tmp_path / "mine.toml").write_text('name = "mine"\nprimary = "#AA5500"\nbackground = "#101010"\n')
    app, runtime = make_live_app(theme="mine", themes_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        assert app.theme == "mine" and app.current_theme.primary == "#AA5500"


async def test_reloaded_theme_restyles_the_running_app(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nprimary = "#AA5500"\n')
    app, runtime = make_live_app(theme="mine", themes_dir=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        before = app.theme_variables["primary"]
        path.write_text('name = "mine"\nprimary = "#0055AA"\n')
        app.apply_reloaded_themes(load_themes([tmp_path]))
        await pilot.pause()
        assert app.current_theme.primary == "#0055AA"
        assert app.theme_variables["primary"] != before
        assert Color.parse(app.theme_variables["primary"]).b > 150


@pytest.mark.parametrize(("colorterm", "expected"), [("truecolor", DEFAULT_THEME), ("", ANSI_THEME)])
async def test_default_theme_follows_the_colour_system(monkeypatch: pytest.MonkeyPatch, colorterm: str,
                                                       expected: str) -> None:
    monkeypatch.setenv("COLORTERM", colorterm)
    monkeypatch.setenv("TERM", "tmux-256color")
    monkeypatch.delenv("TEXTUAL_COLOR_SYSTEM", raising=False)
    app, runtime = make_live_app(theme="")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        assert app.theme == expected


async def test_theme_watcher_reloads_an_edited_theme_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nprimary = "#AA5500"\n')
    app, runtime = make_live_app(theme="mine", themes_dir=tmp_path, watch_themes=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        await pilot.pause(0.3)  # let awatch register the directory before the edit
        path.write_text('name = "mine"\nprimary = "#0055AA"\n')
        await wait_for(lambda: app.current_theme.primary == "#0055AA", timeout=10)
