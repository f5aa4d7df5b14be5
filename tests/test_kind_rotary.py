"""The ``rotary`` kind: signature, reference, legal space, and generated kernels against the
float64 reference on avx2 and generic (whichever this CPU runs; avx512 is built). Outputs
start NaN-poisoned (and misaligned), so an unwritten element fails."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from kernel_support import build_all, cached_kernel, poisoned_run_problem, sampled

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, isa_level, local_spec, runnable_isas
from tunecache.compiler.kinds.rotary import RotarySchedule, rotary_op, rotary_tables
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json, validate

HW = local_spec()
TESTED_ISAS = tuple(isa for isa in ("avx2", "generic") if isa in runnable_isas(HW))
T2 = min(2, HW.cores)


def inputs_for(op: OpSignature, seed: int) -> tuple[np.ndarray, ...]:
    """X spread like projected queries, arbitrary (not Llama-symmetric) tables."""
    rng = np.random.default_rng(seed)
    return tuple((3 * rng.standard_normal(a.shape)).astype(np.float32)
                 for a in op.arguments() if a.role == "input")


def run_problem(op: OpSignature, s: RotarySchedule, hw: HardwareSpec, seed: int = 0,
                offset: int = 0) -> str | None:
    problem = poisoned_run_problem(cached_kernel(op, s, hw), op, inputs_for(op, seed), offset)
    return f"{hw.isa} {op.text} {s}: {problem}" if problem else None


def test_text_form_and_bad_signatures() -> None:
    op = rotary_op(40, 8, 5)
    assert op.text == "rotary(M=40,D=8,S=5,dtype=float32,epilogue=none)"
    assert OpSignature.parse(op.text) == op
    assert [(a.name, a.shape) for a in op.arguments()] == [
        ("X", (40, 8)), ("COS", (5, 8)), ("SIN", (5, 8)), ("Y", (40, 8))]
    assert op.flops == 3 * 40 * 8 and op.min_bytes == 4 * (2 * 40 * 8 + 2 * 5 * 8)
    with pytest.raises(OpSignatureError, match="D=7 must be even"):
        rotary_op(4, 7, 2)
    with pytest.raises(OpSignatureError, match="S=3 does not divide M=4"):
        rotary_op(4, 8, 3)


def test_reference_is_the_exporters_formula() -> None:
    """``x * cos + rotate_half(x) * sin`` per row, table row ``r % S``, in float64."""
    op = rotary_op(12, 6, 3)
    x, cos, sin = (a.astype(np.float64) for a in inputs_for(op, 1))
    expected = np.empty_like(x)
    for r in range(12):
        rot = np.concatenate([-x[r, 3:], x[r, :3]])
        expected[r] = x[r] * cos[r % 3] + rot * sin[r % 3]
    np.testing.assert_allclose(reference(op, (x, cos, sin)), expected, rtol=1e-15)
    cos, sin = rotary_tables(4, 6)
    assert np.allclose(cos ** 2 + sin ** 2, 1.0) and np.array_equal(cos[:, :3], cos[:, 3:])


def test_illegal_schedules_name_every_problem() -> None:
    hw = HW.with_isa("avx2") if "avx2" in TESTED_ISAS else HW
    op = rotary_op(8, 40, 4)  # half a row: 20 floats
    found = problems(op, RotarySchedule(vec=3, unroll=3, threads=0), hw)
    assert any("vec=3; expected one of 1, 2, 4" in p for p in found)
    assert any("unroll=3; expected one of 1, 2, 4" in p for p in found)
    assert any("threads=0 out of range" in p for p in found)
    vectors = -(-20 // hw.lanes)
    assert problems(op, RotarySchedule(vec=4), hw) == [
        f"vec=4 exceeds the {vectors} vector(s) of {hw.lanes} lanes in half a row of D=40"]
    with pytest.raises(ScheduleError, match="illegal schedule for rotary"):
        validate(op, RotarySchedule(vec=4), hw)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("d", [2, 8, 64, 128, 200])
def test_default_schedule_is_legal(isa: str, d: int) -> None:
    hw = dataclasses.replace(HW, isa=isa, vector_bits=isa_level(isa).vector_bits, cores=4)
    op = rotary_op(6, d, 3)
    s = default_schedule(op, hw, 3)
    assert isinstance(s, RotarySchedule) and s.threads == 3 and problems(op, s, hw) == []
    assert schedule_from_json(s.to_json(), kind="rotary") == s


# Half-rows of 1 (one partial vector), 4 (Llama fixtures' D=8), 20 (vectors and a tail) and
# 64 (Llama-7B) floats.
OPS = (rotary_op(6, 2, 3), rotary_op(40, 8, 5), rotary_op(9, 40, 9), rotary_op(64, 128, 16))


def _variant_cases() -> list[tuple[OpSignature, RotarySchedule, HardwareSpec]]:
    cases = []
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        for op in OPS:
            for i, (vec, unroll) in enumerate(itertools.product((1, 2, 4), (1, 2, 4))):
                s = RotarySchedule(vec=vec, unroll=unroll, threads=1 + i % T2)
                if not problems(op, s, hw):
                    cases.append((op, s, hw))
    return cases


def test_every_schedule_variant_on_every_isa() -> None:
    cases = sampled(_variant_cases())
    assert cases
    build_all(cases)
    failures = [p for i, case in enumerate(cases) if (p := run_problem(*case, offset=i % 3))]
    assert not failures, "\n".join(failures)


def test_kernels_compile_for_avx512() -> None:
    """AVX-512 code is at least built (run only where the CPU has it)."""
    hw = dataclasses.replace(HW, isa="avx512", vector_bits=isa_level("avx512").vector_bits)
    op = OPS[2]
    s = RotarySchedule(vec=1, unroll=2, threads=T2)
    assert build(generate(op, s, hw)).path.exists()
    if HW.isa == "avx512":
        assert run_problem(op, s, hw) is None


def test_runtime_random_inputs_pass_the_generic_check() -> None:
    """What the tuner does: ``random_inputs`` (real tables) and ``check_result``."""
    op = rotary_op(64, 128, 16)
    k = cached_kernel(op, default_schedule(op, HW), HW)
    for seed in range(3):
        inputs = random_inputs(op, seed)
        assert check_result(op, inputs, k(*inputs), reference(op, inputs)) is None
