"""The pool2d kind: signature rules, output sizes (ONNX ceil_mode), the numpy reference
against a naive loop and onnxruntime, and generated kernels on every runnable ISA against the
float64 reference (outputs NaN-poisoned, so an unwritten element fails)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kernel_support import examples, poisoned_run_problem, sampled

import tunecache.compiler.kinds.pool2d as pool
from tunecache.compiler.backends.cpu.build import Artifact, build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.pool2d import Pool2dSchedule, default_pool2d_schedule, pool2d_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import load_kernel, random_inputs, reference
from tunecache.compiler.schedule import problems, schedule_from_json

HW = local_spec()
ISAS = tuple(isa for isa in runnable_isas(HW) if isa in ("avx2", "generic"))
T2 = min(2, HW.cores)

Case = tuple[OpSignature, Pool2dSchedule, HardwareSpec]


def naive_pool(op: OpSignature, x: np.ndarray) -> np.ndarray:
    """Pooling straight from the definition, one window at a time (float64)."""
    d = op.dims_dict
    avg = op.attr("mode") == "avg"
    n, c, h, w = x.shape
    y = np.zeros((n, c, op.out_h, op.out_w))
    for p, q in itertools.product(range(op.out_h), range(op.out_w)):
        taps, count = [], 0
        for r, s in itertools.product(range(d["R"]), range(d["S"])):
            i = p * d["stride_h"] - d["pad_t"] + r * d["dil_h"]
            j = q * d["stride_w"] - d["pad_l"] + s * d["dil_w"]
            inside = 0 <= i < h and 0 <= j < w
            padded = -d["pad_t"] <= i < h + d["pad_b"] and -d["pad_l"] <= j < w + d["pad_r"]
            if inside:
                taps.append(x[:, :, i, j])
            count += inside or bool(d["count_include_pad"] and padded)
        assert taps, "every window overlaps the input"
        y[:, :, p, q] = np.sum(taps, axis=0) / count if avg else np.max(taps, axis=0)
    return np.maximum(y, 0) if "relu" in op.epilogue else y


@st.composite
def pool_ops(draw: st.DrawFn, max_size: int = 20) -> OpSignature:
    h, w = draw(st.integers(1, max_size)), draw(st.integers(1, max_size))
    r, s = draw(st.integers(1, min(h, 5))), draw(st.integers(1, min(w, 5)))
    mode = draw(st.sampled_from(pool.MODES))
    try:
        return pool2d_op(
            draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w, r, s, mode=mode,
            stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
            pads=(draw(st.integers(0, r - 1)), draw(st.integers(0, s - 1)),
                  draw(st.integers(0, r - 1)), draw(st.integers(0, s - 1))),
            dilation=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
            ceil_mode=draw(st.booleans()),
            count_include_pad=mode == "avg" and draw(st.booleans()),
            epilogue=draw(st.sampled_from(["none", "relu"])))
    except OpSignatureError:
        assume(False)
        raise


def _schedules(op: OpSignature, hw: HardwareSpec) -> list[Pool2dSchedule]:
    """Every legal schedule over the knobs' choices at one or two threads."""
    out = []
    for vec, unroll, nv, rows, nt, threads in itertools.product(
            pool.VEC_CHOICES, pool.UNROLL_CHOICES, pool.OW_VECTORS, pool.ROWS_CHOICES, (0, 1),
            (1, T2)):
        s = Pool2dSchedule(ow_block=nv * hw.lanes, vec=vec, unroll=unroll, rows=rows, nt=nt,
                           threads=threads)
        if not problems(op, s, hw):
            out.append(s)
    return out


