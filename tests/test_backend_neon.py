"""The NEON backend, a second CPU backend that is not x86, added through the protocol alone:
every kind's kernels built for aarch64 by the cross compiler and checked against the numpy
reference under qemu-user, measured through the same runner, refused cleanly where no
emulator is installed."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from tunecache.compiler.backends import backend_for
from tunecache.compiler.backends.neon import NEON_LEVEL
from tunecache.compiler.backends.neon.toolchain import CROSS_COMPILER, EMULATOR, native
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import HardwareError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds import all_kinds
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, problems
from tunecache.tuner.measure.runner import Candidate, Runner, TimingConfig
from tunecache.tuner.search.roller import candidates

HAVE_TOOLS = native() or (shutil.which(CROSS_COMPILER) is not None
                          and shutil.which(EMULATOR) is not None)
needs_tools = pytest.mark.skipif(
    not HAVE_TOOLS, reason=f"needs {CROSS_COMPILER} and {EMULATOR} (Debian: apt-get install "
                           "gcc-aarch64-linux-gnu qemu-user; .ci/run installs them)")

NEON_HW = HardwareSpec(arch="aarch64", isa="neon", vector_bits=128, cores=2, l1d_bytes=64 << 10,
                       l2_bytes=1 << 20, l3_bytes=32 << 20, cpu_model="Neoverse-N1")
# Each kind's smallest example: emulation runs a few hundred times slower than the machine.
SMALLEST = [(kind.name, min(kind.examples, key=lambda text: OpSignature.parse(text).flops))
            for kind in all_kinds()]


def test_the_spec_selects_the_neon_backend_and_its_own_isa_level() -> None:
    assert backend_for(NEON_HW).name == "neon"
    assert NEON_HW.vector_registers == 32 and NEON_HW.lanes == 4
    assert runnable_isas(NEON_HW) == ("neon",)
    assert NEON_LEVEL.name not in runnable_isas(local_spec()) or native()


def test_tiles_use_aarch64s_thirty_two_registers() -> None:
    """An 11x8 matmul tile (22 accumulators) is legal on NEON, not on 16-register levels."""
    op = OpSignature.parse("matmul(M=64,N=64,K=64)")
    wide = replace(default_schedule(op, NEON_HW, 1), mr=11, nr=8, mc=66)
    assert not problems(op, wide, NEON_HW)
    portable = replace(NEON_HW, arch="x86_64", isa="generic")
    assert any("registers" in p for p in problems(op, wide, portable))


def test_the_source_is_the_neon_dialect_and_names_no_x86() -> None:
    op = OpSignature.parse("matmul(M=16,N=32,K=8,epilogue=bias)")
    source = generate(op, default_schedule(op, NEON_HW), NEON_HW)
    assert "arm_neon.h" in source.code and "immintrin" not in source.code
    assert "-march=armv8-a" in source.flags and not any("x86" in f for f in source.flags)


@needs_tools
@pytest.mark.parametrize(("name", "text"), SMALLEST)
def test_each_kinds_top_candidate_computes_the_reference_under_emulation(name: str,
                                                                        text: str) -> None:
    op = OpSignature.parse(text)
    inputs = random_inputs(op, seed=3)
    schedule = candidates(op, NEON_HW, k=1)[0].schedule
    out = compile_kernel(op, schedule, NEON_HW)(*inputs)
    assert check_result(op, inputs, out, reference(op, inputs)) is None, (text, str(schedule))


@needs_tools
@pytest.mark.parametrize("text", ["matmul(M=33,N=40,K=17,epilogue=bias+relu)",
                                  "conv2d(N=1,C=8,H=9,W=9,F=12,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,"
                                  "pad_r=1)"])
def test_default_schedules_compute_the_reference_under_emulation(text: str) -> None:
    op = OpSignature.parse(text)
    inputs = random_inputs(op, seed=5)
    kernel = compile_kernel(op, default_schedule(op, NEON_HW, 1), NEON_HW)
    assert kernel.entry_address is None or native()  # not in this process off aarch64
    assert check_result(op, inputs, kernel(*inputs), reference(op, inputs)) is None
    elf = kernel.path.read_bytes()[:20]  # type: ignore[attr-defined]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64


@pytest.mark.skipif(native(), reason="an aarch64 host times NEON kernels natively")
def test_measuring_off_aarch64_is_refused_not_recorded_from_the_emulator() -> None:
    op = OpSignature.parse("matmul(M=8,N=16,K=8)")
    with Runner(NEON_HW, TimingConfig()) as runner, \
            pytest.raises(HardwareError, match="timed on an aarch64 machine"):
        runner.measure([Candidate(op, default_schedule(op, NEON_HW, 1))])


@needs_tools
def test_an_emulated_kernel_times_on_the_emulator_when_asked() -> None:
    op = OpSignature.parse("matmul(M=8,N=16,K=8)")
    kernel = compile_kernel(op, default_schedule(op, NEON_HW, 1), NEON_HW)
    inputs = random_inputs(op)
    out = kernel(*inputs)
    assert kernel.time(*inputs, out=out, iters=3) > 0
    assert check_result(op, inputs, out, reference(op, inputs)) is None


@pytest.mark.skipif(native(), reason="an aarch64 host runs NEON kernels natively")
def test_without_an_emulator_the_spec_is_refused_with_the_install_hint(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", "/nonexistent")
    op = OpSignature.parse("matmul(M=8,N=16,K=8)")
    with pytest.raises(HardwareError, match="qemu-user"):
        compile_kernel(op, default_schedule(op, NEON_HW, 1), NEON_HW)


@needs_tools
def test_int8_matmul_is_exact_under_emulation() -> None:
    import numpy as np

    from tunecache.compiler.kinds.matmul import matmul_op

    op = matmul_op(9, 20, 13, dtype="int8")
    a, b = random_inputs(op, seed=2)
    out = compile_kernel(op, default_schedule(op, NEON_HW, 1), NEON_HW)(a, b)
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


@needs_tools
def test_bf16_matmul_accumulates_in_float32_under_emulation() -> None:
    from tunecache.compiler.kinds.matmul import matmul_op

    op = matmul_op(9, 20, 13, dtype="bf16")
    inputs = random_inputs(op, seed=4)
    out = compile_kernel(op, default_schedule(op, NEON_HW, 1), NEON_HW)(*inputs)
    assert check_result(op, inputs, out, reference(op, inputs)) is None


@needs_tools
@pytest.mark.parametrize("text", [
    "matmul(M=7,N=20,K=13,dtype=int8,a_type=dynamic,epilogue=dequant+bias+relu)",
    "conv2d(N=1,C=20,H=5,W=6,F=24,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,dtype=int8,"
    "epilogue=dequant+bias+relu)"])
def test_int8_kernels_with_float32_inputs_compute_the_reference_under_emulation(
        text: str) -> None:
    op = OpSignature.parse(text)
    inputs = random_inputs(op, seed=6)
    out = compile_kernel(op, default_schedule(op, NEON_HW, 1), NEON_HW)(*inputs)
    assert check_result(op, inputs, out, reference(op, inputs)) is None


@pytest.mark.skipif(native(), reason="an aarch64 host runs whole models and probes natively")
def test_off_aarch64_a_whole_model_and_the_probes_are_refused_by_name() -> None:
    from tunecache.compiler.errors import BuildError

    backend = backend_for(NEON_HW)
    with pytest.raises(BuildError, match="runs on an aarch64 machine"):
        backend.plan_runner()
    with pytest.raises(BuildError, match="no peak probe"):
        backend.peak_gflops(NEON_HW)
    with pytest.raises(BuildError, match="no bandwidth probe"):
        backend.bandwidth_gbs(NEON_HW)


@needs_tools
@pytest.mark.skipif(native(), reason="on aarch64 kernels load in process, not under emulation")
def test_an_artifact_without_its_build_record_never_reaches_the_emulator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tunecache.compiler.backends.neon.emulated import EmulatedKernel
    from tunecache.compiler.errors import BuildError

    op = OpSignature.parse("matmul(M=8,N=16,K=8)")
    planted = tmp_path / "kernels" / "ab" / "planted.so"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"\x7fELF not a kernel")
    with pytest.raises(BuildError, match="does not match the digest"):
        EmulatedKernel(op, planted)(*random_inputs(op))
