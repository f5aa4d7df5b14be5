"""The matmul schedule family (also used by ``batch_matmul``): knobs, legal space, default.

Knobs, following the BLIS five-loop structure:

* ``mr`` x ``nr``: the register micro-tile of C; ``nr`` is a multiple of the vector lanes and
  ``mr*nr/lanes + nr/lanes + 1`` vector registers must fit the register file.
* ``kc``, ``mc``, ``nc``: cache blocks of K, M and N (``mc`` a multiple of ``mr``, ``nc`` of
  ``nr``); a block larger than its dimension simply covers it.
* ``pack_a``, ``pack_b``: copy A / B blocks into aligned, zero-padded panels (1) or read
  them in place (0; B in place needs B stored untransposed). Edge panels are always packed.
* ``loop_order``: ``jpi`` (BLIS: B block outermost, shared), ``ipj`` (A block outermost), or
  ``dot`` for ``C = A·Bᵀ`` (layout ``nt``): dot products along K with ``mr`` rows of A times
  ``nr/lanes`` rows of B in registers, nothing packed (``pack_a=pack_b=0``; ``kc``/``mc``
  unused, ``nc`` rows of B per cache block) — matrix-vector products' path.
* ``unroll``: unroll factor of the micro-kernel's k loop.
* ``threads`` and ``parallel``: OpenMP threads and the loop they split: ``m`` (row blocks),
  ``n`` (column micro-panels) or ``batch``.
* ``strassen``: 1 runs one level of Strassen's algorithm (``emit_strassen.py``): seven
  products of half-size blocks in place of eight, 12.5% fewer FLOPs, for a ``matmul`` whose
  B is constant weights packed once (the seven B combinations are formed when packing); 2
  runs two levels, 49 products of quarter-size blocks in place of 64 (23% fewer FLOPs, 3.06x
  the packed weight bytes against 1.75x). ``mc`` x ``nc`` is then the block of each C block
  the products update while it stays in L2, ``kc`` blocks K's block; threads split the
  column micro-panels.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import (
    MAX_BLOCK,
    MAX_MR,
    MAX_NR_VECTORS,
    MAX_PACKED_BYTES,
    ScheduleData,
    threads_problem,
)

MAX_KC = 8192
UNROLLS = (1, 2, 4, 8)
LOOP_ORDERS = ("jpi", "ipj", "dot", "amx")
PARALLEL_AXES = ("m", "n", "batch")


@dataclass(frozen=True, slots=True)
class MatmulSchedule(ScheduleData):
    """Knobs of a BLIS-style matmul / batch_matmul kernel (see the module docstring)."""

    family: ClassVar[str] = "matmul"

    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    pack_a: int = 1
    pack_b: int = 1
    loop_order: str = "jpi"
    unroll: int = 1
    threads: int = 1
    parallel: str = "m"
    strassen: int = 0

    later_knobs: ClassVar[frozenset[str]] = frozenset({"strassen"})

    def __str__(self) -> str:
        return (
            f"mr{self.mr}xnr{self.nr} kc{self.kc} mc{self.mc} nc{self.nc} "
            f"pack{self.pack_a}{self.pack_b} {self.loop_order} u{self.unroll} "
            f"t{self.threads}{self.parallel}" + (f" strassen{self.strassen}" if self.strassen else "")
        )


def matmul_problems(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for ``op`` on ``hw`` (empty when legal)."""
    problems: list[str] = []
    lanes = hw.lanes
    if not 1 <= s.mr <= MAX_MR:
        problems.append(f"mr={s.mr} out of range 1..{MAX_MR}")
    if s.nr < 1 or s.nr % lanes:
        problems.append(f"nr={s.nr} must be a positive multiple of {lanes} ({hw.isa} lanes)")
    elif s.nr // lanes > MAX_NR_VECTORS:
        problems.append(f"nr={s.nr} exceeds {MAX_NR_VECTORS} vectors of {lanes} lanes")
    elif 1 <= s.mr <= MAX_MR and s.loop_order != "amx":  # tiles: gemm_problems
        nv = s.nr // lanes
        needed = s.mr * nv + nv + 1
        if needed > hw.vector_registers:
            problems.append(
                f"micro-tile {s.mr}x{s.nr} needs {needed} vector registers "
                f"({s.mr * nv} accumulators + {nv} B vectors + 1 broadcast); {hw.isa} has "
                f"{hw.vector_registers}"
            )
    if not 1 <= s.kc <= MAX_KC:
        problems.append(f"kc={s.kc} out of range 1..{MAX_KC}")
    if s.mc < 1 or s.mc > MAX_BLOCK or (s.mr >= 1 and s.mc % s.mr):
        problems.append(f"mc={s.mc} must be a multiple of mr={s.mr} in 1..{MAX_BLOCK}")
    if s.nc < 1 or s.nc > MAX_BLOCK or (s.nr >= 1 and s.nc % s.nr):
        problems.append(f"nc={s.nc} must be a multiple of nr={s.nr} in 1..{MAX_BLOCK}")
    if s.pack_a not in (0, 1) or s.pack_b not in (0, 1):
        problems.append(f"pack_a={s.pack_a}, pack_b={s.pack_b}: each must be 0 or 1")
    if s.loop_order == "dot":
        if op.attr("layout") != "nt":
            problems.append("loop_order=dot needs layout nt (A untransposed, B transposed); "
                            f"this op has layout {op.attr('layout')}")
        if s.pack_a or s.pack_b:
            problems.append("loop_order=dot reads A and B in place: use pack_a=0, pack_b=0")
    elif s.pack_b == 0 and op.trans_b:
        problems.append("pack_b=0 needs B stored untransposed (layout ?n); this op has B transposed")
    if s.loop_order == "amx" and (op.dtype == "float32" or "B" in op.dims_dict):
        problems.append("loop_order=amx (matrix tiles) is for int8 and bf16 matmuls")
    if s.loop_order not in LOOP_ORDERS:
        problems.append(f"loop_order={s.loop_order!r}; expected one of {', '.join(LOOP_ORDERS)}")
    if s.unroll not in UNROLLS:
        problems.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLLS))}")
    problems += threads_problem(s.threads, hw)
    if s.parallel not in PARALLEL_AXES:
        problems.append(
            f"parallel={s.parallel!r}; expected one of {', '.join(PARALLEL_AXES)}"
        )
    elif s.parallel == "batch" and "B" not in op.dims_dict:
        problems.append("parallel=batch needs a batch_matmul op (one with a batch dim B)")
    if s.strassen:
        problems += _strassen_problems(op, s)
    if not problems:
        packed = 4 * (s.kc * s.nc + s.mc * s.kc * s.threads)
        if packed > MAX_PACKED_BYTES:
            problems.append(
                f"packed buffers would take {packed >> 20} MiB (> {MAX_PACKED_BYTES >> 20} MiB)"
            )
    return problems


