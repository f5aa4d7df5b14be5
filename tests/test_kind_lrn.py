"""The ``lrn`` kind (ONNX LRN): signature, the reference against the definition, the
executor's numpy LRN and onnxruntime, the legal space, ``VLOG``, and generated kernels on
every runnable ISA and layout against the float64 reference (outputs NaN-poisoned and
misaligned, so an unwritten element or a padding lane left unwritten fails); then a small
Conv -> Relu -> LRN -> MaxPool model compiled end to end."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_support import build_all, cached_kernel, poisoned_run_problem, sampled

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.backends.cpu.clib import c_library
from tunecache.compiler.backends.cpu.isa import BASE_FLAGS, dialect
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.layouts import LAYOUTS, NCHW, from_layout, to_layout
from tunecache.compiler.kinds.lrn import (
    BLOCKED_PIXELS,
    PLAIN_PIXELS,
    VEC_CHOICES,
    LrnSchedule,
    default_lrn_schedule,
    lrn_op,
    window,
)
from tunecache.compiler.onnx_ops import implementation
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs, reference
from tunecache.compiler.schedule import problems, schedule_from_json, validate

HW = local_spec()
ISAS = runnable_isas(HW)
T2 = min(2, HW.cores)
Case = tuple[OpSignature, LrnSchedule, HardwareSpec]


def naive_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN straight from the ONNX definition, one channel at a time (float64, NCHW)."""
    y = np.empty_like(x, dtype=np.float64)
    channels = x.shape[1]
    for c in range(channels):
        first = max(0, c - (size - 1) // 2)
        last = min(channels - 1, c + -(-(size - 1) // 2))
        total = (x[:, first:last + 1].astype(np.float64) ** 2).sum(axis=1)
        y[:, c] = x[:, c] / (bias + alpha / size * total) ** beta
    return y


def _layouts(hw: HardwareSpec) -> list[str]:
    """The layouts kernels on ``hw`` can take (a block is whole vectors)."""
    return [layout for layout in LAYOUTS
            if not problems(lrn_op(1, 1, 1, 1, 1, layout=layout),
                            LrnSchedule(pixels=default_pixels(layout)), hw)]


def default_pixels(layout: str) -> int:
    return PLAIN_PIXELS[0] if layout == NCHW else BLOCKED_PIXELS[0]


def coefficients(alpha: float = 2.0, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    return np.array([alpha, beta, bias], dtype=np.float32)


def _run(cases: list[Case], coef: np.ndarray | None = None, every_isa: bool = False) -> None:
    """Every case on the machine's ISA, one in six on lower ones (all with ``every_isa``);
    X from ``random_inputs`` (zero padding lanes), ``coef`` (or the kind's) as the
    coefficients."""
    cases = cases if every_isa else sampled(cases)
    build_all(cases)
    failures = []
    for i, (op, s, hw) in enumerate(cases):
        x, default = random_inputs(op, seed=i)
        inputs = (x, default if coef is None else coef)
        problem = poisoned_run_problem(cached_kernel(op, s, hw), op, inputs, offset=i % 3)
        if problem:
            failures.append(f"{hw.isa} {op.text} {s} coef={inputs[1].tolist()}: {problem}")
    assert not failures, "\n".join(failures)


# -- signature ------------------------------------------------------------------------------


def test_text_arguments_and_flops() -> None:
    op = lrn_op(2, 20, 5, 7, 5, layout="nchw8c")
    assert op.text == "lrn(N=2,C=20,H=5,W=7,size=5,dtype=float32,layout=nchw8c,epilogue=none)"
    assert OpSignature.parse(op.text) == op
    assert OpSignature.parse("lrn(N=1,C=3,H=2,W=2,size=3)") == lrn_op(1, 3, 2, 2, 3)
    assert [(a.name, a.shape) for a in op.arguments()] == [
        ("X", (2, 3, 5, 7, 8)), ("coef", (3,)), ("Y", (2, 3, 5, 7, 8))]
    assert op.flops == 2 * 20 * 5 * 7 * (2 * 5 + 4)
    assert set(op_kind("lrn").dim_columns) == {name for name, _ in op.dims}
    assert window(5) == (2, 2) and window(4) == (1, 2) and window(1) == (0, 0)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: lrn_op(1, 4, 2, 2, 0), "dim size=0 is out of range"),
    (lambda: lrn_op(1, 4, 2, 2, 3, layout="nhwc"), "expected one of nchw, nchw8c, nchw16c"),
    (lambda: OpSignature.parse("lrn(N=1,C=4,H=2,W=2,size=3,epilogue=relu)"),
     "'relu' is not supported"),
])
def test_invalid_signatures_name_the_problem(make: Callable[[], OpSignature],
                                             message: str) -> None:
    with pytest.raises(OpSignatureError, match=message):
        make()


# -- reference ------------------------------------------------------------------------------


@given(st.integers(1, 2), st.integers(1, 21), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 25), st.sampled_from(LAYOUTS), st.sampled_from([0.75, 0.5, 1.3]))
@settings(max_examples=80, deadline=None)
def test_reference_matches_the_definition(n: int, c: int, h: int, w: int, size: int,
                                          layout: str, beta: float) -> None:
    op = lrn_op(n, c, h, w, size, layout=layout)
    x = random_inputs(op, seed=size)[0].astype(np.float64)
    coef = coefficients(1.5, beta, 2.0).astype(np.float64)
    got = reference(op, (x, coef))
    assert got.shape == x.shape
    plain = from_layout(x, layout, c)
    np.testing.assert_allclose(from_layout(got, layout, c),
                               naive_lrn(plain, size, *(float(v) for v in coef)),
                               rtol=1e-12, atol=0)
    assert np.array_equal(got, to_layout(from_layout(got, layout, c), layout))  # zero padding


