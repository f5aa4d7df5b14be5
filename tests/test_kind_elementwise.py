"""The elementwise kind: chain signatures, operand broadcasting, the numpy reference against
scalar ``math``, and generated kernels on every runnable ISA against the float64 reference
(outputs NaN-poisoned, so an unwritten element fails)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kernel_support import examples, poisoned_run_problem, sampled

import tunecache.compiler.kinds.elementwise as ew
from tunecache.compiler.backends.cpu.build import Artifact, build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.elementwise import (
    ElementwiseSchedule,
    default_elementwise_schedule,
    elementwise_op,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import load_kernel, random_inputs, reference
from tunecache.compiler.schedule import problems, schedule_from_json

HW = local_spec()
ISAS = tuple(isa for isa in runnable_isas(HW) if isa in ("avx2", "generic"))
T2 = min(2, HW.cores)
STEPS = ew.BINARY_STEPS + ew.UNARY_STEPS
# Shapes with 1-sized dims, odd sizes, rows shorter than a vector and rows of many vectors.
SHAPES = [(1, 1), (3, 5), (7, 33), (2, 1000), (64, 3), (5, 17), (1, 131)]

Case = tuple[OpSignature, ElementwiseSchedule, HardwareSpec]
PLAIN_OPERANDS = tuple(o for o in ew.OPERANDS if not o[3:].isdigit())
"""Operands that broadcast on any shape (``col{x}`` needs rows of whole x-channel pixels)."""
BLOCK_OPERANDS = tuple(o for o in ew.OPERANDS if o not in PLAIN_OPERANDS)
CHAINS_FOR_REFERENCE = [("mul+add+relu", "row"), ("add+gelu_erf+mul", "col"),
                        ("sub+abs+sqrt+div", "scalar"), ("tanh+mul+clip6+silu", "full")]


def make_inputs(op: OpSignature, seed: int = 0, scale: float = 1.0) -> tuple[np.ndarray, ...]:
    """X standard normal (times ``scale``); operands of magnitude 0.5..2 with random signs,
    so ``div`` stays well conditioned."""
    rng = np.random.default_rng(seed)
    args = [a for a in op.arguments() if a.role == "input"]
    x = (rng.standard_normal(args[0].shape) * scale).astype(np.float32)
    others = [(rng.uniform(0.5, 2.0, a.shape) * rng.choice([-1.0, 1.0], a.shape)).astype(np.float32)
              for a in args[1:]]
    return (x, *others)


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0


MATH: dict[str, Callable[..., float]] = {
    "add": lambda v, b: v + b, "sub": lambda v, b: v - b, "mul": lambda v, b: v * b,
    "div": lambda v, b: v / b,
    "relu": lambda v: max(v, 0.0), "sigmoid": _sigmoid, "tanh": math.tanh,
    "gelu_erf": lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))),
    "gelu_tanh": lambda v: 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi)
                                                      * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v * _sigmoid(v), "exp": math.exp, "neg": lambda v: -v, "abs": abs,
    "sqrt": math.sqrt, "clip6": lambda v: min(max(v, 0.0), 6.0),
    "max": max, "min": min, "erf": math.erf,
    "qround": lambda v: float(np.rint(min(max(v, -2.0**22), 2.0**22))),
    "hardswish": lambda v: v * min(max(v / 6 + 0.5, 0.0), 1.0),
    "hardsigmoid": lambda v: min(max(v / 6 + 0.5, 0.0), 1.0),
    "prelu": lambda v, b: v if v > 0 else v * b,
    "elu": lambda v, b: v if v > 0 else b * math.expm1(v),
    "softplus": lambda v: max(v, 0.0) + math.log1p(math.exp(-abs(v))),
    "mish": lambda v: v * math.tanh(max(v, 0.0) + math.log1p(math.exp(-abs(v)))),
}


def scalar_chain(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The chain element by element with Python's math (float64)."""
    x = inputs[0]
    m, n = x.shape
    # Operand values per element: full [i, j], row [j], col [i], scalar [0], col{x}
    # [i*x + j mod x].
    block = ew.operand_block(op)
    index = {"full": lambda i, j: (i, j), "row": lambda i, j: (j,), "col": lambda i, j: (i,),
             "scalar": lambda i, j: (0,)}.get(op.attr("operand"),
                                              lambda i, j: (i * block + j % block,))
    y = np.empty(x.shape)
    for i, j in itertools.product(range(m), range(n)):
        v = float(x[i, j])
        operands = iter(inputs[1:])
        for step in op.epilogue:
            if step in ew.BINARY_STEPS:
                v = MATH[step](v, float(next(operands)[index(i, j)]))
            else:
                v = MATH[step](v)
        y[i, j] = v
    return y


