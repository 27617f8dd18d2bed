"""Sessions on disk: session.toml (checkpoint), events.jsonl (journal), attempts/ and inbox/."""

from workbench.session.atomic import write_toml_atomic
from workbench.session.store import SCHEMA_VERSION, SessionError, SessionFiles, SessionStore

__all__ = ["SCHEMA_VERSION", "SessionError", "SessionFiles", "SessionStore", "write_toml_atomic"]
