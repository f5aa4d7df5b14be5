"""ONNX's backend node tests through tunecache: every one matches, or is listed.

All of onnx's backend node tests (``tests/onnx_conformance.py`` runs and judges each), in
chunks so that xdist spreads them. An unlisted test must match; one listed in
``tests/data/onnx_conformance_expected.txt`` must be refused cleanly (never a wrong answer
or a crash), and one that matches now must leave the file, which only shrinks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("onnx")

from onnx_conformance import node_cases, read_expected, run_case

CHUNKS = 16


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_backend_node_tests(chunk: int, tmp_path: Path) -> None:
    names = sorted(node_cases())[chunk::CHUNKS]
    expected = read_expected()
    problems = []
    for name in names:
        verdict = run_case(node_cases()[name], "tunecache", tmp_path / "store")
        if name in expected:
            if verdict.verdict == "match":
                problems.append(f"{name} matches now: take it out of the expected-failures "
                                "file")
            elif verdict.verdict != "refused":
                problems.append(f"{name}: {verdict.verdict} ({verdict.why}); listed as "
                                f"refused: {expected[name]}")
        elif verdict.verdict != "match":
            problems.append(f"{name}: {verdict.verdict}: {verdict.why}")
    assert not problems, "\n".join(problems)


def test_expected_failures_are_tests_with_reasons() -> None:
    expected = read_expected()
    cases = node_cases()
    assert not [n for n in expected if n not in cases], "listed tests onnx does not have"
    assert all(reason for reason in expected.values()), "every listed test needs its reason"