def _build_all(cases: list[Case]) -> list[Artifact]:
    with ThreadPoolExecutor(2) as workers:
        return list(workers.map(lambda c: build(generate(*c)), cases))


def _check(op: OpSignature, artifact: Artifact, inputs: tuple[np.ndarray, ...],
           offset: int = 0) -> str | None:
    """Run into a NaN-poisoned output (``offset`` floats into its buffer, to misalign it),
    compare with the float64 reference, then call again."""
    return poisoned_run_problem(load_kernel(op, artifact), op, inputs, offset)


def _run(cases: list[Case], seed: int = 3) -> None:
    failures = []
    cases = sampled(cases)
    for n, ((op, s, hw), art) in enumerate(zip(cases, _build_all(cases), strict=True)):
        problem = _check(op, art, make_inputs(op, seed), offset=n % 3)
        if problem:
            failures.append(f"{hw.isa} {op.text} {s}: {problem}")
    assert not failures, "\n".join(failures)


def _variants(hw: HardwareSpec) -> list[ElementwiseSchedule]:
    return [ElementwiseSchedule(vec=v, unroll=u, nt=nt, threads=t)
            for v, u, nt, t in itertools.product(ew.VEC_CHOICES, ew.UNROLL_CHOICES, (0, 1), (1, T2))]


# -- signature ------------------------------------------------------------------------------


def test_chains_repeat_and_reorder_and_round_trip() -> None:
    op = elementwise_op(8, 16, "add+relu+mul+add+relu", operand="row")
    assert op.epilogue == ("add", "relu", "mul", "add", "relu")
    assert OpSignature.parse(op.text) == op
    assert op.text == "elementwise(M=8,N=16,dtype=float32,operand=row,epilogue=add+relu+mul+add+relu)"
    assert elementwise_op(8, 16, "relu+add") != elementwise_op(8, 16, "add+relu")
    copy = OpSignature.parse("elementwise(M=2,N=3)")
    assert copy.epilogue == () and copy.attr("operand") == "full"
    assert copy.arguments()[0].shape == (2, 3) and len(copy.arguments()) == 2


@pytest.mark.parametrize(("make", "message"), [
    (lambda: elementwise_op(2, 3, "add+gelu"), "step 'gelu' is not supported; expected a '\\+'-"
                                               "joined chain of add, sub"),
    (lambda: elementwise_op(2, 3, "relu", operand="row"), "operand=row has no effect without"),
    (lambda: elementwise_op(2, 3, "relu+" * 16 + "relu"), "17 steps; at most 16"),
    (lambda: elementwise_op(2, 3, "add", operand="diag"), "expected one of full, row, col, scalar"),
])
def test_invalid_signatures_name_the_problem(make: Callable[[], OpSignature], message: str) -> None:
    with pytest.raises(OpSignatureError, match=message):
        make()


@pytest.mark.parametrize(("operand", "shape"), [
    ("full", (4, 6)), ("row", (6,)), ("col", (4,)), ("scalar", (1,)),
])
def test_arguments_follow_the_operand_broadcast(operand: str, shape: tuple[int, ...]) -> None:
    op = elementwise_op(4, 6, "add+relu+mul+sigmoid+div", operand=operand)
    args = op.arguments()
    assert [a.name for a in args] == ["X", "B1", "B2", "B3", "Y"]
    assert [a.role for a in args] == ["input"] * 4 + ["output"]
    assert all(a.shape == shape for a in args[1:4])
    assert args[0].shape == args[-1].shape == (4, 6)
    assert op.flops == 4 * 6 * 5
    assert op.min_bytes == 4 * (2 * 24 + 3 * int(np.prod(shape)))


def test_random_inputs_keep_div_and_sqrt_well_defined() -> None:
    op = elementwise_op(40, 50, "div+mul+sqrt", operand="row")
    x, b1, b2 = random_inputs(op, seed=1)
    assert x.dtype == b1.dtype == np.float32 and b1.shape == (50,)
    assert np.all(x > 0) and np.all(np.abs(b1) >= 0.5) and np.all(b2 > 0)
    assert np.all(np.isfinite(reference(op, (x, b1, b2))))
    signed = random_inputs(elementwise_op(40, 50, "div", operand="full"), seed=1)
    assert (signed[0] < 0).any() and (signed[1] < 0).any() and np.all(np.abs(signed[1]) >= 0.5)


