"""The CPU backend: C with per-ISA intrinsics (AVX-512, AVX2, portable vector extensions),
built by the system C compiler into shared objects (:mod:`tunecache.compiler.build`) and
called through ctypes (:mod:`tunecache.compiler.runtime`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunecache.compiler.backends import ArchConstants, register_backend
from tunecache.compiler.codegen import KernelSource
from tunecache.compiler.codegen.isa import DIALECTS, IsaDialect, dialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import Kernel, load_kernel

# Nominal per-core numbers of the x86 VMs this project runs on: FMA with 2 pipes and 4-cycle
# latency; libgomp's fork/join and barriers on a 2-vCPU VM are 2-3x bare metal.
X86_CONSTANTS = ArchConstants()


@dataclass(frozen=True)
class CpuBackend:
    """C + intrinsics, gcc/clang, ``.so`` + ctypes."""

    name: str = "cpu"

    def supports(self, hw: HardwareSpec) -> bool:
        return hw.isa in DIALECTS

    def dialect(self, hw: HardwareSpec) -> IsaDialect:
        return dialect(hw.isa)

    def build(self, source: KernelSource) -> Path:
        from tunecache.compiler.build import build

        return build(source).path

    def load(self, op: OpSignature, artifact: Path) -> Kernel:
        return load_kernel(op, artifact)

    def constants(self, hw: HardwareSpec) -> ArchConstants:
        return X86_CONSTANTS


CPU = register_backend(CpuBackend())
