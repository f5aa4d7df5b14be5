"""One measurement as a frozen value, and its conversion to and from Arrow tables."""

from __future__ import annotations

import socket
import statistics
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule
from tunecache.datasets.errors import SchemaError
from tunecache.datasets.paths import check_part
from tunecache.datasets.schema import (
    COLUMNS,
    DERIVED_COLUMNS,
    FIXED_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    STATUSES,
)

_DERIVED = frozenset(DERIVED_COLUMNS)
_FIXED = frozenset(FIXED_COLUMNS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One row of the records dataset; names and meanings are the schema's columns.

    The fixed columns (:data:`~tunecache.datasets.schema.FIXED_COLUMNS`) are fields; the
    derived dim and knob columns, which depend on the registered kinds, live in
    ``columns`` (to be treated as read-only; only the non-null ones) and read as attributes too:
    ``record.dim_m``, ``record.mr`` (None when not set). Build one with :meth:`create`,
    which fills identity, dims and knob columns from the value objects. ``runtimes_s``
    holds the per-call seconds of each repeat.
    """

    record_id: str
    timestamp: datetime
    schema_version: int = SCHEMA_VERSION
    hw_id: str
    hw_isa: str | None = None
    hw_cores: int | None = None
    hw_cpu_model: str | None = None
    hw_json: str | None = None
    op_kind: str
    op_id: str
    op_text: str
    schedule_json: str | None = None
    schedule_id: str | None = None
    compiler: str | None = None
    flags: str | None = None
    codegen_version: str | None = None
    source_hash: str | None = None
    status: str
    error: str | None = None
    runtimes_s: tuple[float, ...] | None = None
    median_s: float | None = None
    min_s: float | None = None
    gflops: float | None = None
    compile_s: float | None = None
    job_id: str | None = None
    host: str | None = None
    source: str | None = None
    predicted: float | None = None
    model_version: str | None = None
    op_dtype: str | None = None
    columns: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise SchemaError(
                f"record status {self.status!r} is not one of {', '.join(STATUSES)}"
            )
        check_part("hw_id", self.hw_id)
        check_part("op_kind", self.op_kind)
        if self.timestamp.tzinfo is None:
            raise SchemaError("record timestamp must be timezone-aware (UTC)")
        unknown = set(self.columns) - _DERIVED
        if unknown:
            raise _unknown_columns(unknown)
        # Only non-null values, in schema order: equal records compare equal however built.
        kept = {name: self.columns[name] for name in DERIVED_COLUMNS
                if self.columns.get(name) is not None}
        object.__setattr__(self, "columns", kept)

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not fields: the derived columns.
        if name in _DERIVED:
            return self.columns.get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_columns(cls, values: Mapping[str, Any]) -> Record:
        """A record from column name -> value (fixed and derived columns alike)."""
        fixed = {name: value for name, value in values.items() if name in _FIXED}
        derived = {name: value for name, value in values.items() if name not in _FIXED}
        return cls(**fixed, columns=derived)

    @classmethod
    def create(
        cls,
        *,
        op: OpSignature,
        hw: HardwareSpec | str,
        status: str,
        schedule: Schedule | None = None,
        runtimes_s: Sequence[float] | None = None,
        median_s: float | None = None,
        min_s: float | None = None,
        gflops: float | None = None,
        codegen_version: str | None = CODEGEN_VERSION,
        host: str | None = None,
        timestamp: datetime | None = None,
        record_id: str | None = None,
        **extra: Any,
    ) -> Record:
        """A record for ``op`` on ``hw`` (a spec, or just its ``hw_id``).

        Dim columns come from the kind's ``dim_columns``, knob columns from
        ``schedule.knobs()``. ``median_s``/``min_s`` default to the median/minimum of
        ``runtimes_s``; ``gflops`` to ``op.flops / median_s``; ``host`` to this machine's
        name. ``extra`` sets any other column (``error``, ``compiler``, ``flags``,
        ``source_hash``, ``compile_s``, ``job_id``, ``source``, ``predicted``,
        ``model_version``).
        """
        dims = op.dims_dict
        values: dict[str, Any] = {
            column: dims.get(name) for name, column in op_kind(op.kind).dim_columns.items()
        }
        if isinstance(hw, HardwareSpec):
            values.update(
                hw_id=hw.hw_id, hw_isa=hw.isa, hw_cores=hw.cores, hw_cpu_model=hw.cpu_model,
                hw_json=hw.to_json(),
            )
        else:
            values["hw_id"] = hw
        if schedule is not None:
            values.update(schedule.knobs())
            values.update(schedule_json=schedule.to_json(), schedule_id=schedule.schedule_id)
        values.update(extra)
        runtimes = tuple(float(r) for r in runtimes_s) if runtimes_s is not None else None
        if runtimes:
            median_s = statistics.median(runtimes) if median_s is None else median_s
            min_s = min(runtimes) if min_s is None else min_s
        if gflops is None and median_s is not None and median_s > 0 and status == "ok":
            gflops = op.flops / median_s / 1e9
        values.update(
            record_id=record_id or uuid.uuid4().hex,
            timestamp=timestamp or datetime.now(timezone.utc),
            op_kind=op.kind,
            op_id=op.op_id,
            op_text=op.text,
            op_dtype=op.dtype,
            status=status,
            runtimes_s=runtimes,
            median_s=median_s,
            min_s=min_s,
            gflops=gflops,
            codegen_version=codegen_version,
            host=socket.gethostname() if host is None else host,
        )
        return cls.from_columns(values)


def _unknown_columns(names: Iterable[str]) -> SchemaError:
    return SchemaError(
        f"unknown record column(s) {', '.join(sorted(names))}: neither a fixed column nor a "
        "dim or knob column of the kinds registered when tunecache.datasets.schema was first "
        f"imported (builtins and tunecache.kinds entry points); columns: {', '.join(COLUMNS)}"
    )


assert tuple(f.name for f in fields(Record) if f.name != "columns") == FIXED_COLUMNS, \
    "Record fields must be the schema's fixed columns, in order"


def records_to_table(records: Iterable[Record]) -> pa.Table:
    """A table with the canonical :data:`~tunecache.datasets.schema.SCHEMA`."""
    rows = list(records)
    arrays = [
        pa.array([getattr(r, f.name) for r in rows] if f.name in _FIXED
                 else [r.columns.get(f.name) for r in rows], type=f.type)
        for f in SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def records_from_table(table: pa.Table) -> list[Record]:
    """Records from a table with the canonical columns (e.g. what ``Store.scan`` returns)."""
    out = []
    for row in table.select(SCHEMA.names).to_pylist():
        runtimes = row["runtimes_s"]
        row["runtimes_s"] = tuple(runtimes) if runtimes is not None else None
        out.append(Record.from_columns(row))
    return out
