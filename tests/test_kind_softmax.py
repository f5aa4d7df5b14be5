"""The ``softmax`` kind: signature, reference, legal space, and generated kernels against the
float64 reference on avx2 and generic (whichever this CPU runs), plus the ``VEXP`` vocabulary
of ``isa.py`` it relies on. Outputs start NaN-poisoned, so an unwritten element fails."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import scipy.special
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_support import build_all, cached_kernel, examples, poisoned_run_problem, sampled

import tunecache.compiler.kinds.softmax  # noqa: F401  (registers the kind)
from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.backends.cpu.clib import c_library
from tunecache.compiler.backends.cpu.isa import BASE_FLAGS, dialect
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, isa_level, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.softmax import SoftmaxSchedule, causal_keep, softmax_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, random_inputs, reference
from tunecache.compiler.schedule import (
    default_schedule,
    problems,
    schedule_from_json,
    validate,
)

HW = local_spec()
TESTED_ISAS = tuple(isa for isa in ("avx2", "generic") if isa in runnable_isas(HW))
T2 = min(2, HW.cores)
SLOW = settings(max_examples=examples(25), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])



def inputs_for(op: OpSignature, seed: int) -> tuple[np.ndarray, ...]:
    """Random inputs; scores spread like attention logits and a padding-style mask."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in op.arguments():
        if arg.role != "input":
            continue
        if arg.name == "X":
            out.append((3 * rng.standard_normal(arg.shape)).astype(np.float32))
        elif arg.name == "scale":
            out.append(np.array([rng.uniform(0.05, 2.0)], dtype=np.float32))
        else:  # mask: mostly small, some -1e4 (padding), never a whole row
            mask = rng.standard_normal(arg.shape).astype(np.float32)
            mask[rng.random(arg.shape) < 0.2] = -1e4
            mask[:, 0] = 0.0
            out.append(mask)
    return tuple(out)


def run_problem(op: OpSignature, s: SoftmaxSchedule, hw: HardwareSpec, seed: int = 0) -> str | None:
    inputs = inputs_for(op, seed)
    problem = poisoned_run_problem(cached_kernel(op, s, hw), op, inputs)
    return f"{hw.isa} {op.text} {s}: {problem}" if problem else None


# -- signature ----------------------------------------------------------------------------------


