"""compute-sanitizer log parsing (the run itself needs a GPU: benchmarks/RESULTS.md records it on the H200)."""

import pytest

from workbench.evaluator import sanitizer

CLEAN = """========= COMPUTE-SANITIZER
========= ERROR SUMMARY: 0 errors
"""

DIRTY = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at _softmax_tile+0x1d0
=========     by thread (31,0,0) in block (7,0,0)
=========     Address 0x7f00001000 is out of bounds
========= Invalid __global__ read of size 4 bytes
========= ERROR SUMMARY: 1,024 errors
"""

RACES = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at _k+0x90 and Read access at _k+0x120 [512 hazards]
========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)
"""


def test_clean_run_counts_zero():
    assert sanitizer.parse(CLEAN) == {"errors": 0, "problems": []}


def test_errors_are_counted_with_their_first_lines():
    found = sanitizer.parse(DIRTY)
    assert found["errors"] == 1024
    assert found["problems"][0] == "Invalid __global__ read of size 4 bytes"
    assert len(found["problems"]) == 2


def test_racecheck_hazards():
    found = sanitizer.parse(RACES)
    assert found["errors"] == 3
    assert "Race reported" in found["problems"][0]


@pytest.mark.parametrize("text, fragment", [("", "no error summary"),
                                            ("========= Device not supported\n", "cannot instrument")])
def test_no_summary_is_one_clear_error(text, fragment):
    with pytest.raises(sanitizer.SanitizerError, match=fragment):
        sanitizer.parse(text)


def test_unknown_tool_and_missing_binary(tmp_path):
    with pytest.raises(sanitizer.SanitizerError, match="unknown sanitizer tool"):
        sanitizer.run("softmax", tmp_path / "k.py", "S1", tool="leakcheck")
    with pytest.raises(sanitizer.SanitizerError, match="could not start"):
        sanitizer.run("softmax", tmp_path / "k.py", "S1", exe=str(tmp_path / "no-such-sanitizer"))