def _variants(op: OpSignature, hw: HardwareSpec) -> list[Pool2dSchedule]:
    """Every legal combination of the knobs that shape the emitted code's structure
    (``ow_block``, ``rows``, ``nt``), each with ``vec``, ``unroll`` and ``threads`` cycling
    through their choices (those only change loop counts)."""
    out = []
    for i, (nv, rows, nt) in enumerate(itertools.product(pool.OW_VECTORS, pool.ROWS_CHOICES,
                                                         (0, 1))):
        s = Pool2dSchedule(ow_block=nv * hw.lanes, vec=pool.VEC_CHOICES[i % 3],
                           unroll=pool.UNROLL_CHOICES[i // 3 % 3], rows=rows, nt=nt,
                           threads=1 + i % T2)
        if not problems(op, s, hw):
            out.append(s)
    return out


def _build_all(cases: list[Case]) -> list[Artifact]:
    with ThreadPoolExecutor(2) as workers:
        return list(workers.map(lambda c: build(generate(*c)), cases))


def _check(op: OpSignature, artifact: Artifact, seed: int = 5, offset: int = 0) -> str | None:
    """Run into a NaN-poisoned output (``offset`` floats into its buffer, to misalign it),
    compare with the float64 reference, then call again."""
    return poisoned_run_problem(load_kernel(op, artifact), op, random_inputs(op, seed=seed), offset)


def _run(cases: list[Case]) -> None:
    failures = []
    cases = sampled(cases)
    for n, ((op, s, hw), art) in enumerate(zip(cases, _build_all(cases), strict=True)):
        problem = _check(op, art, offset=n % 3)
        if problem:
            failures.append(f"{hw.isa} {op.text} {s}: {problem}")
    assert not failures, "\n".join(failures)


# -- signature ------------------------------------------------------------------------------


def test_text_round_trip_and_defaults() -> None:
    op = pool2d_op(2, 64, 112, 112, 3, 3, stride=2, pads=(1, 1, 0, 1), ceil_mode=True,
                   mode="avg", count_include_pad=True, epilogue="relu")
    assert OpSignature.parse(op.text) == op
    assert op.text.startswith("pool2d(N=2,C=64,H=112,W=112,R=3,S=3,stride_h=2,stride_w=2,")
    assert "mode=avg" in op.text and "epilogue=relu" in op.text
    plain = OpSignature.parse("pool2d(N=1,C=8,H=7,W=7,R=7,S=7)")
    assert plain == pool.global_pool2d_op(1, 8, 7, 7, mode="max")
    assert plain.attr("mode") == "max" and plain.dim("ceil_mode") == 0
    assert pool.is_global(plain) and not pool.is_global(op)


@given(pool_ops())
@settings(max_examples=50, deadline=None)
def test_round_trip_of_random_ops(op: OpSignature) -> None:
    assert OpSignature.parse(op.text) == op
    assert op.arguments()[-1].shape == (op.dim("N"), op.dim("C"), op.out_h, op.out_w)
    assert set(op_kind("pool2d").dim_columns) == {name for name, _ in op.dims}


@pytest.mark.parametrize(("op", "out"), [
    (pool2d_op(1, 64, 112, 112, 3, 3, stride=2, pads=1), (56, 56)),          # ResNet stem pool
    (pool2d_op(1, 8, 7, 7, 2, 2, stride=2), (3, 3)),
    (pool2d_op(1, 8, 7, 7, 2, 2, stride=2, ceil_mode=True), (4, 4)),
    # ONNX backend test maxpool_2d_ceil_output_size_reduce_by_one: the window that would
    # start past the input is dropped.
    (pool2d_op(1, 1, 2, 2, 1, 1, stride=2, ceil_mode=True), (1, 1)),
    (pool2d_op(1, 1, 5, 5, 3, 3, stride=2, pads=1, ceil_mode=True), (3, 3)),
    (pool2d_op(1, 1, 6, 6, 3, 3, stride=2, pads=1, ceil_mode=True), (4, 4)),
    (pool2d_op(1, 1, 9, 9, 3, 3, stride=2, pads=(0, 0, 1, 1), dilation=2, ceil_mode=True), (4, 4)),
    (pool.global_pool2d_op(1, 2048, 7, 7), (1, 1)),
])
def test_output_sizes(op: OpSignature, out: tuple[int, int]) -> None:
    assert (op.out_h, op.out_w) == out
    assert op.arguments()[-1].shape == (op.dim("N"), op.dim("C"), *out)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: pool2d_op(1, 1, 4, 4, 2, 2, count_include_pad=True), "count_include_pad applies"),
    (lambda: OpSignature.parse("pool2d(N=1,C=1,H=4,W=4,R=2,S=2,ceil_mode=2)"), "ceil_mode=2"),
    (lambda: pool2d_op(1, 1, 4, 4, 6, 2), "larger than the padded input"),
    (lambda: pool2d_op(1, 1, 4, 4, 2, 2, pads=(3, 0, 0, 0)), "pools only padding"),
    (lambda: pool2d_op(1, 1, 4, 4, 2, 2, pads=(0, 0, 0, 3)), "pools only padding"),
    # dilation 2 steps over the single input column
    (lambda: pool2d_op(1, 1, 1, 1, 1, 2, pads=(0, 1, 0, 1), dilation=(1, 2)), "pools only padding"),
    (lambda: pool2d_op(1, 1, 4, 4, 2, 2, mode="min"), "expected one of max, avg"),
    (lambda: pool2d_op(1, 1, 4, 4, 2, 2, epilogue="bias"), "'bias' is not supported"),
])
def test_invalid_signatures_name_the_problem(make: Callable[[], OpSignature], message: str) -> None:
    with pytest.raises(OpSignatureError, match=message):
        make()