def test_copy_counts_one_flop_per_element() -> None:
    assert elementwise_op(5, 7).flops == 35
    assert op_kind("elementwise").dim_columns == {"M": "dim_m", "N": "dim_n"}


# -- reference ------------------------------------------------------------------------------


def _single_steps() -> list[tuple[str, str]]:
    """Every unary step (sqrt on an abs), every binary step with every broadcast."""
    return [(f"abs+{step}" if step == "sqrt" else step, operand)
            for step in STEPS
            for operand in (PLAIN_OPERANDS if step in ew.BINARY_STEPS else ("full",))]


@pytest.mark.parametrize(("chain", "operand"), _single_steps() + CHAINS_FOR_REFERENCE)
def test_reference_matches_scalar_math(chain: str, operand: str) -> None:
    op = elementwise_op(3, 5, chain, operand=operand)
    inputs = make_inputs(op, seed=4, scale=3.0)
    expected = scalar_chain(op, inputs)
    np.testing.assert_allclose(reference(op, inputs), expected, rtol=1e-12, atol=1e-12)
    got32 = op_kind("elementwise").reference(op, inputs)
    assert got32.dtype == np.float32 and got32.shape == (3, 5)
    np.testing.assert_allclose(got32, expected, rtol=1e-5, atol=1e-5)


# -- kernels --------------------------------------------------------------------------------


def test_every_step_and_broadcast() -> None:
    cases: list[Case] = []
    n = 0
    for isa in ISAS:
        hw = HW.with_isa(isa)
        variants = _variants(hw)
        for chain, operand in _single_steps():
            m, k = SHAPES[n % len(SHAPES)]
            cases.append((elementwise_op(m, k, chain, operand=operand),
                          variants[(7 * n) % len(variants)], hw))
            n += 1
    _run(cases)


CHAINS = [
    ("mul+add+relu", "row"),
    ("add+gelu_erf+mul", "col"),
    ("sub+abs+sqrt+div", "scalar"),
    ("neg+exp+add+sigmoid", "full"),
    ("tanh+mul+clip6+silu", "row"),
    ("gelu_tanh+add+add+relu", "col"),
    ("add+relu+add+relu", "full"),
    ("div+tanh+sub", "row"),
    ("none", "full"),
]


def test_fixed_chains_on_every_shape() -> None:
    cases: list[Case] = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for n, ((chain, operand), (m, k)) in enumerate(itertools.product(CHAINS, SHAPES[:4])):
            s = default_elementwise_schedule(elementwise_op(m, k, chain, operand=operand), hw,
                                             threads=1 + n % T2)
            cases.append((elementwise_op(m, k, chain, operand=operand), s.replace(nt=n % 2), hw))
    _run(cases)


@pytest.mark.parametrize("isa", ISAS)
def test_every_schedule_variant(isa: str) -> None:
    hw = HW.with_isa(isa)
    op = elementwise_op(7, 37, "add+relu+mul", operand="row")
    assert all(not problems(op, s, hw) for s in _variants(hw))
    _run([(op, s, hw) for s in _variants(hw)])


@pytest.mark.parametrize("isa", ISAS)
def test_rows_shorter_than_a_vector(isa: str) -> None:
    # Vectors cross rows: their row/col operand lanes are gathered one by one.
    hw = HW.with_isa(isa)
    cases: list[Case] = []
    for operand, (m, k) in itertools.product(("row", "col"), ((13, 3), (5, 1), (9, hw.lanes + 1))):
        op = elementwise_op(m, k, "mul+add", operand=operand)
        for s in (ElementwiseSchedule(vec=1), ElementwiseSchedule(vec=4, nt=1, threads=T2)):
            cases.append((op, s, hw))
    _run(cases)


@pytest.mark.parametrize("operand", BLOCK_OPERANDS)
def test_per_channel_operand_of_blocked_rows(operand: str) -> None:
    # Rows of whole x-channel pixels (a squeeze-excitation gate on nchw{x}c activations):
    # the reference against scalar math, then kernels on every ISA, every vector count,
    # one and two threads, rows of one pixel and of many.
    x = int(operand[3:])
    op = elementwise_op(3, 5 * x, "mul+add+sigmoid", operand=operand)
    inputs = make_inputs(op, seed=2)
    assert op.arguments()[1].shape == (3 * x,)
    np.testing.assert_allclose(reference(op, inputs), scalar_chain(op, inputs), rtol=1e-12,
                               atol=1e-12)
    cases: list[Case] = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for m, pixels in ((1, 1), (4, 3), (6, 37)):
            blocked = elementwise_op(m, pixels * x, "mul+silu", operand=operand)
            cases += [(blocked, ElementwiseSchedule(vec=v, unroll=u, threads=t), hw)
                      for v, u, t in itertools.product(ew.VEC_CHOICES, (1, 4), (1, T2))]
    _run(cases)


