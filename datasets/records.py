"""One measurement as a frozen value, and its conversion to and from Arrow tables."""

from __future__ import annotations

import socket
import statistics
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Conv2dSchedule, MatmulSchedule, Schedule
from tunecache.datasets.errors import SchemaError
from tunecache.datasets.paths import check_part
from tunecache.datasets.schema import (
    CONV_KNOB_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    STATUSES,
    dim_columns,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One row of the records dataset; field names and meanings are the schema's columns.

    Build one with :meth:`create`, which fills identity, dims and knob columns from the
    value objects. ``runtimes_s`` holds the per-call seconds of each repeat.
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
    dim_batch: int | None = None
    dim_m: int | None = None
    dim_n: int | None = None
    dim_k: int | None = None
    schedule_json: str | None = None
    schedule_id: str | None = None
    mr: int | None = None
    nr: int | None = None
    kc: int | None = None
    mc: int | None = None
    nc: int | None = None
    pack_a: int | None = None
    pack_b: int | None = None
    loop_order: str | None = None
    unroll: int | None = None
    threads: int | None = None
    parallel: str | None = None
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
    dim_c: int | None = None
    dim_h: int | None = None
    dim_w: int | None = None
    dim_f: int | None = None
    dim_r: int | None = None
    dim_s: int | None = None
    stride_h: int | None = None
    stride_w: int | None = None
    pad_t: int | None = None
    pad_l: int | None = None
    pad_b: int | None = None
    pad_r: int | None = None
    dil_h: int | None = None
    dil_w: int | None = None
    groups: int | None = None
    algorithm: str | None = None
    oc_block: int | None = None
    ow_block: int | None = None
    oh_block: int | None = None
    ic_block: int | None = None
    unroll_kw: int | None = None
    pack_w: int | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise SchemaError(
                f"record status {self.status!r} is not one of {', '.join(STATUSES)}"
            )
        check_part("hw_id", self.hw_id)
        check_part("op_kind", self.op_kind)
        if self.timestamp.tzinfo is None:
            raise SchemaError("record timestamp must be timezone-aware (UTC)")

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

        ``median_s``/``min_s`` default to the median/minimum of ``runtimes_s``; ``gflops`` to
        ``op.flops / median_s``; ``host`` to this machine's name. ``extra`` sets any other
        column (``error``, ``compiler``, ``flags``, ``source_hash``, ``compile_s``,
        ``job_id``, ``source``, ``predicted``, ``model_version``).
        """
        values: dict[str, Any] = dict(extra)
        if isinstance(hw, HardwareSpec):
            values.update(
                hw_id=hw.hw_id, hw_isa=hw.isa, hw_cores=hw.cores, hw_cpu_model=hw.cpu_model,
                hw_json=hw.to_json(),
            )
        else:
            values["hw_id"] = hw
        dims = op.dims_dict
        for name, column in dim_columns(op.kind).items():
            values[column] = dims.get(name)
        if schedule is not None:
            values.update(schedule_json=schedule.to_json(), schedule_id=schedule.schedule_id)
            if isinstance(schedule, MatmulSchedule):
                values.update(
                    mr=schedule.mr, nr=schedule.nr, kc=schedule.kc, mc=schedule.mc,
                    nc=schedule.nc, pack_a=schedule.pack_a, pack_b=schedule.pack_b,
                    loop_order=schedule.loop_order, unroll=schedule.unroll,
                    threads=schedule.threads, parallel=schedule.parallel,
                )
            elif isinstance(schedule, Conv2dSchedule):
                values.update({name: getattr(schedule, name) for name in CONV_KNOB_COLUMNS})
                values.update(algorithm=schedule.algorithm, loop_order=schedule.loop_order,
                              threads=schedule.threads, parallel=schedule.parallel)
        runtimes = tuple(float(r) for r in runtimes_s) if runtimes_s is not None else None
        if runtimes:
            median_s = statistics.median(runtimes) if median_s is None else median_s
            min_s = min(runtimes) if min_s is None else min_s
        if gflops is None and median_s is not None and median_s > 0 and status == "ok":
            gflops = op.flops / median_s / 1e9
        return cls(
            record_id=record_id or uuid.uuid4().hex,
            timestamp=timestamp or datetime.now(timezone.utc),
            op_kind=op.kind,
            op_id=op.op_id,
            op_text=op.text,
            status=status,
            runtimes_s=runtimes,
            median_s=median_s,
            min_s=min_s,
            gflops=gflops,
            codegen_version=codegen_version,
            host=socket.gethostname() if host is None else host,
            **values,
        )


_NAMES = tuple(f.name for f in fields(Record))
assert tuple(SCHEMA.names) == _NAMES, "Record fields must follow the schema's columns"


def records_to_table(records: Iterable[Record]) -> pa.Table:
    """A table with the canonical :data:`~tunecache.datasets.schema.SCHEMA`."""
    rows = list(records)
    arrays = [
        pa.array([getattr(r, name) for r in rows], type=field.type)
        for name, field in zip(_NAMES, SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def records_from_table(table: pa.Table) -> list[Record]:
    """Records from a table with the canonical columns (e.g. what ``Store.scan`` returns)."""
    out = []
    for row in table.select(list(_NAMES)).to_pylist():
        runtimes = row["runtimes_s"]
        row["runtimes_s"] = tuple(runtimes) if runtimes is not None else None
        out.append(Record(**row))
    return out
