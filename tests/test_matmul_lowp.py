"""Low-precision matmul (issue 53) on every ISA level this machine runs: int8 (u8 times s8,
exact int32; VNNI where the CPU has it, 16-bit pairs without, portable vectors) against
integer numpy, bf16 (float32 accumulation; AVX512-BF16 pairs where the CPU has them,
widening FMAs without) within float32's tolerance; float32 ops keep their text and ids."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tunecache.compiler.codegen import generate
from tunecache.compiler.elements import BFLOAT16_NAN, from_bfloat16, to_bfloat16
from tunecache.compiler.errors import KernelArgumentError, OpSignatureError
from tunecache.compiler.hardware import HardwareSpec, cpu_features, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import dynamic_params, matmul_op
from tunecache.compiler.onnx_ops import OPS
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import (
    check_result,
    compile_kernel,
    random_inputs,
    reference,
    tolerance,
)
from tunecache.compiler.schedule import default_schedule, problems
from tunecache.tuner.measure.runner import Candidate, Runner, TimingConfig

HW = local_spec()
VNNI = "avx512_vnni" in cpu_features()
SPECS = [replace(HW.with_isa(isa), features=()) for isa in runnable_isas(HW)]
SHAPES = [(1, 1, 1), (33, 40, 17), (7, 129, 64), (64, 48, 200)]
VECTORS = replace(HW.with_isa("avx512"), features=tuple(
    f for f in HW.features if not f.startswith("amx"))) if "avx512" in runnable_isas(HW) else HW
"""AVX-512 with this CPU's dot products but not its matrix tiles (test_matmul_tiles.py)."""