def test_per_channel_operand_needs_whole_pixels_and_plain_stores() -> None:
    with pytest.raises(OpSignatureError, match="N a multiple of 8"):
        elementwise_op(2, 12, "mul", operand="col8")
    op = elementwise_op(2, 16, "mul", operand="col8")
    assert any("nt=1" in p for p in problems(op, ElementwiseSchedule(nt=1), HW))
    assert not default_elementwise_schedule(elementwise_op(1 << 20, 64, "mul", operand="col8"),
                                            HW).nt


def test_a_column_operand_follows_its_tensor_into_a_blocked_layout() -> None:
    kind = op_kind("elementwise")
    assert kind.relayout is not None
    gate = elementwise_op(2 * 32, 49, "mul", operand="col")  # [N=2, C=32, 7, 7] x [2, 32, 1, 1]
    blocked = kind.relayout(gate, "nchw8c", "nchw8c")
    assert blocked == elementwise_op(2 * 4, 49 * 8, "mul", operand="col8")
    assert kind.relayout(gate, "nchw", "nchw") == gate
    assert kind.relayout(gate, "nchw", "nchw8c") is None
    row = elementwise_op(64, 49, "add", operand="row")
    assert kind.relayout(row, "nchw8c", "nchw8c") is None
    # Element for element: the blocked op on blocked bytes is the plain op on plain bytes.
    x, b = make_inputs(gate, seed=1)
    plain = reference(gate, (x, b))
    to_blocked = x.reshape(2, 4, 8, 49).transpose(0, 1, 3, 2).reshape(8, 392)
    got = reference(blocked, (to_blocked, b)).reshape(2, 4, 49, 8).transpose(0, 1, 3, 2)
    np.testing.assert_allclose(got.reshape(64, 49), plain, rtol=0, atol=0)


@st.composite
def chains(draw: st.DrawFn) -> OpSignature:
    # sqrt only on an abs (no NaN), never after a sum whose cancellation it would magnify;
    # no qround, whose jumps turn float32's rounding of earlier steps into whole units
    # (test_qround_is_exact checks it on its own).
    steps = [s for s in STEPS if s not in ("sqrt", "qround")]
    chain = draw(st.lists(st.sampled_from(steps), min_size=1, max_size=4))
    if draw(st.booleans()):
        chain = ["abs", "sqrt", *chain]
    operand = (draw(st.sampled_from(PLAIN_OPERANDS)) if set(chain) & set(ew.BINARY_STEPS)
               else "full")
    m, n = draw(st.integers(1, 9)), draw(st.integers(1, 70))
    return elementwise_op(m, n, tuple(chain), operand=operand)


@given(chains(), st.data())
@settings(max_examples=examples(25), deadline=None)
def test_random_chains_and_schedules(op: OpSignature, data: st.DataObject) -> None:
    hw = HW.with_isa(data.draw(st.sampled_from(ISAS)))
    s = data.draw(st.sampled_from(_variants(hw)))
    inputs = make_inputs(op, seed=data.draw(st.integers(0, 100)))
    with np.errstate(all="ignore"):
        expected = reference(op, inputs)
    assume(bool(np.all(np.isfinite(expected))) and float(np.abs(expected).max()) < 1e6)
    problem = _check(op, build(generate(op, s, hw)), inputs, offset=data.draw(st.integers(0, 3)))
    assert problem is None, f"{hw.isa} {op.text} {s}: {problem}"


@pytest.mark.parametrize("step", ["sigmoid", "silu", "tanh", "exp", "gelu_erf", "gelu_tanh"])
def test_activations_at_large_magnitudes(step: str) -> None:
    op = elementwise_op(2, 50, step)
    x = np.concatenate([np.linspace(-100, 100, 50), np.linspace(-8, 8, 50)])
    x = x.reshape(2, 50).astype(np.float32)
    if step == "exp":
        x = np.clip(x, -80, 80)  # e**88 saturates (documented); stay inside float32 range
    out = load_kernel(op, build(generate(op, ElementwiseSchedule(), HW)))(x)
    expected = np.array([MATH[step](float(v)) for v in x.reshape(-1)]).reshape(x.shape)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, rtol=2e-6, atol=1e-6)