def test_flops_count_window_elements() -> None:
    op = pool2d_op(2, 3, 8, 8, 3, 3, stride=2, pads=1, epilogue="relu")
    assert op.flops == 2 * 3 * 4 * 4 * (9 + 1)
    assert op_kind("pool2d").reduction_length(op) == 1
    avg = pool2d_op(2, 3, 8, 8, 3, 3, mode="avg")
    assert op_kind("pool2d").reduction_length(avg) == 9


# -- reference ------------------------------------------------------------------------------


@given(pool_ops(max_size=12))
@settings(max_examples=150, deadline=None)
def test_reference_matches_the_definition(op: OpSignature) -> None:
    x = random_inputs(op, seed=1)[0].astype(np.float64)
    np.testing.assert_allclose(reference(op, (x,)), naive_pool(op, x), rtol=1e-12, atol=1e-12)


def test_float32_reference_keeps_the_dtype() -> None:
    op = pool2d_op(1, 2, 9, 9, 3, 3, stride=2, pads=1, mode="avg")
    x = random_inputs(op)[0]
    y = op_kind("pool2d").reference(op, (x,))
    assert y.dtype == np.float32 and y.flags.c_contiguous
    np.testing.assert_allclose(y, naive_pool(op, x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def _onnx_pool(op: OpSignature, x: np.ndarray) -> np.ndarray:
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    d = op.dims_dict
    avg = op.attr("mode") == "avg"
    attrs: dict[str, Any] = {"kernel_shape": [d["R"], d["S"]], "strides": [d["stride_h"], d["stride_w"]],
             "pads": [d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]],
             "dilations": [d["dil_h"], d["dil_w"]], "ceil_mode": d["ceil_mode"]}
    if avg:
        attrs["count_include_pad"] = d["count_include_pad"]
    node = helper.make_node("AveragePool" if avg else "MaxPool", ["X"], ["Y"], **attrs)
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"X": x})[0])


@pytest.mark.parametrize("op", [
    pool2d_op(1, 3, 12, 12, 3, 3, stride=2, pads=1),
    pool2d_op(1, 2, 7, 7, 2, 2, stride=2, ceil_mode=True),
    pool2d_op(1, 2, 8, 7, 3, 3, stride=2, pads=1, ceil_mode=True, mode="avg"),
    pool2d_op(1, 2, 8, 7, 3, 3, stride=2, pads=1, ceil_mode=True, mode="avg",
              count_include_pad=True),
    pool2d_op(1, 2, 6, 9, 3, 2, stride=(2, 3), pads=(2, 1, 2, 1), ceil_mode=True, mode="avg",
              count_include_pad=True),
    pool2d_op(1, 2, 2, 2, 1, 1, stride=2, ceil_mode=True),
    pool2d_op(1, 2, 11, 10, 3, 2, stride=2, pads=(1, 1, 2, 0), dilation=(2, 3)),
    pool2d_op(1, 2, 11, 10, 3, 2, stride=(1, 2), pads=(2, 1, 0, 1), dilation=2, mode="avg",
              ceil_mode=True),
    pool.global_pool2d_op(2, 3, 5, 6),
])
def test_reference_matches_onnxruntime(op: OpSignature) -> None:
    x = random_inputs(op, seed=2)[0]
    expected = _onnx_pool(op, x)
    got = op_kind("pool2d").reference(op, (x,))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# -- kernels --------------------------------------------------------------------------------