STRASSEN_LEVELS = (0, 1, 2)
"""``strassen``: no Strassen, one level (7 products of half-size blocks) or two (49 of
quarter-size blocks)."""
STRASSEN_MIN_BLOCK = 8
"""Strassen's blocks are each dimension over ``2 ** levels``: below this there is nothing to
save."""


def strassen_blocks(op: OpSignature, levels: int) -> tuple[int, int, int]:
    """M, N and K of the blocks ``levels`` of Strassen multiply (``2 ** levels`` to a
    dimension, rounded up)."""
    parts = 2 ** levels
    M, N, K = (-(-op.dim(name) // parts) for name in ("M", "N", "K"))
    return M, N, K


def _strassen_problems(op: OpSignature, s: MatmulSchedule) -> list[str]:
    knob = f"strassen={s.strassen}"
    if s.strassen not in STRASSEN_LEVELS:
        return [f"{knob}; expected one of {', '.join(map(str, STRASSEN_LEVELS))} (levels)"]
    problems = []
    if "B" in op.dims_dict:
        problems.append(f"{knob} needs a matmul (constant B, packed once); "
                        "this is a batch_matmul")
    least = STRASSEN_MIN_BLOCK * 2 ** s.strassen
    small = [f"{n}={op.dim(n)}" for n in ("M", "N", "K") if op.dim(n) < least]
    if small:
        problems.append(f"{knob} needs M, N and K of at least {least}; "
                        f"this op has {', '.join(small)}")
    if (s.pack_a, s.pack_b, s.loop_order) != (1, 1, "jpi"):
        problems.append(f"{knob} packs both operands in its own loop order: use pack_a=1, "
                        "pack_b=1, loop_order=jpi")
    if s.threads > 1 and s.parallel != "n":
        problems.append(f"{knob} splits column micro-panels among threads: use parallel=n")
    return problems


def default_matmul_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> MatmulSchedule:
    """A reasonable hand-picked schedule (BLIS-style blocking) for quick benchmarks.

    The analytical tiler proposes better ones; this exists so that a kernel can be built
    without any tuning.
    """
    lanes = hw.lanes
    wide = hw.vector_bits >= 512  # 16-float vectors: taller tiles and deeper K blocks pay
    mr, nr = (14 if wide else 6), 2 * lanes
    kc = 384 if wide else 256
    mc = max(mr, (hw.l2_bytes // 2) // (kc * 4) // mr * mr)
    l3_share = hw.l3_bytes // max(1, hw.l3_shared_by) * max(1, min(threads, hw.l3_shared_by))
    nc = max(nr, min(4096, l3_share // 2 // (kc * 4)) // nr * nr)
    parallel = "batch" if "B" in op.dims_dict and op.batch >= threads else "m"
    if parallel == "m" and threads > 1 and op.dim("M") < mc * threads:
        parallel = "n"
    return MatmulSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, threads=threads, parallel=parallel)
