"""Differential fuzzing against onnxruntime (issue 55, item 6), part of the fault suite.

Small generated ONNX graphs (``graph_fuzz.py``) are compiled with ``compile_model`` and run;
onnxruntime runs the same file. Valid graphs must give the same outputs (NaN where
onnxruntime has NaN, the same infinities, finite values within a bound derived from float32
rounding and the reduction lengths); graphs onnxruntime refuses must be refused with a
``TunecacheError``, never another exception and never run. Derandomised: CI sees the same
examples every time. ``benchmarks/fuzz_onnxruntime.py`` runs thousands of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from fault_support import fuzzed
from graph_fuzz import FuzzCase, valid_cases
from graph_fuzz_invalid import invalid_cases
from graph_fuzz_judge import INF_FROM_FINITE, Outcome, run_case
from hypothesis import HealthCheck, given, settings

from tunecache.cache.store import Store

pytestmark = pytest.mark.fault

FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

KNOWN: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # why: (ops one of which the graph holds, what may differ)
    "Clip with no max fuses as Relu, so +inf stays inf where ONNX clamps to the largest "
    "float (docs/ONNX.md, differential fuzzing: a deliberate difference)": (
        frozenset({"Clip"}), frozenset({INF_FROM_FINITE})),
}
"""Explained differences (docs/ONNX.md): an example passes with one only when its graph has
one of the ops and every difference is of those kinds."""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Store]:
    """A folder for the model files and a throwaway store, shared by the examples."""
    path = tmp_path_factory.mktemp("fuzz_onnxruntime")
    return path, Store(path / "store")


def _known(case: FuzzCase, outcome: Outcome) -> str | None:
    ops = {node.op_type for node in case.model.graph.node}
    for issue, (culprits, kinds) in KNOWN.items():
        if ops & culprits and set(outcome.kinds) <= kinds:
            return issue
    return None


@given(valid_cases(max_steps=4))
@settings(FUZZ, max_examples=300)
def test_valid_graphs_agree_with_onnxruntime(workspace: tuple[Path, Store],
                                             case: FuzzCase) -> None:
    fuzzed("onnx graph vs onnxruntime")
    outcome = run_case(case, *workspace)
    if outcome.verdict == "ort-refused-valid":
        # onnxruntime's session-time shape inference keeps a ceil-mode pool's last window
        # that its kernel drops; any other refusal is the generator's fault
        assert any(a.name == "ceil_mode" and a.i for n in case.model.graph.node
                   for a in n.attribute), f"{case.describe()}\n{outcome.detail}"
    if outcome.verdict == "disagree":
        assert _known(case, outcome), f"{case.describe()}\n{outcome.detail}"


@given(invalid_cases())
@settings(FUZZ, max_examples=200)
def test_graphs_onnxruntime_refuses_are_refused(workspace: tuple[Path, Store],
                                                case: FuzzCase) -> None:
    fuzzed("invalid onnx graph vs onnxruntime")
    outcome = run_case(case, *workspace)
    assert outcome.verdict in ("agree", "ort-accepted-invalid"), \
        f"{case.describe()}\n{outcome.detail}"