NAMED: list[tuple[str, OpSignature]] = [
    ("resnet maxpool 3x3/2 pad 1", pool2d_op(1, 4, 112, 112, 3, 3, stride=2, pads=1)),
    ("global avg 7x7", pool.global_pool2d_op(2, 37, 7, 7)),
    ("global max 7x7 relu", pool.global_pool2d_op(1, 5, 7, 7, mode="max", epilogue="relu")),
    ("global avg 1x1", pool.global_pool2d_op(1, 3, 1, 1)),
    ("global avg 56x56", pool.global_pool2d_op(1, 3, 56, 56)),
    ("1x1 window", pool2d_op(1, 2, 5, 3, 1, 1)),
    ("1x1 input", pool2d_op(3, 1, 1, 1, 1, 1, mode="avg")),
    ("inception avg 3x3/1 pad 1", pool2d_op(1, 3, 35, 35, 3, 3, pads=1, mode="avg")),
    ("inception avg 3x3/1 count pad", pool2d_op(1, 3, 17, 17, 3, 3, pads=1, mode="avg",
                                                count_include_pad=True)),
    ("vgg max 2x2/2", pool2d_op(1, 3, 28, 30, 2, 2, stride=2)),
    ("ceil max 3x3/2", pool2d_op(1, 2, 14, 15, 3, 3, stride=2, ceil_mode=True)),
    ("ceil avg 3x3/2 pad", pool2d_op(1, 2, 14, 15, 3, 3, stride=2, pads=1, ceil_mode=True,
                                     mode="avg")),
    ("ceil avg count pad", pool2d_op(2, 2, 9, 13, 3, 2, stride=2, pads=(1, 1, 2, 1),
                                     ceil_mode=True, mode="avg", count_include_pad=True)),
    ("narrow width below lanes", pool2d_op(1, 2, 9, 3, 2, 2, stride=1, mode="avg")),
    ("stride 3 (gathered lanes)", pool2d_op(1, 2, 20, 31, 3, 3, stride=3, pads=1, ceil_mode=True)),
    ("dilated", pool2d_op(1, 2, 17, 19, 3, 3, stride=(2, 1), pads=2, dilation=2, epilogue="relu")),
    ("tall window", pool2d_op(1, 2, 13, 4, 13, 1, mode="avg")),
    ("wide window", pool2d_op(1, 2, 4, 29, 1, 29, mode="max")),
]


def test_named_cases_with_default_schedules() -> None:
    cases: list[Case] = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for _, op in NAMED:
            cases.append((op, default_pool2d_schedule(op, hw, threads=1), hw))
            cases.append((op, default_pool2d_schedule(op, hw, threads=T2), hw))
    _run(cases)


@pytest.mark.parametrize("isa", ISAS)
def test_every_schedule_of_a_windowed_op(isa: str) -> None:
    hw = HW.with_isa(isa)
    op = pool2d_op(2, 3, 13, 29, 3, 3, stride=2, pads=(1, 1, 2, 1), ceil_mode=True,
                   mode="avg", count_include_pad=True, epilogue="relu")
    schedules = _variants(op, hw)
    assert len(schedules) == 3 * 3 * 2
    assert {(s.vec, s.unroll) for s in schedules} == set(itertools.product((1, 2, 4), (1, 2, 4)))
    _run([(op, s, hw) for s in schedules])


