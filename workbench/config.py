"""Settings: user preferences read from TOML, with defaults that need no file at all."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A settings file that cannot be used; the message names the file and the key."""


@dataclass
class Settings:
    """What the person can configure; tests build one with a fixed theme, no watchers and a frozen clock."""

    theme: str = ""
    """Theme name; '' picks 'workbench-dark', or 'workbench-ansi' below truecolor."""
    themes_dir: Path | None = None
    """Extra user themes (*.toml) beside the shipped ones."""
    keymap: dict[str, str] = field(default_factory=dict)
    """Binding id -> keys, passed to App.set_keymap."""
    watch_themes: bool = False
    log_max_lines: int = 5000
    mouse: bool = True
    frozen_clock: str | None = None
    """ISO timestamp used as 'now' by the UI: makes snapshots deterministic."""
    cursor_blink: bool = True

    @classmethod
    def load(cls, path: Path | None = None) -> "Settings":
        """Read settings from `path`, $WORKBENCH_CONFIG or ~/.config/workbench/config.toml; missing file = defaults.

        Raises:
            ConfigError: the file exists but is not valid TOML or has unknown keys or wrong types.
        """
        if path is None:
            env = os.environ.get("WORKBENCH_CONFIG")
            path = Path(env) if env else Path.home() / ".config" / "workbench" / "config.toml"
        if not path.exists():
            return cls()
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        return cls.from_mapping(raw, source=str(path))

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], source: str = "<settings>") -> "Settings":
        """Validate a plain mapping into Settings."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown key {key!r} (known: {', '.join(sorted(known))})")
            default = getattr(cls(), key)
            if key == "themes_dir":
                value = Path(value).expanduser() if value else None
            elif key == "keymap":
                if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                    raise ConfigError(f"{source}: keymap must be a table of binding id = \"keys\"")
            elif default is not None and not isinstance(value, type(default)):
                raise ConfigError(f"{source}: {key} must be {type(default).__name__}, not {type(value).__name__}")
            kwargs[key] = value
        return cls(**kwargs)
