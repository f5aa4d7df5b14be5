"""Fuzzed bad input, part of the fault suite: every op text, schedule and hardware spec
either works or is refused with a tunecache error, never another exception.

Derived from valid inputs by mutation (the shapes users get wrong: huge, zero and negative
numbers, missing and unknown keys, wrong types, truncation) and from arbitrary text. Runs
are derandomised, so CI sees the same examples every time.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from fault_support import fuzzed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds import all_kinds
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json

pytestmark = pytest.mark.fault

HW = local_spec()
EXAMPLE_TEXTS = sorted(text for kind in all_kinds() for text in kind.examples)
EXAMPLES = [OpSignature.parse(text) for text in EXAMPLE_TEXTS]
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

number_texts = st.one_of(
    st.integers(min_value=-3, max_value=70).map(str),
    st.sampled_from(["0", "-1", str(2**31), str(2**63), "9" * 4301, "1e3", "0x10", " 7", "٣"]),
)
json_values = st.one_of(
    st.integers(min_value=-3, max_value=70), st.sampled_from([2**31, 2**63, 10**30]),
    st.floats(allow_nan=True), st.booleans(), st.none(),
    st.text(max_size=8), st.lists(st.integers(-2, 9), max_size=4),
)


def _splice(text: str, at: int, cut: int, insert: str) -> str:
    at %= len(text) + 1
    return text[:at] + insert + text[at + cut:]


@st.composite
def mutated_op_texts(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(EXAMPLE_TEXTS))
    how = draw(st.sampled_from(["number", "splice", "kind", "key"]))
    if how == "number":
        key = draw(st.sampled_from(sorted({k for op in EXAMPLES for k, _ in op.dims})))
        value = draw(number_texts)
        return text.replace(f"{key}=", f"{key}={value},{key}=", 1) if draw(st.booleans()) \
            else _splice(text, text.find(f"{key}=") + len(key) + 1, 1, value)
    if how == "splice":
        return _splice(text, draw(st.integers(0, 200)), draw(st.integers(0, 5)),
                       draw(st.text(alphabet="(),=+x-_ 0123456789abcdefz", max_size=6)))
    if how == "kind":
        return draw(st.sampled_from(["", "Matmul", "conv3d", "softmax", "pool2d"])) + \
            text[text.index("("):]
    return text.replace(")", f",{draw(st.sampled_from(['epilogue', 'dtype', 'layout', 'bogus']))}"
                                 f"={draw(st.text(max_size=5))})")


@given(st.one_of(mutated_op_texts(), st.text(max_size=60)))
@FUZZ
def test_op_text_parses_or_is_refused(text: str) -> None:
    fuzzed("op text")
    try:
        op = OpSignature.parse(text)
    except TunecacheError:
        return
    assert OpSignature.parse(op.text) == op
    assert op.flops >= 0
    assert all(arg.shape for arg in op.arguments())


@st.composite
def mutated_schedules(draw: st.DrawFn) -> tuple[OpSignature, str]:
    op = draw(st.sampled_from(EXAMPLES))
    data: dict[str, Any] = json.loads(default_schedule(op, HW).to_json())
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["value", "drop", "add"]))
        key = draw(st.sampled_from(sorted(data) or ["x"]))
        if how == "value":
            data[key] = draw(json_values)
        elif how == "drop":
            data.pop(key, None)
        else:
            data[draw(st.text(min_size=1, max_size=6))] = draw(json_values)
    text = json.dumps(data)
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return op, text


@given(mutated_schedules())
@FUZZ
def test_schedule_json_is_validated_before_code_is_generated(case: tuple[OpSignature, str]
                                                             ) -> None:
    op, text = case
    fuzzed("schedule")
    try:
        schedule = schedule_from_json(text, op.kind)
    except TunecacheError:
        return
    found = problems(op, schedule, HW)
    if not found:
        source = generate(op, schedule, HW)
        assert "tc_kernel" in source.code


def test_deeply_nested_schedule_json_is_refused() -> None:
    with pytest.raises(TunecacheError):
        schedule_from_json("[" * 100_000 + "]" * 100_000, "matmul")


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(HW.to_json())
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(data)))
        how = draw(st.sampled_from(["value", "drop", "unknown"]))
        if how == "value":
            data[key] = draw(st.one_of(json_values, st.sampled_from(
                ["avx512", "avx2", "generic", "neon", "x86-64", ""])))
        elif how == "drop":
            data.pop(key)
        else:
            data["l4_bytes"] = draw(json_values)
    return data


@given(mutated_specs())
@FUZZ
def test_hardware_spec_is_valid_or_refused(data: dict[str, Any]) -> None:
    fuzzed("hardware spec")
    try:
        spec = HardwareSpec.from_json(json.dumps(data))
    except TunecacheError:
        return
    assert HardwareSpec.from_json(spec.to_json()) == spec
    assert spec.hw_id.startswith(f"{spec.arch}-{spec.isa}-")


# -- ONNX graphs -----------------------------------------------------------------------------

_UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Sqrt", "Erf", "Softmax",
          "Identity", "Flatten", "GlobalAveragePool", "LRN", "NoSuchOp"]


@st.composite
def onnx_graphs(draw: st.DrawFn) -> Any:
    """Small models from a random sequence of ops with random attributes and operand
    shapes: most are wrong somewhere (shapes, ranks, attributes, op types)."""
    from onnx_support import Builder

    b = Builder(draw(st.sampled_from([9, 13, 17])), seed=draw(st.integers(0, 9)))
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    x = b.input("x", shape)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["unary", "binary", "matmul", "conv", "pool", "reshape",
                                   "transpose", "concat"]))
        dims = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
        if op == "unary":
            name = draw(st.sampled_from(_UNARY))
            attrs = {"size": draw(st.integers(-1, 5))} if name == "LRN" else {}
            if name in ("Softmax", "Flatten"):
                attrs["axis"] = draw(st.integers(-5, 5))
            x = b.node(name, [x], **attrs)
        elif op == "binary":
            other = b.weight(*dims) if draw(st.booleans()) else x
            x = b.node(draw(st.sampled_from(["Add", "Mul", "Sub", "Div"])), [x, other])
        elif op == "matmul":
            x = b.node("MatMul", [x, b.weight(*dims)])
        elif op == "conv":
            k = draw(st.integers(1, 4))
            x = b.node("Conv", [x, b.weight(draw(st.integers(1, 4)), draw(st.integers(1, 4)),
                                           k, k)],
                       strides=[draw(st.integers(0, 3))] * 2,
                       pads=[draw(st.integers(-1, 3))] * 4,
                       group=draw(st.integers(0, 3)))
        elif op == "pool":
            k = draw(st.integers(0, 4))
            x = b.node(draw(st.sampled_from(["MaxPool", "AveragePool"])), [x],
                       kernel_shape=[k, k], strides=[draw(st.integers(0, 3))] * 2,
                       ceil_mode=draw(st.integers(0, 1)))
        elif op == "reshape":
            x = b.node("Reshape", [x, b.ints(draw(st.lists(st.integers(-2, 8), max_size=4)))])
        elif op == "transpose":
            x = b.node("Transpose", [x], perm=draw(st.permutations(range(len(dims)))))
        else:
            x = b.node("Concat", [x, b.weight(*dims)], axis=draw(st.integers(-4, 4)))
    return b.model([x])


@given(onnx_graphs())
@settings(FUZZ, max_examples=120)
def test_onnx_graph_loads_and_runs_or_is_refused(model: Any) -> None:
    from tunecache.compiler.executor import Executor
    from tunecache.compiler.frontend import load_graph

    fuzzed("onnx graph")
    try:
        graph = load_graph(model)
    except TunecacheError:
        return
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in graph.inputs}
    try:
        Executor(graph).run(feeds)
    except TunecacheError:
        return
