"""The NEON backend: float32 kernels for aarch64 CPUs (128-bit NEON vectors, 32 vector
registers), written in the portable vector-extension vocabulary with NEON's own horizontal
reductions, built by an aarch64 C compiler into shared objects through the same
content-addressed build cache as the CPU backend's. On an aarch64 host the kernels load in
process like the CPU backend's; elsewhere (an x86 farm node checking what it will ship)
they run under qemu-user, one call at a time (:mod:`.emulated`), for correctness only.

It plugs in through the ``tunecache.backends`` entry point and registers the ``neon`` ISA
level of ``aarch64``: nothing outside this package names it. A spec such as
``{"arch": "aarch64", "isa": "neon", "cores": 4, "l1d_bytes": 65536, ...}`` selects it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunecache.compiler.backends import (
    ArchConstants,
    Artifact,
    KernelHandle,
    PlanRunner,
    register_backend,
)
from tunecache.compiler.backends.cpu.isa import kernel_flags
from tunecache.compiler.codegen.isa import IsaDialect, portable_dialect
from tunecache.compiler.errors import BuildError, HardwareError
from tunecache.compiler.hardware import HardwareSpec, IsaLevel, register_isa_level

if TYPE_CHECKING:
    from tunecache.compiler.codegen import KernelSource
    from tunecache.compiler.ops import OpSignature
    from tunecache.compiler.schedule import Schedule

NEON_LEVEL = register_isa_level(IsaLevel("neon", "aarch64", 128, 32, frozenset({"asimd"}), 1))

# addv / fmaxv: one instruction each, where the portable spelling adds lanes pairwise.
_REDUCTIONS = """\
#include <arm_neon.h>
#undef VHSUM
#define VHSUM(v) vaddvq_f32((float32x4_t)(v))
"""
NEON_DIALECT: IsaDialect = portable_dialect(("-march=armv8-a",), name="neon", extra=_REDUCTIONS)

# Nominal numbers of an Arm Neoverse N1 class core (two 128-bit FMA pipes, latency 4; fmla
# by element reads a broadcast operand from a register loaded four lanes at a time). Not
# measured: no aarch64 machine has run these kernels yet, so they rank candidates, no more.
NEON_CONSTANTS = ArchConstants(ghz=2.5, fma_pipes=2, fma_in_flight=8, broadcast_loads=0.5)


@dataclass(frozen=True)
class NeonBackend:
    """aarch64 NEON: C with vector extensions, an aarch64 compiler, qemu-user off aarch64."""

    name: str = "neon"

    def supports(self, hw: HardwareSpec) -> bool:
        return hw.arch == NEON_LEVEL.arch and hw.isa == NEON_LEVEL.name

    def dialect(self, hw: HardwareSpec) -> IsaDialect:
        return NEON_DIALECT

    def build_flags(self, hw: HardwareSpec, schedule: Schedule) -> tuple[str, ...]:
        return kernel_flags(NEON_DIALECT, schedule.threads)

    def ensure_runnable(self, hw: HardwareSpec) -> None:
        from tunecache.compiler.backends.neon.toolchain import emulator

        emulator()

    def ensure_measurable(self, hw: HardwareSpec) -> None:
        from tunecache.compiler.backends.neon.toolchain import native

        if not native():
            raise HardwareError(
                f"kernels for {hw.hw_id} are timed on an aarch64 machine: here they run only "
                "under emulation, which checks them but whose times say nothing of that "
                "machine (compile and check them here; tune them there)")

    def toolchain(self) -> str:
        from tunecache.compiler.backends.neon.toolchain import find_compiler

        return find_compiler().identity

    def build(self, source: KernelSource) -> Artifact:
        from tunecache.compiler.backends.cpu.build import build_source
        from tunecache.compiler.backends.neon.toolchain import find_compiler

        return build_source(source.code, source.flags, compiler=find_compiler())

    def load(self, op: OpSignature, artifact: Path) -> KernelHandle:
        from tunecache.compiler.backends.neon.toolchain import native

        if native():
            from tunecache.compiler.backends.cpu.kernel import load_kernel

            return load_kernel(op, artifact)
        from tunecache.compiler.backends.neon.emulated import EmulatedKernel

        return EmulatedKernel(op, Path(artifact))

    def runtime_artifacts(self) -> tuple[Artifact, ...]:
        from tunecache.compiler.backends.cpu.runner import runner_artifact

        self.plan_runner()  # only where a whole model runs
        return (runner_artifact(),)

    def install_artifact(self, key: str, data: bytes) -> Artifact:
        from tunecache.compiler.backends.cpu.build import install_artifact

        return install_artifact(key, data)

    def adopt_toolchain(self, identity: str) -> None:
        from tunecache.compiler.backends.cpu.build import adopt_toolchain

        adopt_toolchain(identity)

    def worker_environment(self) -> dict[str, str]:
        return {}

    def prepare_measurement(self) -> None:
        from tunecache.compiler.backends.neon.toolchain import harness, native

        if not native():
            harness()

    def plan_runner(self) -> PlanRunner:
        from tunecache.compiler.backends.neon.toolchain import native

        if not native():
            raise BuildError("a whole model compiled for aarch64 runs on an aarch64 machine; "
                             "here its kernels can only be checked one by one")
        from tunecache.compiler.backends.cpu.runner import plan_runner

        return plan_runner()

    def constants(self, hw: HardwareSpec) -> ArchConstants:
        return NEON_CONSTANTS

    def peak_gflops(self, hw: HardwareSpec, threads: int = 1) -> float:
        raise BuildError("the NEON backend has no peak probe yet (no aarch64 machine measured)")

    def bandwidth_gbs(self, hw: HardwareSpec, threads: int = 1) -> float:
        raise BuildError("the NEON backend has no bandwidth probe yet (no aarch64 machine "
                         "measured)")


NEON = register_backend(NeonBackend())