def _exact(op: OpSignature, hw: HardwareSpec, threads: int) -> None:
    a, b = random_inputs(op, seed=op.dim("K"))
    assert a.dtype == np.uint8 and b.dtype == np.int8
    out = compile_kernel(op, default_schedule(op, hw, threads), hw)(a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_is_exact_on_every_level(hw: HardwareSpec, m: int, n: int, k: int,
                                      threads: int) -> None:
    _exact(matmul_op(m, n, k, dtype="int8"), hw, threads)


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
@pytest.mark.parametrize(("m", "n", "k"), [(33, 40, 17), (7, 300, 64), (64, 48, 200)])
def test_int8_split_by_columns_is_exact(hw: HardwareSpec, m: int, n: int, k: int) -> None:
    # parallel=n: each thread its share of B's panels (fewer panels than threads included)
    op = matmul_op(m, n, k, dtype="int8")
    s = default_schedule(op, hw, 2).replace(parallel="n")
    assert not problems(op, s, hw)
    a, b = random_inputs(op, seed=k)
    out = compile_kernel(op, s, hw)(a, b)
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
    assert any("parallel='m' or 'n'" in p for p in problems(op, s.replace(parallel="batch"), hw))


@pytest.mark.skipif(not VNNI, reason="needs a CPU with AVX512-VNNI")
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_int8_is_exact_with_vnni(m: int, n: int, k: int) -> None:
    _exact(matmul_op(m, n, k, dtype="int8"), VECTORS, 2)


def test_the_kernel_uses_vnni_where_the_spec_has_it_and_pairs_elsewhere() -> None:
    op = matmul_op(16, 32, 64, dtype="int8")
    avx512 = replace(HW.with_isa("avx512"), features=()) if "avx512" in runnable_isas(HW) \
        else None
    specs = {"vnni": replace(avx512, features=("avx512_vnni",)) if avx512 else None,
             "pairs": avx512}
    for name, spec in specs.items():
        if spec is None:
            continue
        code = generate(op, default_schedule(op, spec), spec).code
        assert ("_mm512_dpbusd_epi32" in code) == (name == "vnni")
        assert ("_mm512_madd_epi16" in code) == (name == "pairs")
    generic = HW.with_isa("generic")
    assert "#define IGROUP 1" in generate(op, default_schedule(op, generic), generic).code


def test_float32_ops_keep_their_text_and_ids() -> None:
    plain = matmul_op(128, 768, 768)
    assert plain.text == "matmul(M=128,N=768,K=768,dtype=float32,layout=nn,epilogue=none)"
    assert OpSignature.parse("matmul(M=128,N=768,K=768)") == plain
    int8 = matmul_op(128, 768, 768, dtype="int8")
    assert "dtype=int8" in int8.text and int8.op_id != plain.op_id
    assert OpSignature.parse(int8.text) == int8
    assert [a.dtype for a in int8.arguments()] == ["uint8", "int8", "int32"]
    assert int8.min_bytes == 128 * 768 + 768 * 768 + 128 * 768 * 4


def test_what_int8_does_not_cover_is_refused_by_name() -> None:
    with pytest.raises(OpSignatureError, match="batch_matmul has no int8 kernels; its dtypes: "
                                               "float32"):
        batch_matmul_op(2, 8, 8, 8, dtype="int8")
    with pytest.raises(OpSignatureError, match="int8 matmul's epilogue starts with dequant"):
        matmul_op(8, 8, 8, dtype="int8", epilogue="bias")
    with pytest.raises(OpSignatureError, match="int8 matmul is layout=nn"):
        matmul_op(8, 8, 8, dtype="int8", trans_b=True)
    with pytest.raises(OpSignatureError, match="dequant is an int8 matmul's epilogue step"):
        matmul_op(8, 8, 8, dtype="bf16", epilogue="dequant")
    with pytest.raises(OpSignatureError, match="a_type=float32 is for low-precision matmuls"):
        matmul_op(8, 8, 8, a_type="float32")
    op = matmul_op(64, 64, 64, dtype="int8")
    strassen = replace(default_schedule(op, HW), strassen=1)
    assert any("int8 matmul takes strassen=0" in p for p in problems(op, strassen, HW))
    kernel = compile_kernel(op, default_schedule(op, HW), HW)
    with pytest.raises(KernelArgumentError, match="argument A has dtype float32; the kernel "
                                                  "needs uint8"):
        kernel(np.zeros((64, 64), np.float32), np.zeros((64, 64), np.int8))


def test_an_int8_kernel_is_measured_and_checked_like_any_other() -> None:
    op = matmul_op(32, 64, 96, dtype="int8")
    timing = TimingConfig(repeat_s=0.001, min_repeats=2, max_repeats=3, min_time_s=0.0)
    with Runner(HW, timing) as runner:
        [result] = runner.measure([Candidate(op, default_schedule(op, HW))])
    assert result.status == "ok", result.error
    assert result.gflops and result.gflops > 0


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
def test_constant_weights_are_packed_once(hw: HardwareSpec) -> None:
    op = matmul_op(19, 70, 45, dtype="int8")
    a, b = random_inputs(op, seed=7)
    kernel = compile_kernel(op, default_schedule(op, hw, 2), hw)
    assert kernel.prepacks_weights
    bound = kernel.bind_weights(b)
    expected = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(bound(a), expected)
    again = kernel.bind_packed(bound.packed)
    np.testing.assert_array_equal(again(a), expected)


BF16 = "avx512_bf16" in cpu_features()


def _close(op: OpSignature, hw: HardwareSpec, threads: int) -> np.ndarray:
    inputs = random_inputs(op, seed=op.dim("N"))
    assert all(x.dtype == np.uint16 for x in inputs)
    out = compile_kernel(op, default_schedule(op, hw, threads), hw)(*inputs)
    assert out.dtype == np.float32
    assert check_result(op, inputs, out, reference(op, inputs)) is None
    return out


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_bf16_accumulates_in_float32_on_every_level(hw: HardwareSpec, m: int, n: int,
                                                    k: int) -> None:
    _close(matmul_op(m, n, k, dtype="bf16"), hw, 2)


@pytest.mark.skipif(not BF16, reason="needs a CPU with AVX512-BF16")
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_bf16_pairs_match_the_widening_path(m: int, n: int, k: int) -> None:
    op = matmul_op(m, n, k, dtype="bf16")
    pairs = _close(op, VECTORS, 1)
    widened = _close(op, replace(HW.with_isa("avx512"), features=()), 1)
    rtol, atol = tolerance(op, random_inputs(op, seed=op.dim("N")))
    np.testing.assert_allclose(pairs, widened, rtol=2 * rtol, atol=2 * atol)


def test_bf16_uses_dpbf16_where_the_spec_has_it() -> None:
    op = matmul_op(16, 32, 64, dtype="bf16")
    if "avx512" not in runnable_isas(HW):
        pytest.skip("needs AVX-512 to generate for")
    plain = replace(HW.with_isa("avx512"), features=())
    with_bf16 = replace(plain, features=("avx512_bf16",))
    assert "_mm512_dpbf16_ps" in generate(op, default_schedule(op, with_bf16), with_bf16).code
    assert "_mm512_dpbf16_ps" not in generate(op, default_schedule(op, plain), plain).code


def test_bfloat16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 1e-3, 3.0e38], np.float32)
    back = from_bfloat16(to_bfloat16(x))
    assert back.tolist()[:4] == [1.0, 1.0, 1.0 + 2**-6, -2.5]  # ties go to the even mantissa
    assert np.all(np.abs(back - x) <= np.abs(x) * 2**-8)
    assert np.array_equal(from_bfloat16(to_bfloat16(back)), back)


