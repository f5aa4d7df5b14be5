"""The CPU backend: C with per-ISA intrinsics (AVX-512, AVX2, portable vector extensions;
:mod:`.isa`), built by the system C compiler into shared objects through a content-addressed
cache (:mod:`.build`, :mod:`.pch`, :mod:`.artifacts`), loaded and called through ctypes
(:mod:`.kernel`), a whole model's plan run by a small C runner (:mod:`.runner`), OpenMP
threads that wait politely (:mod:`.threads`), and the machine probes (:mod:`.probe`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.compiler.backends import ArchConstants, Artifact, register_backend
from tunecache.compiler.backends.cpu.isa import DIALECTS, dialect, dialect_for, kernel_flags
from tunecache.compiler.hardware import HardwareSpec, ensure_runnable

if TYPE_CHECKING:
    from tunecache.compiler.backends.cpu.kernel import Kernel
    from tunecache.compiler.backends.cpu.runner import CpuPlanRunner
    from tunecache.compiler.codegen import KernelSource
    from tunecache.compiler.codegen.isa import IsaDialect
    from tunecache.compiler.ops import OpSignature
    from tunecache.compiler.schedule import Schedule

# Nominal per-core numbers of the x86 VMs this project runs on: FMA with 2 pipes and 4-cycle
# latency; libgomp's fork/join and barriers on a 2-vCPU VM are 2-3x bare metal. Without
# AVX-512's embedded broadcast every broadcast is a load instruction and a register of its
# own: on the AVX2 Zen 3 VM, one thread, ResNet-50's blocked 1x1 convolutions ran 1.2-1.8x
# faster with two- or three-vector tiles (12 accumulators, 6 or 4 pixels) than with the
# one-vector 14-pixel tiles a broadcast at half a load rated best (256->128 channels at
# 56x56: 2.48 against 4.07 ms), and the matmul's 8x8 tiles ran 41-67 GFLOP/s against 63-78
# for 4x24 (ARCHITECTURE change 56).
X86_CONSTANTS = ArchConstants(broadcast_loads=1.5)
# Zen 4, the one AVX-512 machine met, runs a 512-bit FMA on both of its 256-bit pipes: the
# peak probe reads the same 117.5 GFLOP/s at AVX-512 and at AVX2 there, so four 512-bit
# FMAs in flight (one per cycle, latency 4) keep it busy, and an 8-accumulator tile is not
# latency bound (8 x 1 vectors is the fastest implicit-GEMM tile of ResNet-50's 56x56 1x1
# layer at AVX-512, while 12-accumulator tiles win it at AVX2). The pipes stay at 2: the
# bandwidth constants were fitted against that compute scale, and halving it moved the
# tiler's top-1 on matmuls (1024^3: 0.72 of the best, Strassen's two levels first).
AVX512_CONSTANTS = replace(X86_CONSTANTS, fma_in_flight=4, broadcast_loads=0.5)
# Xeon Scalable cores (Skylake-SP Gold 6000 and Platinum, and every generation since) have two
# 512-bit FMA units: the AVX-512 Xeon VM's peak probe read 167-169 GFLOP/s per core at
# AVX-512 and 79-83 at AVX2. Eight FMAs in flight keep them busy, and a broadcast is a load
# of its own there: with two FMAs and two vector loads a cycle, a tile needs at least one
# FMA per load, which tall one-vector tiles (16 broadcasts and a vector load for 16 FMAs)
# do not reach (ARCHITECTURE change 72). Those cores also compute about three times as fast
# per byte of memory bandwidth as Zen 4 (a one-thread copy moved 11 GB/s against 33), and a
# matmul's weight stream is not hidden behind its compute (ARCHITECTURE change 84): on the
# second Xeon VM, Strassen's B sums (1.75x the weights' bytes) ran BERT's FFN up-projection
# 1.04-1.10x and GPT-2's LM head 1.07-1.12x the plain kernel's time where the estimate had
# ranked them 10% faster, and splitting its rows at two threads (each thread streams all the
# weights) 1.24x splitting its columns, where the two had tied.
XEON_AVX512_CONSTANTS = replace(X86_CONSTANTS, fma_in_flight=8, broadcast_loads=1.0,
                                weight_stream_exposed=1.0)


@dataclass(frozen=True)
class CpuBackend:
    """C + intrinsics, gcc/clang, ``.so`` + ctypes."""

    name: str = "cpu"

    def supports(self, hw: HardwareSpec) -> bool:
        return hw.isa in DIALECTS

    def dialect(self, hw: HardwareSpec) -> IsaDialect:
        return dialect_for(hw.isa, hw.features)

    def build_flags(self, hw: HardwareSpec, schedule: Schedule) -> tuple[str, ...]:
        return kernel_flags(dialect(hw.isa), schedule.threads)

    def ensure_runnable(self, hw: HardwareSpec) -> None:
        ensure_runnable(hw)

    def ensure_measurable(self, hw: HardwareSpec) -> None:
        ensure_runnable(hw)  # every CPU that runs the code times it

    def toolchain(self) -> str:
        from tunecache.compiler.backends.cpu.build import find_compiler

        return find_compiler().identity

    def build(self, source: KernelSource) -> Artifact:
        from tunecache.compiler.backends.cpu.build import build

        return build(source)

    def load(self, op: OpSignature, artifact: Path) -> Kernel:
        from tunecache.compiler.backends.cpu.kernel import load_kernel

        return load_kernel(op, artifact)

    def runtime_artifacts(self) -> tuple[Artifact, ...]:
        from tunecache.compiler.backends.cpu.runner import runner_artifact

        return (runner_artifact(),)

    def install_artifact(self, key: str, data: bytes) -> Artifact:
        from tunecache.compiler.backends.cpu.build import install_artifact

        return install_artifact(key, data)

    def adopt_toolchain(self, identity: str) -> None:
        from tunecache.compiler.backends.cpu.build import adopt_toolchain

        adopt_toolchain(identity)

    def worker_environment(self) -> dict[str, str]:
        # OpenMP threads pinned to cores while timed, unless the user chose otherwise.
        return {"OMP_PROC_BIND": os.environ.get("OMP_PROC_BIND", "close"),
                "OMP_PLACES": os.environ.get("OMP_PLACES", "cores")}

    def prepare_measurement(self) -> None:
        from tunecache.compiler.backends.cpu.runner import build_runner

        build_runner()

    def plan_runner(self) -> CpuPlanRunner:
        from tunecache.compiler.backends.cpu.runner import plan_runner

        return plan_runner()

    def peak_gflops(self, hw: HardwareSpec, threads: int = 1) -> float:
        from tunecache.compiler.backends.cpu.probe import measure_peak_gflops

        return measure_peak_gflops(hw, threads)

    def bandwidth_gbs(self, hw: HardwareSpec, threads: int = 1) -> float:
        from tunecache.compiler.backends.cpu.probe import measure_bandwidth_gbs

        return measure_bandwidth_gbs(hw, threads)

    def constants(self, hw: HardwareSpec) -> ArchConstants:
        if two_fma512_units(hw):
            return XEON_AVX512_CONSTANTS
        return AVX512_CONSTANTS if hw.isa == "avx512" else X86_CONSTANTS


def two_fma512_units(hw: HardwareSpec) -> bool:
    """Whether ``hw``'s cores have two 512-bit FMA units (known from the CPU's name: the spec
    carries no measured throughput)."""
    return hw.isa == "avx512" and "xeon" in hw.cpu_model.lower()


CPU = register_backend(CpuBackend())