@pytest.mark.parametrize("size", [1, 2, 4, 5, 9])
def test_float32_reference_is_the_executors_lrn(size: int) -> None:
    """The kind's float32 reference is the numpy LRN a model without kernels runs."""
    op = lrn_op(2, 7, 3, 4, size)
    x = random_inputs(op, seed=2)[0]
    attrs = {"size": size, "alpha": 0.3, "beta": 0.6, "bias": 1.2}
    lrn = implementation("LRN")
    assert lrn is not None
    expected = lrn([x], attrs, 13)[0]
    got = op_kind("lrn").reference(op, (x, coefficients(0.3, 0.6, 1.2)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=2e-6)


@pytest.mark.parametrize(("shape", "size", "beta"), [
    ((1, 7, 3, 3), 5, 0.75), ((2, 3, 4, 2), 9, 0.6), ((1, 16, 2, 5), 1, 1.0),
    ((1, 5, 1, 1), 3, 0.5),
])
def test_reference_matches_onnxruntime(shape: tuple[int, int, int, int], size: int,
                                       beta: float) -> None:
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    node = helper.make_node("LRN", ["X"], ["Y"], size=size, alpha=2.0, beta=beta, bias=1.5)
    graph = helper.make_graph(
        [node], "lrn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    op = lrn_op(*shape, size)
    x = random_inputs(op, seed=3)[0]
    expected = session.run(None, {"X": x})[0]
    got = op_kind("lrn").reference(op, (x, coefficients(2.0, beta, 1.5)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


# -- legal space ----------------------------------------------------------------------------


def test_illegal_schedules_name_the_problem() -> None:
    plain, blocked = lrn_op(1, 16, 4, 4, 5), lrn_op(1, 16, 4, 4, 5, layout="nchw16c")
    hw = HW.with_isa("avx2")
    assert problems(plain, LrnSchedule(pixels=3, vec=3, threads=99), hw) == [
        "vec=3; expected one of 1, 2, 4",
        "pixels=3; expected one of 64, 256, 1024, 4096 for layout=nchw (pixels of each plane "
        "per tile)",
        f"threads=99 out of range 1..{hw.cores} ({hw.cores} cores)",
    ]
    assert problems(blocked, LrnSchedule(pixels=64), hw) == [
        "pixels=64; expected one of 1, 2, 4, 8 for layout=nchw16c (pixels staged per tile)"]
    avx512 = HW.with_isa("avx512")
    assert problems(lrn_op(1, 16, 4, 4, 5, layout="nchw8c"), LrnSchedule(pixels=4), avx512) == [
        "layout nchw8c needs avx512 vectors that divide its 8-channel blocks (16 lanes do not); "
        "use nchw16c on avx512"]
    with pytest.raises(ScheduleError, match="pixels=3"):
        validate(plain, LrnSchedule(pixels=3), hw)


def test_default_schedules_are_legal_and_round_trip() -> None:
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for layout in _layouts(hw):
            op = lrn_op(1, 96, 55, 55, 5, layout=layout)
            for threads in (1, T2):
                s = default_lrn_schedule(op, hw, threads)
                assert not problems(op, s, hw) and s.threads == threads
                assert schedule_from_json(s.to_json(), "lrn") == s
    # a small plane gets tiles enough for every thread
    small = lrn_op(1, 8, 9, 9, 5)
    assert default_lrn_schedule(small, HW, 1).pixels == 1024
    assert default_lrn_schedule(small, HW, 2).pixels == 64


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(LAYOUTS, LAYOUTS)))
def test_relayout_keeps_one_layout(src: str, dst: str) -> None:
    kind = op_kind("lrn")
    assert kind.layout_slots is not None and kind.relayout is not None
    op = lrn_op(1, 32, 4, 4, 5)
    assert kind.layout_slots(op) == ("in", None)
    moved = kind.relayout(op, src, dst)
    assert (moved is None) == (src != dst)
    assert moved is None or moved == lrn_op(1, 32, 4, 4, 5, layout=src)


# -- VLOG (isa.py) ------------------------------------------------------------------------------

_LOG_TEST = """
void vlog_all(const float *x, float *y, long n) {
  for (long i = 0; i + LANES <= n; i += LANES) VSTOREU(y + i, VLOG(VLOADU(x + i)));
}
"""


@pytest.mark.parametrize("isa", ISAS)
def test_vlog_is_accurate_over_the_normal_range(isa: str) -> None:
    d = dialect(isa)
    code = d.prelude + d.log + f"#define LANES {d.lanes}\n" + _LOG_TEST
    vlog_all = c_library(code, BASE_FLAGS + d.flags).function(
        "vlog_all", ("ptr", "ptr", "long"), "void")
    x = np.concatenate([np.geomspace(1.2e-38, 3e38, 100_000),
                        np.linspace(0.5, 2.0, 50_000), np.linspace(0.999, 1.001, 10_000),
                        [1.0, 2.0, 0.5, np.sqrt(2.0), np.sqrt(0.5)]]).astype(np.float32)
    x = np.concatenate([x, np.ones(-x.size % 16, np.float32)])
    y = np.empty_like(x)
    vlog_all(x, y, x.size)
    truth = np.log(x.astype(np.float64))
    big = np.abs(truth) >= 1
    ulp = np.spacing(np.abs(truth).astype(np.float32)).astype(np.float64)
    assert (np.abs(y - truth)[big] / ulp[big]).max() <= 1.0
    assert np.abs(y - truth)[~big].max() <= 5e-8
    assert y[np.flatnonzero(x == 1.0)].tolist() == [0.0] * int((x == 1.0).sum())


# -- kernels --------------------------------------------------------------------------------

SHAPES = [
    (1, 20, 5, 7, 5),    # AlexNet's window; C fills no block (8- and 16-channel tails)
    (2, 7, 3, 5, 4),     # even size (one channel more above); C below one block
    (1, 3, 4, 4, 9),     # size > C: clipped on both sides
    (1, 16, 3, 3, 1),    # size 1: each channel alone; whole blocks
    (1, 33, 2, 9, 2),    # even size 2 (the window is c..c+1), three 16-channel blocks
    (1, 40, 13, 11, 5),  # 143 pixels: several 64-pixel tiles, the last one ragged
]


def test_shapes_with_default_schedules_on_every_isa_and_layout() -> None:
    cases: list[Case] = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for i, (shape, layout) in enumerate(itertools.product(SHAPES, _layouts(hw))):
            op = lrn_op(*shape, layout=layout)
            cases.append((op, default_lrn_schedule(op, hw, 1 + i % T2), hw))
    _run(cases)


def _variants(op: OpSignature, hw: HardwareSpec) -> list[LrnSchedule]:
    """Every ``pixels`` choice of the op's layout and every ``vec``, threads alternating."""
    choices = PLAIN_PIXELS if op.attr("layout") == NCHW else BLOCKED_PIXELS
    return [LrnSchedule(pixels=choices[i % 4], vec=VEC_CHOICES[i % 3], threads=1 + i % T2)
            for i in range(6)]


@pytest.mark.parametrize("isa", ISAS)
def test_every_schedule_variant(isa: str) -> None:
    hw = HW.with_isa(isa)
    cases: list[Case] = []
    for layout in _layouts(hw):
        # 200 pixels: ragged 64-pixel and 8-pixel tiles; 36 channels: a ragged last block
        op = lrn_op(2, 36, 10, 20, 5, layout=layout)
        variants = _variants(op, hw)
        assert {s.vec for s in variants} == set(VEC_CHOICES)
        assert {s.pixels for s in variants} == set(
            PLAIN_PIXELS if layout == NCHW else BLOCKED_PIXELS)
        cases += [(op, s, hw) for s in variants]
    _run(cases, every_isa=True)


@pytest.mark.parametrize("beta", [0.5, 1.0, 0.6, 2.25])
def test_any_beta_takes_the_log_path(beta: float) -> None:
    """Every beta but 0.75 is x * exp(-beta * ln t), with small and large bias."""
    cases: list[Case] = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for layout in _layouts(hw):
            op = lrn_op(1, 20, 3, 7, 5, layout=layout)
            cases.append((op, default_lrn_schedule(op, hw, T2), hw))
    _run(cases, coefficients(3.0, beta, 0.25))
    _run(cases, coefficients(1e-4, beta, 40.0))


def test_avx512_kernels_compile() -> None:
    """AVX-512 code is at least built (run where the CPU has it, above)."""
    hw = HW.with_isa("avx512")
    for layout in ("nchw", "nchw16c"):
        op = lrn_op(1, 20, 5, 7, 5, layout=layout)
        assert build(generate(op, default_lrn_schedule(op, hw, T2), hw)).path.exists()


# -- end to end ------------------------------------------------------------------------------


def test_conv_relu_lrn_maxpool_model_runs_lrn_as_a_kernel(tmp_path: Path) -> None:
    """AlexNet's conv -> LRN -> pool -> conv chain: the LRN is a generated kernel on the
    layout its neighbours use (no reorder), and the model equals onnxruntime."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx_support import Builder, assert_close, ort_run, random_feeds

    from tunecache.cache.store import Store
    from tunecache.compiler.layout_plan import blocked_layout
    from tunecache.tuner.deploy import compile_model

    b = Builder(13, seed=7)
    x = b.input("x", [1, 3, 15, 15])
    y = b.node("Relu", [b.conv(x, 3, 32, 5, stride=2, name="conv")], name="relu")
    y = b.node("LRN", [y], size=5, alpha=0.5, beta=0.75, bias=1.0, name="lrn")
    y = b.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], name="pool")
    y = b.conv(y, 32, 8, 3, name="conv2")
    model = b.model([y], "alexnet_head")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic",
                             record_wanted=False)
    assert not compiled.graph.onnx_nodes
    [lrn] = [k for k in compiled.graph.kernel_nodes if k.name == "lrn"]
    layout = blocked_layout(compiled.hw) or NCHW
    assert lrn.op.kind == "lrn" and lrn.op.attr("layout") == layout
    assert [k.op.kind for k in compiled.graph.kernel_nodes] == ["conv2d", "lrn", "pool2d",
                                                                "conv2d"]
    feeds = random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [y])
    profile = compiled.profile(feeds, 1)
    assert {s.step.where for s in profile.steps} == {"kernel"}
    assert [s.step.op for s in profile.steps if s.step.node == "lrn"] == ["lrn"]
