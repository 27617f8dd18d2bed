"""Reading and rewriting a kernel's TUNABLES/CONFIG, and the tuner's search and nudge pins."""

import pytest

from workbench.agent.tunables import TunablesError, config_key, grid, neighbours, read_declared, with_config

SOURCE = '''"""k"""
import triton

TUNABLES = {"BLOCK": [16, 32, 64], "num_warps": [1, 2, 4]}
CONFIG = {
    "BLOCK": 32,
    "num_warps": 2,
}  # current


def forward(x):
    return x
'''


def test_read_declared():
    declared = read_declared(SOURCE)
    assert declared.space == {"BLOCK": [16, 32, 64], "num_warps": [1, 2, 4]}
    assert declared.config == {"BLOCK": 32, "num_warps": 2}


def test_with_config_changes_only_the_literal():
    new = with_config(SOURCE, {"BLOCK": 64, "num_warps": 4})
    assert read_declared(new).config == {"BLOCK": 64, "num_warps": 4}
    assert new.startswith('"""k"""\nimport triton\n')
    assert new.endswith("}  # current\n\n\ndef forward(x):\n    return x\n")


@pytest.mark.parametrize("bad,match", [
    ("CONFIG = {}\n", "TUNABLES"),
    ("TUNABLES = {'A': [1]}\nCONFIG = dict(A=1)\n", "literal"),
    ("TUNABLES = {'A': [1]}\nCONFIG = {'A': 2}\n", "not one of"),
    ("TUNABLES = {'A': []}\nCONFIG = {}\n", "non-empty"),
    ("def f(:\n", "line 1"),
])
def test_bad_declarations(bad, match):
    with pytest.raises(TunablesError, match=match):
        read_declared(bad)


def test_grid_and_neighbours():
    space = {"a": [1, 2, 3], "b": ["x", "y"]}
    assert len(list(grid(space))) == 6
    assert list(neighbours(space, {"a": 1, "b": "x"})) == [{"a": 2, "b": "x"}, {"a": 3, "b": "x"},
                                                            {"a": 1, "b": "y"}]
    assert config_key({"a": 1, "b": 2}) == config_key({"b": 2, "a": 1})
