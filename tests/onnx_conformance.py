"""ONNX's backend node tests run through tunecache (or onnxruntime), one verdict per test.

The ``onnx`` package generates its backend node tests in Python
(``onnx.backend.test.case.node.collect_testcases``: one small model per operator variant, with
inputs and the expected outputs). :func:`run_case` compiles a test's model with tunecache
(``compile_model``, the analytic policy, a private store) and runs every data set; the
outputs must match the expected ones the way onnx's own backend runner asks: the same dtype
and shape, and values within the test's ``rtol``/``atol`` (NaN equal to NaN). The verdict is
one of :data:`VERDICTS`:

* ``match``: every output of every data set matches;
* ``wrong``: it ran and an output differs (the one verdict that must never happen);
* ``refused``: tunecache refused the model with its own error (``TunecacheError``), naming
  what it does not run;
* ``crash``: any other exception (a bug: tunecache's API raises its own error types).

``tests/test_onnx_conformance.py`` runs a subset in CI against
``tests/data/onnx_conformance_expected.txt``; ``benchmarks/onnx_conformance.py`` runs them all,
with onnxruntime's verdicts beside ours.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

VERDICTS = ("match", "wrong", "refused", "crash")
EXPECTED = Path(__file__).resolve().parent / "data" / "onnx_conformance_expected.txt"
RANDOM = frozenset({"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform",
                    "RandomUniformLike", "Multinomial"})
"""Ops whose outputs are random draws: a test of one matches on dtype and shape."""
FLOAT_TYPES = frozenset({1, 10, 11, 16})
"""``TensorProto`` float, float16, double, bfloat16."""


@dataclass(frozen=True)
class Verdict:
    """One test's outcome: its verdict and, unless it matched, why (one line)."""

    name: str
    op: str
    verdict: str
    why: str = ""


@cache
def node_cases() -> dict[str, Any]:
    """Every backend node test of the installed onnx, by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own casts overflow on purpose
        return {case.name: case for case in collect_testcases(None)}


@cache
def _op_names() -> dict[str, str]:
    import onnx

    return {s.name.lower(): s.name for s in onnx.defs.get_all_schemas_with_history()}


def op_of(case: Any) -> str:
    """The op a test exercises, from its name (``test_reduce_max_empty_set`` is
    ``ReduceMax``; an ``_expanded`` test's model holds the op's function body instead)."""
    key = case.name.removeprefix("test_").replace("_", "").lower()
    names = _op_names()
    best = max((n for n in names if key.startswith(n)), key=len, default="")
    if best:
        return names[best]
    return str(case.model.graph.node[-1].op_type) if case.model.graph.node else "?"


def is_float(case: Any) -> bool:
    """Whether every output of the test is a floating-point tensor."""
    outputs = case.model.graph.output
    return all(o.type.HasField("tensor_type") and o.type.tensor_type.elem_type in FLOAT_TYPES
               for o in outputs)


def read_expected(path: Path = EXPECTED) -> dict[str, str]:
    """The expected-failures file: ``name  reason`` lines, ``#`` comments."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, reason = line.partition(" ")
            out[name] = reason.strip()
    return out


def _difference(expected: np.ndarray, got: Any, rtol: float, atol: float,
                values: bool = True) -> str | None:
    got = np.asarray(got)
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if not values:
        return None
    if expected.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4): compare as float64
        expected, got = expected.astype(np.float64), got.astype(np.float64)
    if expected.dtype.kind in "fc":
        close = np.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
            return f"{int((~close).sum())} value(s) differ, max |error| {np.nanmax(err):.3g}"
        return None
    if not np.array_equal(got, expected):
        return f"{int((got != expected).sum())} value(s) differ"
    return None


def _array(value: Any) -> Any:
    """A test's tensor as a numpy array (the data holds numpy scalars, and TensorProtos for
    the types numpy lacks); sequences and optionals stay as they are."""
    import onnx

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value) if isinstance(value, np.generic) else value


def _one_line(exc: BaseException) -> str:
    text = re.sub(r"\s+", " ", f"{type(exc).__name__}: {exc}")
    return text[:300]


def run_case(case: Any, engine: str, store: Path) -> Verdict:
    """Run one test with ``engine`` (``tunecache`` or ``onnxruntime``) and judge it."""
    op = op_of(case)
    try:
        run = _tunecache(case, store) if engine == "tunecache" else _onnxruntime(case)
    except Exception as exc:
        return Verdict(case.name, op, _refusal(exc, engine), _one_line(exc))
    names = [o.name for o in case.model.graph.output]
    for inputs, expected in case.data_sets:
        try:
            got = run([_array(x) for x in inputs])
        except Exception as exc:
            return Verdict(case.name, op, _refusal(exc, engine), _one_line(exc))
        for name, want, value in zip(names, expected, got, strict=False):
            want = _array(want)
            if not isinstance(want, np.ndarray):
                return Verdict(case.name, op, "refused", f"{name}: not a tensor output")
            # A random op's output is a draw of its own: only its type and shape can match.
            problem = _difference(want, value, case.rtol, case.atol,
                                  values=op not in RANDOM)
            if problem:
                return Verdict(case.name, op, "wrong", f"{name}: {problem}")
    return Verdict(case.name, op, "match")


def _refusal(exc: BaseException, engine: str) -> str:
    if engine == "tunecache":
        from tunecache.compiler.errors import TunecacheError

        return "refused" if isinstance(exc, TunecacheError) else "crash"
    return "refused"  # onnxruntime's errors are all its own exception types


def _tunecache(case: Any, store: Path) -> Any:
    from tunecache.compiler.frontend import read_model_bytes
    from tunecache.tuner.deploy import compile_model

    source = read_model_bytes(case.model.SerializeToString(), case.name)
    compiled = compile_model(source, store=str(store), policy="analytic", record_wanted=False)
    names = [i.name for i in case.model.graph.input]

    def run(inputs: Sequence[Any]) -> list[Any]:
        outputs = compiled.run(dict(zip(names, inputs, strict=True)))
        return [outputs[o.name] for o in case.model.graph.output]
    return run


def _onnxruntime(case: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(case.model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(inputs: Sequence[Any]) -> list[Any]:
        return list(session.run(None, dict(zip(names, inputs, strict=True))))
    return run