def test_avx512_kernels_compile() -> None:
    # Not runnable on every host; gcc still checks the AVX-512 spelling of the vocabulary.
    hw = HW.with_isa("avx512")
    for chain, operand in CHAINS[:6]:
        op = elementwise_op(3, 40, chain, operand=operand)
        assert build(generate(op, ElementwiseSchedule(vec=4, nt=1, threads=T2), hw)).path.exists()


# -- schedules and the C step table ---------------------------------------------------------


def test_illegal_schedules_list_every_problem() -> None:
    op = elementwise_op(4, 4, "add")
    bad = ElementwiseSchedule(vec=3, unroll=0, nt=5, threads=HW.cores + 1)
    found = problems(op, bad, HW)
    assert len(found) == 4, found
    text = "; ".join(found)
    for message in ("vec=3; expected one of 1, 2, 4", "unroll=0; expected one of 1, 2, 4",
                    "nt=5 must be 0 or 1", f"threads={HW.cores + 1} out of range"):
        assert message in text
    with pytest.raises(ScheduleError, match="illegal schedule for elementwise"):
        generate(op, bad, HW)


def test_schedule_json_round_trip_and_defaults() -> None:
    s = ElementwiseSchedule(vec=4, unroll=2, nt=1, threads=2)
    assert schedule_from_json(s.to_json()) == s and s.to_dict()["family"] == "elementwise"
    assert schedule_from_json("{}", kind="elementwise") == ElementwiseSchedule()
    big = elementwise_op(HW.l3_bytes // 4 // 1000 + 1, 1000, "add")
    assert default_elementwise_schedule(big, HW).nt == 1
    assert default_elementwise_schedule(elementwise_op(64, 64, "add"), HW).nt == 0
    for chain, operand in CHAINS:
        for (m, k), threads in itertools.product(SHAPES, (1, T2)):
            op = elementwise_op(m, k, chain, operand=operand)
            assert not problems(op, default_elementwise_schedule(op, HW, threads), HW)


def test_step_table() -> None:
    assert ew.step_c("relu", "a") == "{ vec u = a; a = VRELU(u); }"
    assert ew.step_c("add", "a0", "VLOADU(b1)") == "{ vec u = a0, b = VLOADU(b1); a0 = VADD(u, b); }"
    assert all(ew.step_c(step, "a", "b1") for step in STEPS)
    with pytest.raises(ValueError, match="needs an operand"):
        ew.step_c("mul", "a")
    with pytest.raises(ValueError, match="unknown elementwise step 'gelu'"):
        ew.step_c("gelu", "a")


def test_examples_with_default_schedules_compute_the_reference() -> None:
    cases: list[Case] = []
    for text in op_kind("elementwise").examples:
        op = OpSignature.parse(text)
        assert OpSignature.parse(op.text) == op and op.flops > 0
        cases.append((op, default_elementwise_schedule(op, HW, threads=T2), HW))
    _run(cases)


def _run_on(isa: str, op: OpSignature, *arrays: np.ndarray) -> np.ndarray:
    hw = HW.with_isa(isa)
    return load_kernel(op, build(generate(op, ElementwiseSchedule(), hw)))(*arrays)


@pytest.mark.parametrize("isa", runnable_isas(HW))
def test_qround_is_exact(isa: str) -> None:
    # Ties go to even, saturation at 2**22 (both signs), large and infinite values.
    values = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e-8, 0.49999997, 254.5, -127.5, 3e6 + 0.5,
              5e6, -9e6, 1e30, -np.inf, np.inf, 0.0, -0.0]
    x = np.array(values * 3, dtype=np.float32)[:50].reshape(2, 25)
    got = _run_on(isa, elementwise_op(2, 25, "qround"), x)
    expected = np.rint(np.clip(x.astype(np.float64), -2.0**22, 2.0**22))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("isa", runnable_isas(HW))
def test_a_quantize_dequantize_pair_lands_on_onnxruntime_grid(isa: str) -> None:
    # div s, max lo-z, min hi-z, qround, mul s: QuantizeLinear then DequantizeLinear (u8).
    scale, zero = np.float32(0.02), 117.0
    op = elementwise_op(3, 40, "div+max+min+qround+mul", operand="scalar")
    x = (np.random.default_rng(0).standard_normal((3, 40)) * 3).astype(np.float32)
    x[0, :4] = np.array([2.5, 3.5, -2.5, 100.0], np.float32) * scale
    operands = [np.array([v], np.float32) for v in (scale, -zero, 255 - zero, scale)]
    got = _run_on(isa, op, x, *operands)
    q = np.clip(np.rint(x / scale) + zero, 0, 255)
    np.testing.assert_array_equal(got, ((q - zero) * scale).astype(np.float32))
