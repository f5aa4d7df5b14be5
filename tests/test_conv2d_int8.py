"""int8 and bf16 conv2d (issue 53): float32 X quantized (or rounded to bfloat16) in the
kernel, weights packed once, int32 (float32) accumulation in the dialect's dot products
(VNNI / AVX512-BF16 where the spec has them, 16-bit pairs, widening FMAs or portable
vectors elsewhere), a dequantizing epilogue for int8; against numpy, on every ISA level this
machine runs and in every layout."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import MIN_LOWP_FILL, block_fill, conv2d_op
from tunecache.compiler.kinds.layouts import from_layout, to_layout
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, problems

HW = local_spec()
SPECS = [*(replace(HW.with_isa(isa), features=()) for isa in runnable_isas(HW))]
if HW.features:
    SPECS.append(HW.with_isa(HW.isa))  # with VNNI and AMX tiles, where the CPU has them
    VECTORS = tuple(f for f in HW.features if not f.startswith("amx"))
    if HW.features != VECTORS:  # and the vector kernel on a CPU with tiles
        SPECS.append(replace(HW.with_isa(HW.isa), features=VECTORS))
CASES = [
    dict(N=1, C=16, H=8, W=8, F=32, R=3, S=3, pads=1),
    dict(N=2, C=20, H=7, W=9, F=24, R=3, S=3, pads=(1, 0, 1, 2), stride=2),
    dict(N=1, C=64, H=6, W=6, F=48, R=1, S=1),
]
LAYOUTS = ["nchw", "nchw16c", "nchw8c"]


def _op(case: dict[str, object], layout: str, epilogue: str) -> OpSignature:
    kw = dict(case)
    dims = [int(kw.pop(k)) for k in ("N", "C", "H", "W", "F", "R", "S")]  # type: ignore[call-overload]
    return conv2d_op(*dims, **kw, dtype="int8", epilogue=epilogue,  # type: ignore[arg-type]
                     layout=layout, out_layout=layout)


def _name(spec: HardwareSpec) -> str:
    return spec.isa + ("+" + "+".join(spec.features) if spec.features else "")


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_conv2d_matches_its_reference(hw: HardwareSpec, case: int, layout: str) -> None:
    op = _op(CASES[case], layout, "dequant+bias+add+relu")
    inputs = random_inputs(op, seed=case)
    for threads in (1, 2):
        out = compile_kernel(op, default_schedule(op, hw, threads), hw)(*inputs)
        assert check_result(op, inputs, out, reference(op, inputs)) is None


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
def test_int8_conv2d_accumulates_exactly(hw: HardwareSpec) -> None:
    # Scale 1 and bias 0 leave the integer accumulator itself (exact in float32 here).
    op = _op(CASES[1], "nchw16c", "dequant+bias")
    x, w, qa, _, _ = random_inputs(op, seed=5)
    f = op.dim("F")
    out = compile_kernel(op, default_schedule(op, hw, 2), hw)(
        x, w, qa, np.ones(f, np.float32), np.zeros(f, np.float32))
    plain = from_layout(x, "nchw16c", op.dim("C"))
    q = np.clip(np.rint(plain / np.float32(qa[0])) + qa[1], 0, 255)
    padded = np.pad(q, ((0, 0), (0, 0), (1, 1), (0, 2)), constant_values=qa[1])
    acc = np.zeros((2, f, op.out_h, op.out_w))
    for r in range(3):
        for s in range(3):
            patch = padded[:, :, r:r + 2 * (op.out_h - 1) + 1:2, s:s + 2 * (op.out_w - 1) + 1:2]
            acc += np.einsum("nchw,fc->nfhw", patch, w[:, :, r, s].astype(np.float64))
    np.testing.assert_array_equal(out, to_layout(acc.astype(np.float32), "nchw16c"))


def test_constant_weights_are_packed_once() -> None:
    op = _op(CASES[0], "nchw16c", "dequant+bias")
    inputs = random_inputs(op, seed=2)
    kernel = compile_kernel(op, default_schedule(op, HW, 2), HW)
    assert kernel.prepacks_weights
    bound = kernel.bind_weights(inputs[1])
    np.testing.assert_array_equal(bound(inputs[0], *inputs[2:]), kernel(*inputs))


def test_what_int8_convolutions_do_not_cover_is_refused_by_name() -> None:
    with pytest.raises(OpSignatureError, match="int8 conv2d is dense"):
        conv2d_op(1, 16, 8, 8, 16, 3, 3, groups=16, dtype="int8", epilogue="dequant+bias")
    with pytest.raises(OpSignatureError, match="no dilation"):
        conv2d_op(1, 16, 8, 8, 16, 3, 3, dilation=2, dtype="int8", epilogue="dequant+bias")
    with pytest.raises(OpSignatureError, match="starts with dequant\\+bias"):
        conv2d_op(1, 16, 8, 8, 16, 3, 3, dtype="int8", epilogue="bias")
    with pytest.raises(OpSignatureError, match="dequant is an int8 conv2d's epilogue step"):
        conv2d_op(1, 16, 8, 8, 16, 3, 3, epilogue="dequant+bias")
    op = _op(CASES[0], "nchw16c", "dequant+bias")
    gemm = replace(default_schedule(op, HW), algorithm="gemm")
    assert any("low-precision conv2d takes algorithm='direct'" in p for p in problems(op, gemm, HW))


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_bf16_conv2d_accumulates_in_float32(hw: HardwareSpec, case: int) -> None:
    # X rounded to bfloat16 in the kernel, bfloat16 weights, float32 accumulators.
    kw = dict(CASES[case])
    dims = [int(kw.pop(k)) for k in ("N", "C", "H", "W", "F", "R", "S")]  # type: ignore[call-overload]
    op = conv2d_op(*dims, **kw, dtype="bf16", epilogue="bias+add+relu",  # type: ignore[arg-type]
                   layout="nchw16c", out_layout="nchw16c")
    inputs = random_inputs(op, seed=case)
    assert [x.dtype for x in inputs[:2]] == [np.float32, np.uint16]
    out = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
    assert check_result(op, inputs, out, reference(op, inputs)) is None


WIDE = [  # few channels: a row's taps folded into the packed pixel's 16 channels
    dict(N=1, C=3, H=23, W=21, F=32, R=7, S=7, pads=3, stride=2),  # ResNet's stem, smaller
    dict(N=2, C=4, H=9, W=10, F=24, R=3, S=3, pads=(1, 0, 1, 2)),
]


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
@pytest.mark.parametrize("case", range(len(WIDE)))
@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_few_channel_convolutions_fold_taps_into_the_pixel(hw: HardwareSpec, case: int,
                                                          dtype: str) -> None:
    kw = dict(WIDE[case])
    dims = [int(kw.pop(k)) for k in ("N", "C", "H", "W", "F", "R", "S")]  # type: ignore[call-overload]
    epilogue = "dequant+bias+relu" if dtype == "int8" else "bias+relu"
    for layout in ("nchw", "nchw16c"):
        op = conv2d_op(*dims, **kw, dtype=dtype, epilogue=epilogue,  # type: ignore[arg-type]
                       layout=layout, out_layout="nchw16c")
        assert block_fill(op) >= MIN_LOWP_FILL
        inputs = random_inputs(op, seed=case)
        for threads in (1, 2):
            out = compile_kernel(op, default_schedule(op, hw, threads), hw)(*inputs)
            assert check_result(op, inputs, out, reference(op, inputs)) is None


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
def test_blocked_and_plain_inputs_quantize_alike_nan_and_inf_included(hw: HardwareSpec) -> None:
    # A channel-blocked X is quantized a vector at a time, a plain one element by element:
    # the same bytes, NaN to the low end and +-inf to the ends as QuantizeLinear does.
    case = dict(CASES[2], C=32)
    plain, blocked = _op(case, "nchw", "dequant+bias"), _op(case, "nchw16c", "dequant+bias")
    inputs = list(random_inputs(plain, seed=3))
    x = inputs[0].copy()
    x[0, 3, 1, 2], x[0, 17, 4, 4], x[0, 30, 0, 5] = np.nan, np.inf, -np.inf
    qa = inputs[[a.name for a in plain.arguments() if a.role == "input"].index("qa")]
    x[0, 5, 2, 2] = 2.5 * qa[0]  # a tie: rounds half to even
    inputs[0] = x
    ours = compile_kernel(plain, default_schedule(plain, hw), hw)(*inputs)
    blocked_inputs = [to_layout(x, "nchw16c"), *inputs[1:]]
    theirs = compile_kernel(blocked, default_schedule(blocked, hw), hw)(*blocked_inputs)
    np.testing.assert_array_equal(from_layout(theirs, "nchw16c", plain.dim("F")), ours)


QUANTIZE = "cdiv+cmax+cmin+qround+cadd"
U8_CASES = [("x", "dequant+bias+relu"), ("y", f"dequant+bias+relu+{QUANTIZE}"),
            ("x+y+add", f"dequant+bias+radd+{QUANTIZE}"), ("add", "dequant+bias+radd+cmul")]


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
@pytest.mark.parametrize(("held", "epilogue"), U8_CASES, ids=[c[0] for c in U8_CASES])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_uint8_activations_match_the_reference(hw: HardwareSpec, held: str, epilogue: str,
                                               layout: str) -> None:
    # X already quantized (its bytes copied, the border the zero point), Y quantized by the
    # epilogue's closing steps, a residual dequantized with aq: the float32 kernel's values.
    for case in (CASES[1], dict(N=1, C=3, H=12, W=12, F=16, R=7, S=7, pads=3, stride=2)):
        kw = dict(case)
        dims = [int(kw.pop(k)) for k in ("N", "C", "H", "W", "F", "R", "S")]  # type: ignore[call-overload]
        op = conv2d_op(*dims, **kw, dtype="int8", epilogue=epilogue,  # type: ignore[arg-type]
                       layout=layout, out_layout=layout, narrow=held)
        inputs = random_inputs(op, seed=9)
        out = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
        assert out.dtype == (np.uint8 if "y" in held else np.float32)
        assert check_result(op, inputs, out, reference(op, inputs)) is None
        if "y" in held:  # the random quantizer spreads the outputs over uint8
            assert len(np.unique(out)) > 32


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
@pytest.mark.parametrize("held", ["x", "y", "x+y+add"])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c", "nchw32c"])
def test_bfloat16_activations_match_the_reference(hw: HardwareSpec, held: str,
                                                  layout: str) -> None:
    # X as bfloat16 (its elements copied, the border zero), Y rounded to bfloat16 by the
    # store, a residual read as bfloat16; the few-channel stem folds its taps (WIDE). On
    # tiles, the 1x1 reads an nchw32c X in place, its 36 pixels one tile and a last one
    # shifted back over four of them.
    for case in (CASES[1], CASES[2], dict(N=1, C=3, H=12, W=12, F=16, R=7, S=7, pads=3,
                                          stride=2)):
        kw = dict(case)
        dims = [int(kw.pop(k)) for k in ("N", "C", "H", "W", "F", "R", "S")]  # type: ignore[call-overload]
        op = conv2d_op(*dims, **kw, dtype="bf16", epilogue="bias+add+relu",  # type: ignore[arg-type]
                       layout=layout, out_layout=layout, narrow=held)
        inputs = random_inputs(op, seed=4)
        out = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
        assert out.dtype == (np.uint16 if "y" in held else np.float32)
        assert check_result(op, inputs, out, reference(op, inputs)) is None


def test_uint8_activations_are_named_in_the_signature() -> None:
    plain = _op(CASES[0], "nchw16c", f"dequant+bias+{QUANTIZE}")
    assert "narrow=" not in str(plain)  # op ids of float32-activation kernels stay as stored
    held = conv2d_op(1, 16, 8, 8, 32, 3, 3, pads=1, dtype="int8", narrow="x+y",
                     epilogue=f"dequant+bias+{QUANTIZE}")
    assert "narrow=x+y" in str(held) and OpSignature.parse(str(held)) == held
    args = {a.name: a.dtype for a in held.arguments()}
    assert args["X"] == args["Y"] == "uint8"
    with pytest.raises(OpSignatureError, match="quantized"):
        conv2d_op(1, 16, 8, 8, 32, 3, 3, dtype="int8", narrow="y", epilogue="dequant+bias+relu")
    with pytest.raises(OpSignatureError, match="residual"):
        conv2d_op(1, 16, 8, 8, 32, 3, 3, dtype="int8", narrow="add", epilogue="dequant+bias")
    with pytest.raises(OpSignatureError, match="narrow"):
        conv2d_op(1, 16, 8, 8, 32, 3, 3, narrow="x", epilogue="bias")  # float32: no narrow X
    bf16 = conv2d_op(1, 16, 8, 8, 32, 3, 3, dtype="bf16", narrow="x+y", epilogue="bias+relu")
    args = {a.name: a.dtype for a in bf16.arguments()}
    assert args["X"] == args["Y"] == "bfloat16"  # a bf16 conv2d's narrow tensors
    with pytest.raises(OpSignatureError, match="nchw32c holds bfloat16"):
        conv2d_op(1, 32, 8, 8, 32, 1, 1, dtype="int8", layout="nchw32c", out_layout="nchw32c",
                  epilogue="dequant+bias")


@pytest.mark.parametrize("hw", SPECS, ids=[_name(s) for s in SPECS])
@pytest.mark.parametrize("held", ["none", "x", "y", "x+y"])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c", "nchw32c"])
def test_bf16_depthwise_convolution_holds_bfloat16_activations(hw: HardwareSpec, held: str,
                                                               layout: str) -> None:
    # The float32 depthwise kernel: weights given as floats, X widened from bfloat16 as its
    # padded rows are copied, Y rounded by the store; strided and not, ragged rows; tile-row
    # blocks in and out (a tile reads part of a block)
    for stride in (1, 2):
        op = conv2d_op(1, 64, 9, 11, 64, 3, 3, pads=1, stride=stride, groups=64, dtype="bf16",
                       epilogue="bias+clip6", layout=layout,
                       out_layout="nchw32c" if layout == "nchw32c" else "nchw16c", narrow=held)
        args = {a.name: a.dtype for a in op.arguments()}
        assert args["W"] == "float32"
        assert args["X"] == ("bfloat16" if "x" in held else "float32")
        inputs = random_inputs(op, seed=8)
        out = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
        assert out.dtype == (np.uint16 if "y" in held else np.float32)
        assert check_result(op, inputs, out, reference(op, inputs)) is None


def test_what_a_bf16_depthwise_convolution_cannot_hold_is_refused() -> None:
    with pytest.raises(OpSignatureError, match="with padding"):  # X would be read in place
        conv2d_op(1, 32, 8, 8, 32, 3, 3, groups=32, dtype="bf16", narrow="x")
    with pytest.raises(OpSignatureError, match="whole 16-channel blocks"):
        conv2d_op(1, 24, 8, 8, 24, 3, 3, pads=1, groups=24, dtype="bf16", narrow="y")
    with pytest.raises(OpSignatureError, match="one block size"):  # the float32 kernel's
        conv2d_op(1, 32, 8, 8, 32, 3, 3, pads=1, groups=32, dtype="bf16",
                  layout="nchw32c", out_layout="nchw16c")
