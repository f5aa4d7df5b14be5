"""C code generation: (op, schedule, hardware) → a self-contained C translation unit.

The schedule is validated against the op and hardware before any code is produced, so
nothing that reaches the C compiler comes from unchecked data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tunecache.compiler.backends import backend_for
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import emitter
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, validate

# Bump whenever generated code can change for the same (op, schedule, hardware): cached
# schedules measured with another codegen version are not trusted.
# 2: pre-packed weight entries (tc_pack_weights / tc_kernel_packed); conv2d kernels are
#    timed with their weights packed once, as compiled models run them.
CODEGEN_VERSION = "2"

__all__ = ["CODEGEN_VERSION", "KernelSource", "generate"]


@dataclass(frozen=True, slots=True)
class KernelSource:
    """Generated C source plus the flags it must be compiled with."""

    op: OpSignature
    schedule: Schedule
    isa: str
    code: str
    flags: tuple[str, ...]
    codegen_version: str = CODEGEN_VERSION

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]


def generate(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> KernelSource:
    """Validate ``schedule`` for ``op`` on ``hw`` and emit the kernel's C source."""
    validate(op, schedule, hw)
    backend = backend_for(hw)
    d = backend.dialect(hw)
    header = (
        f"/* tunecache kernel, codegen v{CODEGEN_VERSION}\n"
        f" * op: {op.text}\n * schedule: {schedule.to_json()}\n * isa: {hw.isa} */\n"
    )
    body = emitter(op.kind, d.name)(op, schedule, d)
    return KernelSource(op, schedule, hw.isa, header + body, backend.build_flags(hw, schedule))