def _quantized_inputs(op: OpSignature, scale: float, zero: float) -> tuple[np.ndarray, ...]:
    inputs = list(random_inputs(op, seed=op.dim("K")))
    a = inputs[0]
    # Exact ties (x / scale = n + 0.5) and both saturations among the values.
    special = np.array([2.5, -3.5, 1e3, -1e3], np.float32) * np.float32(scale)
    a.reshape(-1)[:4] = special[:min(4, a.size)]
    names = [arg.name for arg in op.arguments() if arg.role == "input"]
    inputs[names.index("qa")][:] = (scale, zero)
    return tuple(inputs)


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_int8_quantizes_float32_a_exactly(hw: HardwareSpec, m: int, n: int, k: int) -> None:
    op = matmul_op(m, n, k, dtype="int8", a_type="float32")
    a, b, qa = _quantized_inputs(op, 0.03125, 131.0)
    out = compile_kernel(op, default_schedule(op, hw, 2), hw)(a, b, qa)
    q = np.clip(np.rint(a / np.float32(0.03125)) + 131, 0, 255).astype(np.int64)
    assert q.reshape(-1)[:4].tolist() == [133, 127, 255, 0][:min(4, a.size)]  # ties to even
    np.testing.assert_array_equal(out, q @ b.astype(np.int64))


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
@pytest.mark.parametrize("epilogue", ["dequant", "dequant+bias+relu", "dequant+bias+gelu_erf"])
def test_int8_dequantizes_in_its_epilogue(hw: HardwareSpec, epilogue: str) -> None:
    op = matmul_op(37, 70, 99, dtype="int8", a_type="float32", epilogue=epilogue)
    inputs = _quantized_inputs(op, 0.05, 128.0)
    out = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
    assert out.dtype == np.float32
    assert check_result(op, inputs, out, reference(op, inputs)) is None


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
def test_bf16_rounds_float32_a_and_runs_its_epilogue(hw: HardwareSpec) -> None:
    op = matmul_op(21, 50, 70, dtype="bf16", a_type="float32", epilogue="bias+gelu_tanh")
    inputs = random_inputs(op, seed=3)
    assert [x.dtype for x in inputs] == [np.float32, np.uint16, np.float32]
    out = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
    assert check_result(op, inputs, out, reference(op, inputs)) is None
    # Rounding A is the kernel's job: the same product from A already in bfloat16.
    plain = matmul_op(21, 50, 70, dtype="bf16", epilogue="bias+gelu_tanh")
    same = compile_kernel(plain, default_schedule(plain, hw, 2), hw)(
        to_bfloat16(inputs[0]), inputs[1], inputs[2])
    np.testing.assert_array_equal(out, same)


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa for s in SPECS])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_int8_quantizes_a_with_its_own_range(hw: HardwareSpec, m: int, n: int, k: int) -> None:
    # DynamicQuantizeLinear's parameters, then an exact product: scale 1 and no zero-point
    # term leave C = acc * s_a, one float32 product per element.
    op = matmul_op(m, n, k, dtype="int8", a_type="dynamic", epilogue="dequant+bias")
    a, b, _, _, _ = random_inputs(op, seed=k)
    ones, zeros = np.ones(n, np.float32), np.zeros(n, np.float32)
    out = compile_kernel(op, default_schedule(op, hw, 2), hw)(a, b, ones, zeros, zeros)
    dql = OPS["DynamicQuantizeLinear"]([a], {}, 13)
    np.testing.assert_array_equal(dynamic_params(a), [dql[1], dql[2]])
    acc = dql[0].astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(out, acc.astype(np.float32) * np.float32(dql[1]))


