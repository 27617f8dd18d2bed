"""The core never imports textual or rich: each core module is imported in a fresh interpreter to prove it."""

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import workbench

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("textual", "rich", "anthropic", "openai", "watchfiles")


def core_modules() -> list[str]:
    names = ["workbench.cli", "workbench.config"]
    for info in pkgutil.walk_packages(workbench.__path__, "workbench."):
        if info.name.startswith("workbench.ui") or info.name in names:
            continue
        names.append(info.name)
    return sorted(names)


def test_core_modules_load_without_textual_rich_or_network_clients():
    modules = core_modules()
    assert "workbench.journal" in modules and "workbench.evaluator" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"core imported: {out.stdout.strip()}"


HEAVY = ("torch", "triton", "numpy", "textual", "rich", "anthropic", "openai", "ray", "watchfiles")


def test_cli_help_is_fast_and_headless():
    # `workbench --help` (and any command's argument parsing) must not pay for torch, the TUI or an SDK: on the
    # GPU box some are missing, and on any box they cost seconds.
    code = (
        "import json, sys, time\n"
        "start = time.perf_counter()\n"
        "from workbench import cli\n"
        "try:\n"
        "    cli.main(['run', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "seconds = time.perf_counter() - start\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps({'seconds': seconds, 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy"] == [], f"--help imported {report['heavy']}"
    # torch alone takes seconds to import; parsing the arguments takes a few tens of milliseconds
    assert report["seconds"] < 1.0, f"--help took {report['seconds']:.2f} s"


def test_a_headless_tuner_run_needs_neither_sdk(tmp_path):
    # As on the GPU box, where neither model SDK is installed: None in sys.modules makes `import openai` fail.
    sessions = tmp_path / "sessions"
    code = (
        "import sys\n"
        "sys.modules['openai'] = sys.modules['anthropic'] = None\n"
        "from workbench import cli\n"
        f"common = ['--headless', '--device', 'cpu', '--sessions-dir', {str(sessions)!r}]\n"
        "print('openai exit', cli.main(['run', 'tiny', '--agent', 'openai', '--base-url', 'http://127.0.0.1:9/v1',"
        " *common]), flush=True)\n"
        "print('tuner exit', cli.main(['run', 'tiny', '--agent', 'tuner', '--max-iterations', '1', *common]))\n"
    )
    env = {**os.environ, "WORKBENCH_KERNELS": str(ROOT / "tests" / "fixtures" / "tasks")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert "openai exit 2" in out.stdout and "tuner exit 0" in out.stdout, out.stdout + out.stderr
    assert out.stderr.strip() == "workbench: the openai agent needs the openai package (pip install openai)"
    assert "stopped: budget: max iterations (1) reached" in out.stdout