@st.composite
def ops(draw: st.DrawFn, max_m: int = 40,
        sizes: tuple[int, ...] = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 128)
        ) -> OpSignature:
    n = draw(st.sampled_from(sizes))
    q = draw(st.integers(1, n)) if draw(st.booleans()) else None
    blocks = draw(st.integers(1, max(1, max_m // (q or 1))))
    m = blocks * (q or 1)
    divisors = [d for d in range(1, m + 1) if m % d == 0]
    mask_rows = draw(st.sampled_from([0, *divisors]))
    return softmax_op(m, n, scale=draw(st.booleans()), mask_rows=mask_rows,
                      causal=q is not None, Q=q)


@given(ops())
@settings(max_examples=60, deadline=None)
def test_text_round_trips(op: OpSignature) -> None:
    assert OpSignature.parse(op.text) == op
    assert OpSignature.parse(op.text).op_id == op.op_id


def test_text_form_and_defaults() -> None:
    op = softmax_op(1536, 128, scale=True, mask_rows=12)
    assert op.text == ("softmax(M=1536,N=128,mask_rows=12,Q=0,dtype=float32,scale=yes,"
                       "causal=no,epilogue=none)")
    assert OpSignature.parse("softmax(M=4,N=8)") == softmax_op(4, 8)
    assert softmax_op(8, 4, causal=True).dim("Q") == 4
    assert [(a.name, a.shape) for a in op.arguments()] == [
        ("X", (1536, 128)), ("scale", (1,)), ("mask", (12, 128)), ("Y", (1536, 128))]
    assert [a.name for a in softmax_op(4, 8).arguments()] == ["X", "Y"]
    assert op.flops == 7 * 1536 * 128 and softmax_op(4, 8).flops == 5 * 32


@pytest.mark.parametrize(("text", "message"), [
    ("softmax(M=6,N=8,mask_rows=4)", "mask_rows=4 does not divide M=6"),
    ("softmax(M=6,N=8,causal=yes)", "causal=yes needs 1 <= Q <= N=8"),
    ("softmax(M=6,N=2,Q=3,causal=yes)", "causal=yes needs 1 <= Q <= N=2"),
    ("softmax(M=6,N=8,Q=4,causal=yes)", "Q=4 does not divide M=6"),
    ("softmax(M=6,N=8,Q=3)", "Q=3 applies to causal=yes only"),
    ("softmax(M=6,N=8,causal=maybe)", "causal='maybe' is not supported"),
    ("softmax(M=6,N=8,epilogue=relu)", "epilogue step 'relu' is not supported"),
])
def test_bad_signatures_are_refused(text: str, message: str) -> None:
    with pytest.raises(OpSignatureError, match=message.replace("(", r"\(")):
        OpSignature.parse(text)


# -- reference ----------------------------------------------------------------------------------


def test_reference_semantics() -> None:
    """Mask row i // (M // mask_rows), causal keys j <= i % Q + N - Q, the scale first."""
    b, h, q, n = 2, 3, 4, 6
    op = softmax_op(b * h * q, n, scale=True, mask_rows=b, causal=True, Q=q)
    x, scale, mask = inputs_for(op, 1)
    x64, mask64 = x.astype(np.float64), mask.astype(np.float64)
    z = x64 * float(scale[0]) + np.repeat(mask64, h * q, axis=0)
    for i in range(op.dim("M")):
        z[i, np.arange(n) > i % q + n - q] = -np.inf
    expected = scipy.special.softmax(z, axis=1)
    got = op_kind("softmax").reference(op, (x64, scale.astype(np.float64), mask64))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    assert got[0, n - q + 1:].max() == 0.0 and got[q - 1].min() > 0.0
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-12)
    assert causal_keep(2, 3).tolist() == [[True, True, False], [True, True, True]]


@given(ops(sizes=(1, 3, 8, 17, 128, 3072), max_m=24), st.integers(0, 2**16))
@SLOW
def test_float32_reference_matches_float64(op: OpSignature, seed: int) -> None:
    inputs = inputs_for(op, seed)
    got = op_kind("softmax").reference(op, inputs)
    assert got.dtype == np.float32
    assert check_result(op, inputs, got, reference(op, inputs)) is None


# -- schedules ------------------------------------------------------------------------------------


def test_illegal_schedules_name_every_problem() -> None:
    op = softmax_op(3, 20)  # avx2: 3 vectors per row
    hw = HW.with_isa("avx2")
    found = problems(op, SoftmaxSchedule(vec=3, unroll=3, rows=9, passes=4, threads=0), hw)
    assert any("vec=3; expected one of 1, 2, 4" in p for p in found)
    assert any("unroll=3; expected one of 1, 2, 4" in p for p in found)
    assert any("rows=9 out of range 1..8" in p for p in found)
    assert any("passes=4; expected one of 2, 3" in p for p in found)
    assert any("threads=0 out of range" in p for p in found)
    assert problems(op, SoftmaxSchedule(vec=4), hw) == [
        "vec=4 exceeds the 3 vector(s) of 8 lanes in a row of N=20"]
    assert problems(op, SoftmaxSchedule(rows=4), hw) == ["rows=4 exceeds the op's M=3 rows"]
    big = softmax_op(64, 256)
    assert problems(big, SoftmaxSchedule(vec=4, rows=4), hw) == [
        "rows*vec=16 accumulators exceed 8 (half the 16 vector registers of avx2)"]
    with pytest.raises(ScheduleError, match="illegal schedule for softmax"):
        validate(op, SoftmaxSchedule(vec=4), hw)
    from tunecache.compiler.kinds.matmul import MatmulSchedule

    assert problems(op, MatmulSchedule(mr=4, nr=8, kc=64, mc=64, nc=64), hw) == [
        "a matmul schedule cannot drive a softmax op"]


def spec(isa: str, cores: int | None = None) -> HardwareSpec:
    """This machine's spec at another ISA level (and core count): for legality checks and
    builds only, not runs."""
    return dataclasses.replace(HW, isa=isa, vector_bits=isa_level(isa).vector_bits,
                               cores=cores or HW.cores)


@given(ops(sizes=(1, 5, 8, 64, 128, 3072, 50000), max_m=40),
       st.sampled_from(["avx512", "avx2", "generic"]), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_default_schedule_is_legal(op: OpSignature, isa: str, threads: int) -> None:
    hw = spec(isa, cores=4)
    s = default_schedule(op, hw, threads)
    assert isinstance(s, SoftmaxSchedule) and s.threads == threads
    assert problems(op, s, hw) == []
    assert schedule_from_json(s.to_json()) == s
    assert schedule_from_json(s.to_json(), kind="softmax") == s


# -- kernels ----------------------------------------------------------------------------------------

FULL_OP = softmax_op(12, 37, scale=True, mask_rows=3, causal=True, Q=4)
PLAIN_OP = softmax_op(9, 37)


def _legal(op: OpSignature, hw: HardwareSpec, **fixed: int) -> list[SoftmaxSchedule]:
    space = {"vec": (1, 2, 4), "rows": range(1, 9), "passes": (2, 3), **{
        k: (v,) for k, v in fixed.items()}}
    out = []
    for values in itertools.product(*space.values()):
        s = SoftmaxSchedule(**dict(zip(space, values, strict=True)))
        if not problems(op, s, hw):
            out.append(s)
    return out


def _variant_cases() -> list[tuple[OpSignature, SoftmaxSchedule, HardwareSpec]]:
    cases = []
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        # Every (vec, rows, passes) on the op with every feature (causal rows of varying
        # length), the other knobs spread over them.
        for i, s in enumerate(_legal(FULL_OP, hw)):
            cases.append((FULL_OP, s.replace(unroll=(1, 2, 4)[i % 3], threads=1 + i % T2), hw))
        for s in _legal(PLAIN_OP, hw, rows=1) + _legal(PLAIN_OP, hw, rows=4):
            cases.append((PLAIN_OP, s, hw))
    return cases


def test_every_schedule_variant_on_every_isa() -> None:
    cases = _variant_cases()
    assert len(cases) > 30 * len(TESTED_ISAS)
    cases = sampled(cases)
    build_all(cases)
    failures = [p for p in (run_problem(*case) for case in cases) if p]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("isa", TESTED_ISAS)
@pytest.mark.parametrize(("scale", "mask", "causal"),
                         list(itertools.product((False, True), ("none", "batch", "full"),
                                                (False, True))))
def test_every_attribute_combination(isa: str, scale: bool, mask: str, causal: bool) -> None:
    m, n = 2 * 3 * 5, 11
    mask_rows = {"none": 0, "batch": 2, "full": m}[mask]
    op = softmax_op(m, n, scale=scale, mask_rows=mask_rows, causal=causal, Q=5 if causal else None)
    hw = HW.with_isa(isa)
    for passes, threads in ((3, 1), (2, T2)):
        s = default_schedule(op, hw).replace(passes=passes, threads=threads)
        assert run_problem(op, s, hw, seed=passes) is None


@given(ops(sizes=(1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 128, 3072), max_m=24),
       st.sampled_from(TESTED_ISAS), st.integers(0, 2**16))
@SLOW
def test_random_shapes(op: OpSignature, isa: str, seed: int) -> None:
    hw = HW.with_isa(isa)
    s = default_schedule(op, hw, T2 if seed % 2 else 1)
    assert run_problem(op, s, hw, seed) is None


def test_bert_and_gpt2_shapes() -> None:
    cases = [
        (softmax_op(12 * 128, 128, scale=True, mask_rows=1), HW),  # BERT-base attention
        (softmax_op(2 * 12 * 64, 64, scale=True, causal=True), HW),  # GPT-2 prefill
        (softmax_op(4 * 12, 3072, scale=True, causal=True, Q=4), HW),  # decoding, long cache
    ]
    for op, hw in cases:
        assert run_problem(op, default_schedule(op, hw, T2), hw) is None


def test_masked_elements_are_exactly_zero_and_large_scores_are_stable() -> None:
    op = softmax_op(4, 19, mask_rows=4)
    x = (np.arange(4 * 19, dtype=np.float32).reshape(4, 19) - 30) * 50  # scores up to 2250
    mask = np.zeros((4, 19), np.float32)
    mask[:, 3] = -np.inf
    mask[1, 10:] = -np.inf
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        for passes in (2, 3):
            y = cached_kernel(op, default_schedule(op, hw).replace(passes=passes), hw)(x, mask)
            assert np.all(np.isfinite(y)) and y[:, 3].max() == 0.0 and y[1, 10:].max() == 0.0
            assert check_result(op, (x, mask), y, reference(op, (x, mask))) is None


# -- the VEXP / partial-vector vocabulary of isa.py --------------------------------------------

_EXP_TEST = """
void vexp_all(const float *x, float *y, long n) {
  long i = 0;
  for (; i + LANES <= n; i += LANES) VSTOREU(y + i, VEXP(VLOADU(x + i)));
  if (i < n) VSTOREU_PART(y + i, VEXP(VLOADU_PART(x + i, (int)(n - i))), (int)(n - i));
}
float hsum(const float *x) { return VHSUM(VLOADU(x)); }
float hmax(const float *x) { return VHMAX(VLOADU(x)); }
void fill(const float *x, float *y, int n) { VSTOREU(y, VFILL_PART(VLOADU(x), n, -1.0f)); }
"""


@pytest.mark.parametrize("isa", TESTED_ISAS)
def test_vexp_and_lane_helpers(isa: str) -> None:
    d = dialect(isa)
    code = d.prelude + f"#define LANES {d.lanes}\n" + _EXP_TEST
    lib = c_library(code, BASE_FLAGS + d.flags)
    vexp_all = lib.function("vexp_all", ("ptr", "ptr", "long"), "void")
    hsum = lib.function("hsum", ("ptr",), "float")
    hmax = lib.function("hmax", ("ptr",), "float")
    fill = lib.function("fill", ("ptr", "ptr", "int"), "void")
    x = np.linspace(-87.3, 88.0, 200_001, dtype=np.float32)
    y = np.empty_like(x)
    vexp_all(x, y, x.size)
    truth = np.exp(x.astype(np.float64))
    assert (np.abs(y - truth) / truth).max() < 2e-7
    special = np.array([-np.inf, -1e30, -90.0, np.nan, 0.0, 1.0, -1.0], dtype=np.float32)
    out = np.full_like(special, 7.0)
    vexp_all(special, out, special.size)
    assert out[:3].tolist() == [0.0, 0.0, 0.0] and np.isnan(out[3])
    np.testing.assert_allclose(out[4:], np.exp([0.0, 1.0, -1.0]), rtol=2e-7)
    v = np.array([3, -8, 5, 1, 9, 2, -4, 7, 6, 0, 11, -2, 4, 8, 10, -1], dtype=np.float32)
    assert hsum(v) == v[:d.lanes].sum()
    assert hmax(v) == v[:d.lanes].max()
    filled = np.zeros(16, np.float32)
    fill(v, filled, 3)
    assert filled[:d.lanes].tolist() == [3, -8, 5] + [-1] * (d.lanes - 3)
    # A partial store leaves the rest alone; a partial load reads nothing past its n floats.
    guard = np.full(d.lanes, 5.0, dtype=np.float32)
    vexp_all(np.zeros(1, np.float32), guard, 1)
    assert guard.tolist() == [1.0] + [5.0] * (d.lanes - 1)


def test_kernels_compile_for_avx512() -> None:
    """AVX-512 code is at least built (run only where the CPU has it)."""
    hw = spec("avx512")
    for s in (SoftmaxSchedule(vec=2, rows=3, passes=3, threads=T2),
              SoftmaxSchedule(vec=1, rows=2, passes=2)):
        art = build(generate(FULL_OP, s, hw))
        assert art.path.exists()
        if HW.isa == "avx512":
            assert run_problem(FULL_OP, s, hw) is None


def test_runtime_random_inputs_pass_the_generic_check() -> None:
    """What the tuner does: ``random_inputs`` (a negative scale too) and ``check_result``."""
    op = softmax_op(24, 40, scale=True, mask_rows=6, causal=True, Q=8)
    k = cached_kernel(op, default_schedule(op, HW), HW)
    for seed in range(4):
        inputs = random_inputs(op, seed)
        assert check_result(op, inputs, k(*inputs), reference(op, inputs)) is None