def test_a_dynamic_kernel_checks_against_its_reference_with_an_activation() -> None:
    op = matmul_op(45, 70, 130, dtype="int8", a_type="dynamic", epilogue="dequant+bias+relu")
    inputs = random_inputs(op, seed=9)
    out = compile_kernel(op, default_schedule(op, HW, 2), HW)(*inputs)
    assert check_result(op, inputs, out, reference(op, inputs)) is None
    with pytest.raises(OpSignatureError, match="a_type=dynamic is for int8 matmuls"):
        matmul_op(8, 8, 8, dtype="int8", a_type="dynamic", epilogue="dequant")


@pytest.mark.parametrize("hw", [*SPECS, HW], ids=[*(s.isa for s in SPECS), "host"])
def test_bf16_stores_c_as_bfloat16_where_its_reader_rounds_it(hw: HardwareSpec) -> None:
    """``narrow=y`` stores C rounded to bfloat16 (the bits a bf16 reader would pack), bias
    still float32; on every level and, on the host, its matrix tiles where it has them."""
    op = matmul_op(37, 70, 45, dtype="bf16", a_type="float32", epilogue="bias+gelu_erf",
                   narrow="y")
    assert [a.dtype for a in op.arguments()] == ["float32", "bfloat16", "float32", "bfloat16"]
    assert "narrow=y" in op.text and "narrow" not in matmul_op(3, 4, 5, dtype="bf16").text
    inputs = random_inputs(op, seed=5)
    out = np.full((37, 70), BFLOAT16_NAN, np.uint16)  # an unwritten element shows
    compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs, out=out)
    assert check_result(op, inputs, out, reference(op, inputs)) is None
    wide = replace(op, attrs=tuple((k, "none" if k == "narrow" else v) for k, v in op.attrs))
    floats = compile_kernel(wide, default_schedule(wide, hw, 2), hw)(*inputs)
    np.testing.assert_array_equal(out, to_bfloat16(floats))


def test_only_bf16_matmuls_store_c_narrow() -> None:
    with pytest.raises(OpSignatureError, match=r"narrow=y \(C as bfloat16\) is for bf16 matmuls"):
        matmul_op(3, 4, 5, narrow="y")
    kind = op_kind("matmul")
    assert kind.with_narrow is not None
    op = matmul_op(8, 16, 32, dtype="bf16", a_type="float32", epilogue="bias")
    both = kind.with_narrow(op, frozenset({"x", "y"}))
    assert both is not None and (both.attr("a_type"), both.attr("narrow")) == ("dtype", "y")
    assert kind.with_narrow(op, frozenset({"add"})) is None
    assert kind.with_narrow(matmul_op(8, 16, 32), frozenset({"y"})) is None


def test_an_unwritten_bfloat16_output_is_named_so() -> None:
    op = matmul_op(4, 16, 8, dtype="bf16", narrow="y")
    inputs = random_inputs(op, seed=1)
    out = to_bfloat16(reference(op, inputs).astype(np.float32))
    assert check_result(op, inputs, out, reference(op, inputs)) is None
    out[1, 3] = BFLOAT16_NAN
    problem = check_result(op, inputs, out, reference(op, inputs))
    assert problem == "1 of 64 outputs are not finite (unwritten or corrupted)"
