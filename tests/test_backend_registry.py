"""Backends come from the registry: the built-in table, then the `workbench.backends` entry points."""

from __future__ import annotations

import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from workbench import cli
from workbench.agent.backends import registry
from workbench.agent.backends.tuner import TunerBackend
from workbench.agent.evaluation import FunctionEvaluator
from workbench.agent.slots import evaluator_pool

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "fixtures" / "tasks"

THIRD_PARTY = '''
"""A third-party backend, as a package outside workbench would ship it."""

from workbench.agent.backends.base import Finish, StepBackend, ToolCall
from workbench.agent.backends.registry import BackendSpec


class Echo(StepBackend):
    name = "echo"

    def next_action(self, state, task):
        return ToolCall("read_task") if state.tool_calls == 0 else Finish("echo: read the task, nothing else to do")

    def acknowledge(self, nudge, state, task):
        return "echo: noted"


class Locked:
    """A transport whose credential is never there."""

    name = "locked"
    credential_hint = "LOCKED_API_KEY set"

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def credentials(self):
        return None


SPEC = BackendSpec("echo", "reads the task and stops", lambda options: Echo(options.seed_source))
LOCKED = BackendSpec("locked", "needs a key", lambda options: Echo(options.seed_source), transport=Locked)
IMPOSTOR = BackendSpec("claude", "not the real one", lambda options: Echo(options.seed_source))
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Pretend a package declares entry points in the workbench.backends group (name -> value)."""
    (tmp_path / "wb_echo_backend.py").write_text(textwrap.dedent(THIRD_PARTY))
    monkeypatch.syspath_prepend(str(tmp_path))
    declared: dict[str, str] = {}

    def entry_points(**selection):
        assert selection == {"group": registry.GROUP}
        return [metadata.EntryPoint(name, value, registry.GROUP) for name, value in declared.items()]

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    yield declared
    sys.modules.pop("wb_echo_backend", None)


def test_pyproject_declares_the_built_in_table():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][registry.GROUP] == registry.BUILTIN


def test_built_ins_work_without_any_installed_entry_points(installed):
    assert registry.names() == ["tuner", "claude", "openai"]
    backend = registry.get("tuner").create(registry.BackendOptions(model=None, seed_source="x = 1\n"))
    assert isinstance(backend, TunerBackend) and backend.seed_source == "x = 1\n"
    assert registry.get("tuner").credentials() == "none needed"


def test_a_third_party_backend_is_found_and_runs_through_the_cli(installed, tmp_path, monkeypatch, capsys):
    installed["echo"] = "wb_echo_backend:SPEC"
    assert registry.names() == ["tuner", "claude", "openai", "echo"]
    monkeypatch.setenv("WORKBENCH_KERNELS", str(TASKS))
    monkeypatch.setattr("workbench.fleet.make_pool", lambda task, device, **ignored: evaluator_pool(
        [FunctionEvaluator(lambda *a, **k: {}, device)], task, device))
    sessions = tmp_path / "sessions"
    code = cli.main(["run", "tiny", "--agent", "echo", "--headless", "--device", "cpu",
                     "--sessions-dir", str(sessions)])
    out = capsys.readouterr().out
    assert code == 0 and "stopped: echo: read the task" in out
    assert cli.main(["show", out.splitlines()[0], "--json", "--sessions-dir", str(sessions)]) == 0
    assert '"agent": "echo"' in capsys.readouterr().out


def test_a_built_in_name_cannot_be_taken_over(installed):
    installed["claude"] = "wb_echo_backend:IMPOSTOR"
    assert registry.names() == ["tuner", "claude", "openai"]
    assert registry.get("claude").description.startswith("Claude through the Anthropic")


def test_a_broken_entry_point_is_one_line_and_no_session(installed, tmp_path, capsys):
    installed["ghost"] = "wb_no_such_module:SPEC"
    installed["locked"] = "wb_echo_backend:LOCKED"
    sessions = tmp_path / "sessions"
    assert cli.main(["run", "softmax", "--agent", "ghost", "--headless", "--sessions-dir", str(sessions)]) == 2
    assert "backend 'ghost' (wb_no_such_module:SPEC) cannot be loaded" in capsys.readouterr().err
    # what the registry says a backend needs is checked before a session is made
    assert cli.main(["run", "softmax", "--agent", "locked", "--headless", "--sessions-dir", str(sessions)]) == 2
    assert capsys.readouterr().err.strip() == ("workbench: the locked agent needs LOCKED_API_KEY set; or run the "
                                               "offline tuner with --agent tuner")
    assert not sessions.exists()


@pytest.mark.parametrize(("variable", "agent"), [("ANTHROPIC_API_KEY", "claude"), ("ANTHROPIC_AUTH_TOKEN", "claude"),
                                                  (None, "tuner")])
def test_the_default_agent_follows_the_one_credential_check(variable, agent, monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    if variable:
        monkeypatch.setenv(variable, "sk-test")
    assert registry.default_name() == agent
