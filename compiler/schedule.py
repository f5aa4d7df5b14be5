"""Schedules: the knobs of a kernel, as plain data validated against (op, hardware).

A schedule never carries code. It is a frozen dataclass of named integers and enumerations
with a canonical JSON form and a stable ``schedule_id``; :func:`validate` checks it against
the legal space of its operator and hardware **before** any code is generated, and raises a
:class:`ScheduleError` listing every problem.

Matmul knobs (also used by ``batch_matmul``), following the BLIS five-loop structure:

* ``mr`` x ``nr``: the register micro-tile of C; ``nr`` is a multiple of the vector lanes and
  ``mr*nr/lanes + nr/lanes + 1`` vector registers must fit the register file.
* ``kc``, ``mc``, ``nc``: cache blocks of K, M and N (``mc`` a multiple of ``mr``, ``nc`` of
  ``nr``); a block larger than its dimension simply covers it.
* ``pack_a``, ``pack_b``: copy A / B blocks into aligned, zero-padded panels (1) or read
  them in place (0; B in place needs B stored untransposed). Edge panels are always packed.
* ``loop_order``: ``jpi`` (BLIS: B block outermost, shared) or ``ipj`` (A block outermost).
* ``unroll``: unroll factor of the micro-kernel's k loop.
* ``threads`` and ``parallel``: OpenMP threads and the loop they split: ``m`` (row blocks),
  ``n`` (column micro-panels) or ``batch``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from tunecache.compiler.errors import ScheduleError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature

# Hard limits that keep generated code and buffers sane, independent of hardware.
MAX_MR = 32
MAX_NR_VECTORS = 8
MAX_KC = 8192
MAX_BLOCK = 1 << 16
MAX_PACKED_BYTES = 256 << 20
UNROLLS = (1, 2, 4, 8)
LOOP_ORDERS = ("jpi", "ipj")
PARALLEL_AXES = ("m", "n", "batch")
MAX_THREADS = 256


@dataclass(frozen=True, slots=True)
class MatmulSchedule:
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

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, **asdict(self)}

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): what the store keeps."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def schedule_id(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> MatmulSchedule:
        data = asdict(self)
        unknown = sorted(set(changes) - set(data))
        if unknown:
            raise ScheduleError(f"unknown matmul knob(s) {', '.join(unknown)}")
        data.update(changes)
        return MatmulSchedule(**data)

    def __str__(self) -> str:
        return (
            f"mr{self.mr}xnr{self.nr} kc{self.kc} mc{self.mc} nc{self.nc} "
            f"pack{self.pack_a}{self.pack_b} {self.loop_order} u{self.unroll} "
            f"t{self.threads}{self.parallel}"
        )


Schedule = MatmulSchedule
FAMILY_OF_KIND = {"matmul": "matmul", "batch_matmul": "matmul"}
_CLASSES: dict[str, type[MatmulSchedule]] = {"matmul": MatmulSchedule}


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    """Build a schedule from its dict form, checking names and types (not legality)."""
    if not isinstance(data, dict):
        raise ScheduleError(f"a schedule must be a JSON object, got {type(data).__name__}")
    data = dict(data)
    family = data.pop("family", "matmul")
    cls = _CLASSES.get(family)
    if cls is None:
        raise ScheduleError(
            f"unknown schedule family {family!r}; expected one of {', '.join(_CLASSES)}"
        )
    specs = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(specs))
    if unknown:
        raise ScheduleError(
            f"unknown {family} knob(s) {', '.join(unknown)}; knobs: {', '.join(specs)}"
        )
    missing = [name for name, f in specs.items() if name not in data and f.default is _MISSING]
    if missing:
        raise ScheduleError(f"{family} schedule is missing knob(s) {', '.join(missing)}")
    for name, value in data.items():
        want = str if specs[name].type in ("str", str) else int
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ScheduleError(f"{family} knob {name} must be an integer, got {value!r}")
        if want is str and not isinstance(value, str):
            raise ScheduleError(f"{family} knob {name} must be a string, got {value!r}")
    return cls(**data)


def schedule_from_json(text: str) -> Schedule:
    """Parse a schedule's JSON text (as stored or given on the command line)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ScheduleError(f"schedule is not valid JSON: {exc}") from None
    return schedule_from_dict(data)


_MISSING = fields(MatmulSchedule)[0].default  # dataclasses.MISSING, without a private import


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
    elif 1 <= s.mr <= MAX_MR:
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
    if s.pack_b == 0 and op.trans_b:
        problems.append("pack_b=0 needs B stored untransposed (layout ?n); this op has B transposed")
    if s.loop_order not in LOOP_ORDERS:
        problems.append(f"loop_order={s.loop_order!r}; expected one of {', '.join(LOOP_ORDERS)}")
    if s.unroll not in UNROLLS:
        problems.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLLS))}")
    if not 1 <= s.threads <= min(hw.cores, MAX_THREADS):
        problems.append(f"threads={s.threads} out of range 1..{min(hw.cores, MAX_THREADS)} "
                        f"({hw.cores} cores)")
    if s.parallel not in PARALLEL_AXES:
        problems.append(
            f"parallel={s.parallel!r}; expected one of {', '.join(PARALLEL_AXES)}"
        )
    elif s.parallel == "batch" and op.kind != "batch_matmul":
        problems.append("parallel=batch needs a batch_matmul op")
    if not problems:
        packed = 4 * (s.kc * s.nc + s.mc * s.kc * s.threads)
        if packed > MAX_PACKED_BYTES:
            problems.append(
                f"packed buffers would take {packed >> 20} MiB (> {MAX_PACKED_BYTES >> 20} MiB)"
            )
    return problems


def problems(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``schedule`` is illegal for ``op`` on ``hw`` (empty when legal)."""
    family = FAMILY_OF_KIND.get(op.kind)
    if family is None:
        return [f"no schedule space for op kind {op.kind!r}"]
    if schedule.family != family:
        return [f"a {schedule.family} schedule cannot drive a {op.kind} op"]
    return matmul_problems(op, schedule, hw)


def validate(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> Schedule:
    """Return ``schedule`` if legal for ``op`` on ``hw``, else raise :class:`ScheduleError`."""
    found = problems(op, schedule, hw)
    if found:
        raise ScheduleError(f"illegal schedule for {op.text} on {hw.hw_id}: " + "; ".join(found))
    return schedule


def default_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> Schedule:
    """A reasonable hand-picked schedule (BLIS-style blocking) for quick benchmarks.

    The analytical tiler proposes better ones; this exists so that a kernel can be built
    without any tuning.
    """
    lanes = hw.lanes
    if hw.isa == "avx512":
        mr, nr = 14, 2 * lanes
    elif hw.isa == "avx2":
        mr, nr = 6, 2 * lanes
    else:
        mr, nr = 6, 2 * lanes
    kc = 384 if hw.isa == "avx512" else 256
    mc = max(mr, (hw.l2_bytes // 2) // (kc * 4) // mr * mr)
    l3_share = hw.l3_bytes // max(1, hw.l3_shared_by) * max(1, min(threads, hw.l3_shared_by))
    nc = max(nr, min(4096, l3_share // 2 // (kc * 4)) // nr * nr)
    parallel = "batch" if op.kind == "batch_matmul" and op.batch >= threads else "m"
    if parallel == "m" and threads > 1 and op.dim("M") < mc * threads:
        parallel = "n"
    return MatmulSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, threads=threads, parallel=parallel)