@pytest.mark.parametrize("isa", ISAS)
def test_every_schedule_of_global_pooling(isa: str) -> None:
    hw = HW.with_isa(isa)
    op = pool.global_pool2d_op(2, 5, 9, 7, mode="max")
    schedules = [s for s in _schedules(op, hw) if s.threads == 1]
    assert len(schedules) == 3 * 3
    assert {(s.ow_block, s.rows, s.nt) for s in schedules} == {(hw.lanes, 1, 0)}
    schedules = [s.replace(threads=1 + i % T2) for i, s in enumerate(schedules)]
    _run([(op, s, hw) for s in schedules])


@given(pool_ops(), st.data())
@settings(max_examples=examples(25), deadline=None)
def test_random_ops_and_schedules(op: OpSignature, data: st.DataObject) -> None:
    hw = HW.with_isa(data.draw(st.sampled_from(ISAS)))
    s = data.draw(st.sampled_from(_schedules(op, hw)))
    problem = _check(op, build(generate(op, s, hw)), offset=data.draw(st.integers(0, 3)))
    assert problem is None, f"{hw.isa} {op.text} {s}: {problem}"


def test_avx512_kernels_compile() -> None:
    # Not runnable on every host; gcc still checks the AVX-512 spelling of the vocabulary.
    hw = HW.with_isa("avx512")
    for op in (pool2d_op(1, 2, 20, 40, 3, 3, stride=2, pads=1, mode="avg"),
               pool2d_op(1, 2, 20, 40, 3, 3, stride=3, pads=1, epilogue="relu"),
               pool.global_pool2d_op(1, 2, 7, 7)):
        s = default_pool2d_schedule(op, hw, threads=T2)
        s = s if pool.is_global(op) else s.replace(nt=1)
        assert build(generate(op, s, hw)).path.exists()


# -- schedules ------------------------------------------------------------------------------


def test_illegal_schedules_list_every_problem() -> None:
    hw = HW.with_isa("avx2")
    op = pool2d_op(1, 2, 9, 9, 3, 3, stride=2)
    bad = Pool2dSchedule(ow_block=12, vec=3, unroll=8, rows=3, nt=2, threads=0)
    found = problems(op, bad, hw)
    text = "; ".join(found)
    assert len(found) == 6, found
    for message in ("vec=3; expected one of 1, 2, 4", "unroll=8; expected one of 1, 2, 4",
                    "ow_block=12 must be 1, 2 or 4 vectors of 8 lanes (8, 16, 32 on avx2)",
                    "rows=3; expected one of 1, 2, 4", "nt=2 must be 0 or 1",
                    "threads=0 out of range"):
        assert message in text
    with pytest.raises(ScheduleError, match="illegal schedule for pool2d"):
        generate(op, bad, hw)
    glob = pool.global_pool2d_op(1, 2, 7, 7)
    found = problems(glob, Pool2dSchedule(ow_block=16, rows=2, nt=1), hw)
    assert len(found) == 3, found
    assert any("ow_block does not apply to global pooling" in m for m in found)
    assert any("rows does not apply to global pooling" in m for m in found)
    assert any("nt does not apply to global pooling" in m for m in found)


def test_schedule_json_round_trip_and_defaults_are_legal() -> None:
    s = Pool2dSchedule(ow_block=16, vec=4, unroll=2, rows=4, nt=1, threads=2)
    assert schedule_from_json(s.to_json()) == s
    assert s.to_dict()["family"] == "pool2d"
    assert schedule_from_json('{"ow_block": 8}', kind="pool2d") == Pool2dSchedule(ow_block=8)
    for isa in ("avx512", "avx2", "generic"):
        hw = HW.with_isa(isa)
        for _, op in NAMED:
            for threads in (1, T2):
                assert not problems(op, default_pool2d_schedule(op, hw, threads), hw)


def test_examples_with_default_schedules_compute_the_reference() -> None:
    cases: list[Case] = []
    for text in op_kind("pool2d").examples:
        op = OpSignature.parse(text)
        assert OpSignature.parse(op.text) == op and op.flops > 0
        cases.append((op, default_pool2d_schedule(op, HW, threads=T2), HW))
    _run(cases)
