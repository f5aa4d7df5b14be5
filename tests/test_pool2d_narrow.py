"""A pool2d holding its activations narrow (issue 53): a bf16 one bfloat16 between bf16
convolutions, an int8 max pool uint8 between int8 ones. The signature says which, only the
kernels that can take them do, they read and write the bits (checked against the float64
reference on the values they hold, outputs poisoned), the measurement worker times kernels
with a bfloat16 output, and the precision policy lets ResNet's pools keep the activations
narrow and in tile-row blocks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from kernel_support import poisoned_run_problem
from onnx_support import resnet_model

from tunecache.compiler import frontend
from tunecache.compiler.elements import BFLOAT16_NAN
from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.hardware import local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.pool2d import Pool2dSchedule, pool2d_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.passes import plan_graph
from tunecache.compiler.precision import apply_precision
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule
from tunecache.tuner.measure.runner import Candidate, Runner, TimingConfig

HW = local_spec()
STEM = dict(stride=2, pads=1, mode="max")
CASES = [
    pool2d_op(1, 64, 28, 28, 3, 3, layout="nchw32c", dtype="bf16", narrow="x+y", **STEM),
    pool2d_op(1, 40, 9, 11, 3, 2, stride=(2, 1), pads=(1, 1, 0, 1), mode="avg",
              layout="nchw16c", dtype="bf16", narrow="x+y"),
    pool2d_op(2, 48, 7, 7, 7, 7, mode="avg", layout="nchw16c", dtype="bf16", narrow="x"),
    pool2d_op(1, 64, 9, 9, 3, 3, stride=2, mode="max", layout="nchw32c", dtype="bf16",
              narrow="y"),
]
BYTES = [
    pool2d_op(1, 64, 28, 28, 3, 3, layout="nchw16c", dtype="int8", narrow="x+y", **STEM),
    pool2d_op(2, 5, 9, 11, 3, 2, stride=(2, 1), pads=(1, 1, 0, 1), mode="max", dtype="int8",
              narrow="x+y"),
]
WITH_TILES = replace(HW.with_isa("avx512"), features=("amx_bf16", "amx_tile", "avx512_bf16")) \
    if "avx512" in HW.isa else None


def test_the_signature_names_what_is_bfloat16() -> None:
    op = CASES[0]
    assert op.text.endswith("dtype=bf16,mode=max,layout=nchw32c,narrow=x+y,epilogue=none)")
    assert [a.dtype for a in op.arguments()] == ["bfloat16", "bfloat16"]
    assert [a.dtype for a in CASES[2].arguments()] == ["bfloat16", "float32"]
    plain = pool2d_op(1, 64, 28, 28, 3, 3, **STEM)
    assert "narrow" not in plain.text and OpSignature.parse(plain.text) == plain
    with pytest.raises(OpSignatureError, match="a pool2d holds narrow tensors as a bf16 op "
                                               "in a blocked layout"):
        pool2d_op(1, 64, 28, 28, 3, 3, dtype="bf16", narrow="x", **STEM)
    with pytest.raises(OpSignatureError, match="got dtype=float32"):
        pool2d_op(1, 64, 28, 28, 3, 3, layout="nchw16c", narrow="x", **STEM)


def test_with_narrow_and_the_bf16_variant() -> None:
    kind = op_kind("pool2d")
    assert kind.with_narrow is not None and kind.bf16_variant is not None
    blocked = pool2d_op(1, 64, 28, 28, 3, 3, layout="nchw16c", **STEM)
    variant = kind.bf16_variant(blocked, HW)
    assert variant is not None and variant[1] is None and variant[0].dtype == "bf16"
    held = kind.with_narrow(variant[0], frozenset({"y"}))
    assert held is not None and held.attr("narrow") == "y"
    both = kind.with_narrow(held, frozenset({"x"}))
    assert both is not None and both.attr("narrow") == "x+y"
    assert kind.with_narrow(blocked, frozenset({"x"})) is None  # float32
    assert kind.with_narrow(variant[0], frozenset({"add"})) is None
    assert kind.bf16_variant(pool2d_op(1, 64, 28, 28, 3, 3, **STEM), HW) is None  # nchw


@pytest.mark.skipif("avx512" not in runnable_isas(HW),
                    reason="bfloat16 loads and stores are written for AVX-512 here")
@pytest.mark.parametrize("op", CASES, ids=lambda op: op.text)
@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_read_and_write_bfloat16(op: OpSignature, threads: int) -> None:
    s = default_schedule(op, HW, min(threads, HW.cores))
    assert isinstance(s, Pool2dSchedule)
    kernel = compile_kernel(op, s, HW)
    inputs = random_inputs(op, seed=threads)
    if op.arguments()[-1].dtype == "float32":
        assert poisoned_run_problem(kernel, op, inputs, offset=1) is None
        return
    out = np.full(op.arguments()[-1].shape, BFLOAT16_NAN, np.uint16)  # unwritten shows
    kernel(*inputs, out=out)
    assert check_result(op, inputs, out, reference(op, inputs)) is None


@pytest.mark.parametrize("op", BYTES, ids=lambda op: op.text)
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_max_pools_pass_the_bytes_through(op: OpSignature, threads: int) -> None:
    x = random_inputs(op, seed=threads)[0]
    assert x.dtype == np.uint8 and x.max() > 200 and x.min() == 0
    kernel = compile_kernel(op, default_schedule(op, HW, min(threads, HW.cores)), HW)
    assert poisoned_bytes_problem(kernel, op, x) is None


def poisoned_bytes_problem(kernel: object, op: OpSignature, x: np.ndarray) -> str | None:
    from tunecache.compiler.runtime import check_result, reference

    out = np.full(op.arguments()[-1].shape, 7, np.uint8)
    kernel(x, out=out)  # type: ignore[operator]
    want = reference(op, (x,))
    if not np.array_equal(out, want):
        return check_result(op, (x,), out, want) or "not exact"
    return None


def test_int8_pools_are_max_pools_of_both_bytes() -> None:
    with pytest.raises(OpSignatureError, match="an int8 pool2d is a max pool"):
        pool2d_op(1, 64, 28, 28, 3, 3, stride=2, mode="avg", dtype="int8", narrow="x+y")
    with pytest.raises(OpSignatureError, match="an int8 pool2d is a max pool"):
        pool2d_op(1, 64, 28, 28, 3, 3, dtype="int8", narrow="x", **STEM)
    kind = op_kind("pool2d")
    assert kind.with_narrow is not None
    plain = pool2d_op(1, 64, 28, 28, 3, 3, **STEM)
    passed = kind.with_narrow(plain, frozenset({"x", "y"}))
    assert passed is not None and (passed.dtype, passed.attr("narrow")) == ("int8", "x+y")
    assert kind.with_narrow(plain, frozenset({"x"})) is None
    assert kind.with_narrow(pool2d_op(1, 64, 28, 28, 3, 3, epilogue="relu", **STEM),
                            frozenset({"x", "y"})) is None


def test_the_worker_times_kernels_with_a_bfloat16_output() -> None:
    op = CASES[0]
    timing = TimingConfig(repeat_s=0.001, min_repeats=2, max_repeats=3, min_time_s=0.0)
    with Runner(HW, timing) as runner:
        [result] = runner.measure([Candidate(op, default_schedule(op, HW))])
    assert result.status == "ok", result.error


@pytest.mark.skipif(WITH_TILES is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_resnet_pools_keep_bf16_activations_in_tile_rows() -> None:
    """The stem's max pool reads and writes bfloat16 in tile-row blocks between bf16
    convolutions; the global average pool reads its bfloat16 X and writes float32 for the
    classifier; an unblocked pool stays float32."""
    assert WITH_TILES is not None
    graph = plan_graph(frontend.load_graph(resnet_model(width=32)), WITH_TILES)
    lowered, _ = apply_precision(graph, WITH_TILES, "bf16")
    stem_pool, global_pool = [n.op for n in lowered.kernel_nodes if n.op.kind == "pool2d"]
    assert (stem_pool.dtype, stem_pool.attr("narrow"), stem_pool.attr("layout")) == (
        "bf16", "x+y", "nchw32c")
    assert (global_pool.dtype, global_pool.attr("narrow")) == ("bf16", "x")
    narrow = plan_graph(frontend.load_graph(resnet_model()), WITH_TILES)
    kept, _ = apply_precision(narrow, WITH_TILES, "bf16")
    assert next(n.op.dtype for n in kept.kernel_nodes if n.op.kind == "pool2d") == "float32"
