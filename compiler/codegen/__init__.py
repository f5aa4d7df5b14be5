"""C code generation: (op, schedule, hardware) → a self-contained C translation unit.

The schedule is validated against the op and hardware before any code is produced, so
nothing that reaches the C compiler comes from unchecked data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tunecache.compiler.codegen.conv2d import generate_conv2d
from tunecache.compiler.codegen.isa import BASE_FLAGS, DIALECTS, dialect
from tunecache.compiler.codegen.matmul import generate_matmul
from tunecache.compiler.codegen.matmul_dot import generate_matmul_dot
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Conv2dSchedule, MatmulSchedule, Schedule, validate

# Bump whenever generated code can change for the same (op, schedule, hardware): cached
# schedules measured with another codegen version are not trusted.
# 2: pre-packed weight entries (tc_pack_weights / tc_kernel_packed); conv2d kernels are
#    timed with their weights packed once, as compiled models run them.
CODEGEN_VERSION = "2"

__all__ = ["CODEGEN_VERSION", "DIALECTS", "KernelSource", "generate"]


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
    d = dialect(hw.isa)
    header = (
        f"/* tunecache kernel, codegen v{CODEGEN_VERSION}\n"
        f" * op: {op.text}\n * schedule: {schedule.to_json()}\n * isa: {hw.isa} */\n"
    )
    if op.kind in ("matmul", "batch_matmul") and isinstance(schedule, MatmulSchedule):
        if schedule.loop_order == "dot":
            body = generate_matmul_dot(op, schedule, d)
        else:
            body = generate_matmul(op, schedule, d)
    elif op.kind == "conv2d" and isinstance(schedule, Conv2dSchedule):
        body = generate_conv2d(op, schedule, d)
    else:  # pragma: no cover - validate() rejects these first
        raise ValueError(f"no code generator for {op.kind}")
    flags = BASE_FLAGS + d.flags + (("-fopenmp",) if schedule.threads > 1 else ())
    return KernelSource(op, schedule, hw.isa, header + body, flags)
