"""The ``layernorm`` kind: signature, reference, legal space, and generated kernels against
the float64 reference on avx2 and generic (whichever this CPU runs). Outputs start
NaN-poisoned, so an unwritten element fails."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_support import build_all, cached_kernel, examples, poisoned_run_problem, sampled

import tunecache.compiler.kinds.layernorm  # noqa: F401  (registers the kind)
from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, isa_level, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.layernorm import AFFINES, NORMS, LayernormSchedule, layernorm_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, reference
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json, validate

HW = local_spec()
TESTED_ISAS = tuple(isa for isa in ("avx2", "generic") if isa in runnable_isas(HW))
T2 = min(2, HW.cores)
SLOW = settings(max_examples=examples(25), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])



def spec(isa: str, cores: int | None = None) -> HardwareSpec:
    """This machine's spec at another ISA level (and core count): for legality checks and
    builds only, not runs."""
    return dataclasses.replace(HW, isa=isa, vector_bits=isa_level(isa).vector_bits,
                               cores=cores or HW.cores)


def inputs_for(op: OpSignature, seed: int, offset: float = 0.0) -> tuple[np.ndarray, ...]:
    """Random inputs: rows with a random spread (and ``offset`` added to their mean), gamma
    around 1, small beta, a positive eps."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in op.arguments():
        if arg.role != "input":
            continue
        if arg.name in ("X", "R"):
            spread = rng.uniform(0.1, 4.0, size=(arg.shape[0], 1))
            out.append((spread * rng.standard_normal(arg.shape) + offset).astype(np.float32))
        elif arg.name == "gamma":
            out.append((1 + 0.5 * rng.standard_normal(arg.shape)).astype(np.float32))
        elif arg.name == "beta":
            out.append((0.2 * rng.standard_normal(arg.shape)).astype(np.float32))
        else:
            out.append(np.array([10.0 ** rng.uniform(-12, -2)], dtype=np.float32))
    return tuple(out)


def run_problem(op: OpSignature, s: LayernormSchedule, hw: HardwareSpec, seed: int = 0,
                offset: float = 0.0) -> str | None:
    inputs = inputs_for(op, seed, offset)
    problem = poisoned_run_problem(cached_kernel(op, s, hw), op, inputs)
    return f"{hw.isa} {op.text} {s}: {problem}" if problem else None


# -- signature ----------------------------------------------------------------------------------

SIZES = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 768)


@st.composite
def ops(draw: st.DrawFn, max_m: int = 24, sizes: tuple[int, ...] = SIZES) -> OpSignature:
    return layernorm_op(draw(st.integers(1, max_m)), draw(st.sampled_from(sizes)),
                        norm=draw(st.sampled_from(NORMS)), affine=draw(st.sampled_from(AFFINES)),
                        residual=draw(st.booleans()))


@given(ops())
@settings(max_examples=60, deadline=None)
def test_text_round_trips(op: OpSignature) -> None:
    assert OpSignature.parse(op.text) == op
    assert OpSignature.parse(op.text).op_id == op.op_id


def test_text_form_arguments_and_defaults() -> None:
    op = layernorm_op(128, 768, residual=True)
    assert op.text == ("layernorm(M=128,N=768,dtype=float32,norm=layer,affine=gamma_beta,"
                       "residual=yes,epilogue=none)")
    assert [(a.name, a.shape) for a in op.arguments()] == [
        ("X", (128, 768)), ("R", (128, 768)), ("gamma", (768,)), ("beta", (768,)),
        ("eps", (1,)), ("Y", (128, 768))]
    rms = layernorm_op(4, 8, norm="rms")
    assert rms.attr("affine") == "gamma"
    assert [a.name for a in rms.arguments()] == ["X", "gamma", "eps", "Y"]
    assert [a.name for a in layernorm_op(4, 8, affine="none").arguments()] == ["X", "eps", "Y"]
    assert OpSignature.parse("layernorm(M=4,N=8)") == layernorm_op(4, 8)
    assert op.flops == 8 * 128 * 768 and rms.flops == 4 * 32


@pytest.mark.parametrize(("text", "message"), [
    ("layernorm(M=4,N=8,norm=batch)", "norm='batch' is not supported"),
    ("layernorm(M=4,N=8,affine=beta)", "affine='beta' is not supported"),
    ("layernorm(M=4,N=8,residual=1)", "residual='1' is not supported"),
    ("layernorm(M=4,N=8,epilogue=add)", "epilogue step 'add' is not supported"),
    ("layernorm(M=4)", "missing dim"),
])
def test_bad_signatures_are_refused(text: str, message: str) -> None:
    with pytest.raises(OpSignatureError, match=message):
        OpSignature.parse(text)


