"""workbench.pyast: parses take turns across threads (CPython 3.11's AST converter fails when they overlap)."""

import ast
import re
import threading
import time

import pytest

from workbench import pyast


def test_parses_from_many_threads_never_overlap(monkeypatch):
    """Four threads parse at once; the real parse is slowed down so that any overlap would be seen."""
    inside, most = [0], [0]
    guard = threading.Lock()
    real = ast.parse

    def slow_parse(source, filename="<unknown>", mode="exec"):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        try:
            return real(source, filename=filename, mode=mode)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(pyast.ast, "parse", slow_parse)
    start = threading.Barrier(4)

    def work():
        start.wait()
        for _ in range(5):
            pyast.parse("x = 1\n")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_parse_is_ast_parse():
    source = "def f(a):\n    return a + 1\n"
    assert ast.dump(pyast.parse(source, "f.py")) == ast.dump(ast.parse(source, filename="f.py"))
    assert isinstance(pyast.parse("2 * B", mode="eval"), ast.Expression)
    with pytest.raises(SyntaxError) as err:
        pyast.parse("def (:\n", "bad.py")
    assert err.value.filename == "bad.py"


def test_workbench_parses_only_through_pyast():
    """A parse elsewhere would bring the overlap back (the pool's threads check candidates, tasks, rooflines)."""
    root = pyast.__file__.rsplit("/", 1)[0]
    from pathlib import Path

    call = re.compile(r"(?<![\w.])ast\.parse\(")
    direct = [str(p) for p in Path(root).rglob("*.py") if p.name != "pyast.py" and call.search(p.read_text())]
    assert direct == []
