"""Where backends are found: the built-in table, then third-party packages through the `workbench.backends` entry
point group (the way Harlequin finds its adapters).

An entry point names a BackendSpec object (`module:attribute`); so do the built-in entries, which are the same
declarations pyproject.toml makes, kept here too so the registry works from a checkout whose installed metadata
is older than its code. A built-in name cannot be taken over by a third-party package. Nothing is imported until
a backend is asked for by name, so listing the names (the CLI's --agent choices) imports no backend at all.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from workbench.agent.backends.base import Backend
    from workbench.agent.backends.transport import Transport
    from workbench.journal.events import Endpoint

GROUP = "workbench.backends"
"""The entry point group a third-party backend declares itself in."""

BUILTIN: dict[str, str] = {
    "tuner": "workbench.agent.backends.tuner:SPEC",
    "claude": "workbench.agent.backends.claude:SPEC",
    "openai": "workbench.agent.backends.openai_chat:SPEC",
}
"""Name -> 'module:attribute' of its BackendSpec; pyproject.toml declares the same entry points."""

DEFAULT_ORDER = ("claude", "tuner")
"""`--agent` defaults to the first of these whose credentials are present (the tuner needs none)."""


@dataclass(frozen=True)
class BackendOptions:
    """What the CLI knows when it makes a backend."""

    model: str | None
    """--model, or the model a resumed session journaled (None: the backend's default)."""
    seed_source: str
    """The kernel the session starts from."""
    seed_origin: str = "the seed"
    """Where that kernel came from, for messages ('the --start kernel', the task's seed.py)."""
    fresh: bool = True
    """No attempt exists yet (a new session, or a resume of one that never wrote an attempt)."""
    endpoint: "Endpoint" = field(default_factory=lambda: {})
    """--base-url, --price and --no-stream over what a resumed session journaled (only keys in endpoint_keys)."""


@dataclass(frozen=True)
class BackendSpec:
    """A backend as the registry knows it: how to make one, and what to check before a session is made."""

    name: str
    description: str
    """One line for `--help` and `workbench doctor`."""
    create: Callable[[BackendOptions], "Backend"]
    transport: Callable[["Endpoint"], "Transport"] | None = None
    """The model API of an LLM backend, made for an endpoint (credentials, access check, request bodies for show
    --prompt-at)."""
    endpoint_keys: tuple[str, ...] = ()
    """The Endpoint keys the backend takes (--base-url: base_url, --price: price, --no-stream: stream)."""
    requires: tuple[str, ...] = ()
    """Python packages the backend imports (checked before a session is made)."""
    preflight: Callable[[BackendOptions], None] | None = None
    """Checks the options before a session is made; raises BackendError (one line) when the backend cannot work."""

    def check(self, options: BackendOptions) -> None:
        """Run the preflight, if any.

        Raises:
            BackendError: the backend cannot work with these options.
        """
        if self.preflight is not None:
            self.preflight(options)

    def credentials(self, endpoint: "Endpoint | None" = None) -> str | None:
        """Where the credential comes from ('ANTHROPIC_API_KEY'), 'none needed', or None when it is missing."""
        return self.transport(endpoint or {}).credentials() if self.transport is not None else "none needed"


class RegistryError(Exception):
    """A backend that cannot be found or loaded; one line naming it."""


def _entry_points() -> dict[str, str]:
    """Third-party backends declared by installed packages: name -> 'module:attribute'."""
    try:
        found = metadata.entry_points(group=GROUP)
    except Exception:  # noqa: BLE001 - a broken distribution's metadata must not stop the CLI
        return {}
    return {ep.name: ep.value for ep in found}


def names() -> list[str]:
    """Every backend name: built-ins first, then third-party ones in name order."""
    extra = sorted(n for n in _entry_points() if n not in BUILTIN)
    return [*BUILTIN, *extra]


def _load(name: str, target: str) -> BackendSpec:
    module_name, _, attribute = target.partition(":")
    try:
        spec = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"backend {name!r} ({target}) cannot be loaded: {exc}") from None
    if not isinstance(spec, BackendSpec):
        raise RegistryError(f"backend {name!r} ({target}) is not a BackendSpec")
    return spec


def get(name: str) -> BackendSpec:
    """The spec of backend `name`.

    Raises:
        RegistryError: no such backend, or its entry point does not load.
    """
    target = BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        raise RegistryError(f"agent {name!r} is not available in this build (available: {', '.join(names())})")
    return _load(name, target)


def default_name() -> str:
    """The backend `run` uses without --agent: the first of DEFAULT_ORDER whose credentials are present."""
    for name in DEFAULT_ORDER:
        if get(name).credentials() is not None:
            return name
    return DEFAULT_ORDER[-1]


def missing_packages(spec: BackendSpec) -> list[str]:
    """The packages of spec.requires that are not installed (or blocked: None in sys.modules)."""
    import importlib.util

    return [p for p in spec.requires if sys.modules.get(p) is None and importlib.util.find_spec(p) is None]