# -- reference ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("norm", "affine", "residual"),
                         list(itertools.product(NORMS, AFFINES, (False, True))))
def test_reference_semantics(norm: str, affine: str, residual: bool) -> None:
    op = layernorm_op(5, 12, norm=norm, affine=affine, residual=residual)
    inputs = tuple(a.astype(np.float64) for a in inputs_for(op, 3, offset=2.0))
    named = dict(zip([a.name for a in op.arguments()], inputs, strict=False))
    z = named["X"] + named["R"] if residual else named["X"]
    if norm == "layer":
        expected = (z - z.mean(axis=1, keepdims=True)) / np.sqrt(
            z.var(axis=1, keepdims=True) + named["eps"][0])
    else:
        expected = z / np.sqrt((z * z).mean(axis=1, keepdims=True) + named["eps"][0])
    expected = expected * named.get("gamma", 1.0) + named.get("beta", 0.0)
    got = op_kind("layernorm").reference(op, inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@given(ops(sizes=(1, 3, 8, 17, 768, 3072)), st.integers(0, 2**16))
@SLOW
def test_float32_reference_matches_float64(op: OpSignature, seed: int) -> None:
    inputs = inputs_for(op, seed)
    got = op_kind("layernorm").reference(op, inputs)
    assert got.dtype == np.float32
    assert check_result(op, inputs, got, reference(op, inputs)) is None


# -- schedules ------------------------------------------------------------------------------------


def test_illegal_schedules_name_every_problem() -> None:
    op = layernorm_op(3, 20)
    hw = spec("avx2")
    found = problems(op, LayernormSchedule(vec=8, unroll=0, rows=0, passes=1, threads=999), hw)
    assert any("vec=8; expected one of 1, 2, 4" in p for p in found)
    assert any("unroll=0; expected one of 1, 2, 4" in p for p in found)
    assert any("rows=0 out of range 1..8" in p for p in found)
    assert any("passes=1; expected one of 2, 3" in p for p in found)
    assert any("threads=999 out of range" in p for p in found)
    assert problems(op, LayernormSchedule(vec=4), hw) == [
        "vec=4 exceeds the 3 vector(s) of 8 lanes in a row of N=20"]
    assert problems(op, LayernormSchedule(rows=5), hw) == ["rows=5 exceeds the op's M=3 rows"]
    rms = layernorm_op(3, 20, norm="rms")
    assert problems(rms, LayernormSchedule(passes=3), hw) == [
        f"passes=3; expected one of 2 for {rms.text}"]
    assert problems(layernorm_op(16, 768), LayernormSchedule(vec=2, rows=8), hw) == [
        "rows*vec=16 accumulators exceed 8 (half the 16 vector registers of avx2)"]
    assert problems(layernorm_op(16, 768), LayernormSchedule(vec=2, rows=8), spec("avx512")) == []
    with pytest.raises(ScheduleError, match="illegal schedule for layernorm"):
        validate(rms, LayernormSchedule(passes=3), hw)
    from tunecache.compiler.kinds.softmax import SoftmaxSchedule

    assert problems(op, SoftmaxSchedule(), hw) == ["a softmax schedule cannot drive a layernorm op"]


@given(ops(sizes=(1, 5, 8, 64, 768, 3072, 50000), max_m=40),
       st.sampled_from(["avx512", "avx2", "generic"]), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_default_schedule_is_legal(op: OpSignature, isa: str, threads: int) -> None:
    hw = spec(isa, cores=4)
    s = default_schedule(op, hw, threads)
    assert isinstance(s, LayernormSchedule) and s.threads == threads
    assert problems(op, s, hw) == []
    assert schedule_from_json(s.to_json()) == s
    assert schedule_from_json(s.to_json(), kind="layernorm") == s


# -- kernels ----------------------------------------------------------------------------------------

FULL_OP = layernorm_op(11, 45, residual=True)
RMS_OP = layernorm_op(9, 45, norm="rms")


def _legal(op: OpSignature, hw: HardwareSpec, rows: tuple[int, ...] = tuple(range(1, 9))
           ) -> list[LayernormSchedule]:
    out = []
    for vec, r, passes in itertools.product((1, 2, 4), rows, (2, 3)):
        s = LayernormSchedule(vec=vec, rows=r, passes=passes)
        if not problems(op, s, hw):
            out.append(s)
    return out


def _variant_cases() -> list[tuple[OpSignature, LayernormSchedule, HardwareSpec]]:
    cases = []
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        # Every (vec, rows, passes), the other knobs spread over them.
        for i, s in enumerate(_legal(FULL_OP, hw)):
            cases.append((FULL_OP, s.replace(unroll=(1, 2, 4)[i % 3], threads=1 + i % T2), hw))
        for i, s in enumerate(_legal(RMS_OP, hw, rows=(1, 3, 4))):
            cases.append((RMS_OP, s.replace(unroll=(4, 1, 2)[i % 3]), hw))
    return cases


def test_every_schedule_variant_on_every_isa() -> None:
    cases = _variant_cases()
    assert len(cases) > 30 * len(TESTED_ISAS)
    cases = sampled(cases)
    build_all(cases)
    failures = [p for p in (run_problem(*case, offset=1.0) for case in cases) if p]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("isa", TESTED_ISAS)
@pytest.mark.parametrize(("norm", "affine", "residual"),
                         list(itertools.product(NORMS, AFFINES, (False, True))))
def test_every_attribute_combination(isa: str, norm: str, affine: str, residual: bool) -> None:
    op = layernorm_op(7, 29, norm=norm, affine=affine, residual=residual)
    hw = HW.with_isa(isa)
    for passes, threads in ((2, 1), (3, T2)):
        if norm == "rms" and passes == 3:
            continue
        s = default_schedule(op, hw).replace(passes=passes, threads=threads)
        assert run_problem(op, s, hw, seed=passes) is None


@given(ops(sizes=(1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 768, 3072)),
       st.sampled_from(TESTED_ISAS), st.integers(0, 2**16))
@SLOW
def test_random_shapes(op: OpSignature, isa: str, seed: int) -> None:
    hw = HW.with_isa(isa)
    s = default_schedule(op, hw, T2 if seed % 2 else 1)
    if op.attr("norm") == "layer" and seed % 3 == 0:
        s = s.replace(passes=3)
    assert run_problem(op, s, hw, seed) is None


def test_bert_gpt2_and_llama_shapes() -> None:
    cases = [layernorm_op(128, 768, residual=True),  # BERT-base post-norm
             layernorm_op(64, 1024),  # GPT-2 medium
             layernorm_op(16, 4096, norm="rms")]  # LLaMA-7B RMSNorm
    for op in cases:
        assert run_problem(op, default_schedule(op, HW, T2), HW) is None


@pytest.mark.parametrize("offset", [8.0, 100.0])
def test_rows_with_a_large_mean_stay_accurate(offset: float) -> None:
    """|mean| up to 1000x the std: the one-sweep statistics are shifted, so they do not
    cancel (plain E[z**2] - mean**2 fails this at offset 8)."""
    op = layernorm_op(8, 768)
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        for passes in (2, 3):
            s = default_schedule(op, hw).replace(passes=passes)
            assert run_problem(op, s, hw, offset=offset) is None


def test_constant_rows_give_beta() -> None:
    op = layernorm_op(3, 40)
    x = np.full((3, 40), 2.5, dtype=np.float32)
    x[1] = -1.0
    gamma = np.linspace(0.5, 2.0, 40, dtype=np.float32)
    beta = np.linspace(-1.0, 1.0, 40, dtype=np.float32)
    eps = np.array([1e-5], dtype=np.float32)
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        for passes in (2, 3):
            y = cached_kernel(op, default_schedule(op, hw).replace(passes=passes), hw)(x, gamma, beta, eps)
            np.testing.assert_allclose(y, np.broadcast_to(beta, (3, 40)), atol=1e-4)


def test_kernels_compile_for_avx512() -> None:
    """AVX-512 code is at least built (run only where the CPU has it)."""
    hw = spec("avx512")
    for op, s in ((FULL_OP, LayernormSchedule(vec=2, rows=3, passes=3, threads=T2)),
                  (RMS_OP, LayernormSchedule(vec=1, rows=2, passes=2))):
        assert build(generate(op, s, hw)).path.exists()
        if HW.isa == "avx512":
            assert run_problem(op, s, hw) is None
