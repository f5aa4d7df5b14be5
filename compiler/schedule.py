"""Schedules: the knobs of a kernel, as plain data validated against (op, hardware).

A schedule never carries code. It is a frozen dataclass of named integers and enumerations
(one class per *family*, defined by the op kind that owns it, e.g.
:class:`tunecache.compiler.kinds.matmul.MatmulSchedule`) with a canonical JSON form and a
stable ``schedule_id``; :func:`validate` checks it against the legal space of its operator
and hardware **before** any code is generated, and raises a :class:`ScheduleError` listing
every problem. Every family has a ``threads`` knob. The knobs of each family are documented
in its kind's module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, fields
from typing import Any, ClassVar, TypeVar, cast

from tunecache.compiler.errors import ScheduleError, TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature

# Hard limits that keep generated code and buffers sane, independent of hardware and kind.
MAX_MR = 32
MAX_NR_VECTORS = 8
MAX_BLOCK = 1 << 16
MAX_PACKED_BYTES = 256 << 20
MAX_THREADS = 256


_S = TypeVar("_S", bound="ScheduleData")


class ScheduleData:
    """What every schedule family shares: canonical JSON, a stable id, ``replace``.

    Mixed into frozen, slotted dataclasses; a schedule is data and nothing else. Every
    family has a ``threads`` knob (the OpenMP threads its kernel uses).
    """

    __slots__ = ()
    family: ClassVar[str]
    threads: int
    later_knobs: ClassVar[frozenset[str]] = frozenset()
    """Knobs added after schedules of the family were stored: left out of the JSON while at
    their default, so every schedule stored before keeps its text and ``schedule_id``."""

    def knobs(self) -> dict[str, Any]:
        """Knob name -> value (the JSON form without ``family``)."""
        return asdict(cast(Any, self))

    def to_dict(self) -> dict[str, Any]:
        knobs = asdict(cast(Any, self))
        defaults = {f.name: f.default for f in fields(cast(Any, self))}
        for name in self.later_knobs:
            if knobs[name] == defaults[name]:
                del knobs[name]
        return {"family": self.family, **knobs}

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): what the store keeps."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def schedule_id(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def replace(self: _S, **changes: Any) -> _S:
        """A copy with some knobs changed (unknown knob names are refused)."""
        data = asdict(cast(Any, self))
        unknown = sorted(set(changes) - set(data))
        if unknown:
            raise ScheduleError(f"unknown {self.family} knob(s) {', '.join(unknown)}")
        data.update(changes)
        return type(self)(**data)


Schedule = ScheduleData
"""Any schedule (the type generic code names)."""


def _classes() -> dict[str, type[ScheduleData]]:
    from tunecache.compiler.kinds import schedule_classes

    return schedule_classes()


def knob_types(cls: type[ScheduleData]) -> dict[str, type]:
    """Knob name -> ``int`` or ``str`` for a schedule class, in field order."""
    return {f.name: str if f.type in ("str", str) else int for f in fields(cast(Any, cls))}


def schedule_from_dict(data: dict[str, Any], kind: str | None = None) -> Schedule:
    """Build a schedule from its dict form, checking names and types (not legality).

    ``family`` may be left out when ``kind`` names the op kind the schedule is for.
    """
    if not isinstance(data, dict):
        raise ScheduleError(f"a schedule must be a JSON object, got {type(data).__name__}")
    data = dict(data)
    classes = _classes()
    family = data.pop("family", None)
    if family is None:
        # Before families existed every stored schedule was of the first builtin family.
        family = _family_of_kind(kind) if kind is not None else next(iter(classes))
    cls = classes.get(family) if isinstance(family, str) else None
    if cls is None:
        raise ScheduleError(
            f"unknown schedule family {family!r}; expected one of {', '.join(classes)}"
        )
    specs = {f.name: f for f in fields(cast(Any, cls))}
    unknown = sorted(set(data) - set(specs))
    if unknown:
        raise ScheduleError(
            f"unknown {family} knob(s) {', '.join(unknown)}; knobs: {', '.join(specs)}"
        )
    missing = [name for name, f in specs.items() if name not in data and f.default is MISSING]
    if missing:
        raise ScheduleError(f"{family} schedule is missing knob(s) {', '.join(missing)}")
    for name, value in data.items():
        want = str if specs[name].type in ("str", str) else int
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ScheduleError(f"{family} knob {name} must be an integer, got {value!r}")
        if want is str and not isinstance(value, str):
            raise ScheduleError(f"{family} knob {name} must be a string, got {value!r}")
    return cls(**data)


def schedule_from_json(text: str, kind: str | None = None) -> Schedule:
    """Parse a schedule's JSON text (as stored or given on the command line)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError) as exc:
        raise ScheduleError(f"schedule is not valid JSON: {exc}") from None
    return schedule_from_dict(data, kind)


def _family_of_kind(kind: str) -> str | None:
    from tunecache.compiler.kinds import op_kind

    try:
        return op_kind(kind).schedule.family
    except TunecacheError:
        return None


def problems(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``schedule`` is illegal for ``op`` on ``hw`` (empty when legal)."""
    kind = op_kind(op.kind)
    if type(schedule) is not kind.schedule:
        return [f"a {schedule.family} schedule cannot drive a {op.kind} op"]
    return kind.problems(op, schedule, hw)


def validate(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> Schedule:
    """Return ``schedule`` if legal for ``op`` on ``hw``, else raise :class:`ScheduleError`."""
    found = problems(op, schedule, hw)
    if found:
        raise ScheduleError(f"illegal schedule for {op.text} on {hw.hw_id}: " + "; ".join(found))
    return schedule




def in_model(op: OpSignature, schedule: Schedule) -> Schedule:
    """``schedule`` as it runs inside a compiled model (its kind's ``in_model``; itself when
    the kind has none)."""
    kind = op_kind(op.kind)
    return kind.in_model(op, schedule) if kind.in_model is not None else schedule


def default_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> Schedule:
    """A reasonable hand-picked schedule for ``op`` (its kind's default), for quick
    benchmarks and untuned builds; the analytical tiler proposes better ones."""
    return op_kind(op.kind).default_schedule(op, hw, threads)


def threads_problem(threads: int, hw: HardwareSpec) -> list[str]:
    """The ``threads`` knob's legality, shared by every family."""
    top = min(hw.cores, MAX_THREADS)
    return [] if 1 <= threads <= top else [f"threads={threads} out of range 1..{top} "
                                           f"({hw.cores} cores)"]
