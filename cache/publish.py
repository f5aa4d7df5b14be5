"""The publish rule: from measurement records to a best-only snapshot (a pure function).

For every ``(hw_id, op_id, codegen_version, compiler)`` the snapshot holds one row, the best
measured schedule:

1. Only ``ok`` records with a finite, positive ``median_s`` and a schedule count.
2. Repeated measurements of the same schedule (same ``schedule_id``) are aggregated by the
   **median of their medians**, so one lucky run does not make a schedule win.
3. The schedule with the lowest aggregated latency wins; exact ties go to the smallest
   ``schedule_id``, so the result never depends on file or row order.
4. The winner's schedule JSON is validated structurally and must hash to its
   ``schedule_id``, and its op text must parse back to its ``op_id``; a winner that fails is
   dropped (with a warning) and the next best wins.
5. Provenance (source, job, host, record id, time) is that of the most recent measurement of
   the winning schedule (ties: largest ``record_id``).

The output is sorted by ``(op_id, codegen_version, compiler)``, so the same records always
give the same snapshot, byte for byte in content digest.

Snapshots carry the schedule only as ``schedule_family``, ``schedule_id`` and
``schedule_json``, whatever the kind (version 2). Version 1 snapshots also had typed matmul
knob columns (``mr`` … ``parallel``); they are a superset of version 2, so readers read both
and ignore those columns. Version 1 readers skip version 2 rows (their version is newer), so
upgrade deploy-time readers before publishers.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from typing import cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, schedule_from_json

SNAPSHOT_VERSION = 2
SNAPSHOT_VERSION_KEY = b"tunecache.snapshot_version"

PUBLISH_COLUMNS = (
    "record_id", "timestamp", "hw_id", "op_kind", "op_id", "op_text", "schedule_json",
    "schedule_id", "compiler", "codegen_version", "status", "median_s", "min_s", "gflops",
    "job_id", "host", "source",
)
"""The record columns :func:`best_of` reads."""

GROUP_KEYS = ["hw_id", "op_id", "codegen_version", "compiler"]

_S = pa.string()
SNAPSHOT_SCHEMA = pa.schema(
    [
        pa.field("snapshot_version", pa.int16(), nullable=False),
        pa.field("hw_id", _S, nullable=False),
        pa.field("op_id", _S, nullable=False),
        pa.field("op_kind", _S, nullable=False),
        pa.field("op_text", _S, nullable=False),
        pa.field("codegen_version", _S),
        pa.field("compiler", _S),
        pa.field("schedule_family", _S, nullable=False),
        pa.field("schedule_id", _S, nullable=False),
        pa.field("schedule_json", _S, nullable=False),
        pa.field("median_s", pa.float64(), nullable=False),
        pa.field("min_s", pa.float64()),
        pa.field("gflops", pa.float64()),
        pa.field("n_measurements", pa.int32(), nullable=False),
        pa.field("source", _S),
        pa.field("job_id", _S),
        pa.field("host", _S),
        pa.field("record_id", _S, nullable=False),
        pa.field("measured_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ],
    metadata={SNAPSHOT_VERSION_KEY: str(SNAPSHOT_VERSION).encode()},
)
"""One row per (hw_id, op_id, codegen_version, compiler): the best schedule."""


def _usable(records: pa.Table) -> pa.Table:
    median = records.column("median_s")
    mask = pc.and_(
        pc.and_(pc.equal(records.column("status"), "ok"), pc.is_finite(median)),
        pc.and_(
            pc.greater(median, 0.0),
            pc.and_(pc.is_valid(records.column("schedule_json")),
                    pc.is_valid(records.column("schedule_id"))),
        ),
    )
    return records.filter(pc.fill_null(mask, False))


def _frame(records: pa.Table) -> pd.DataFrame:
    # Categoricals keep a million rows of repeated strings small and make grouping fast.
    columns = {}
    for name in records.column_names:
        column = records.column(name)
        if pa.types.is_string(column.type):
            if name in ("codegen_version", "compiler"):
                column = pc.fill_null(column, "")
            if name != "record_id":
                column = pc.dictionary_encode(column)
        columns[name] = column
    return pa.table(columns).to_pandas()


class _Schedules:
    """Schedule JSON -> parsed schedule or the reason it does not parse, each text once."""

    def __init__(self) -> None:
        self._parsed: dict[str, Schedule | str] = {}

    def get(self, text: str) -> Schedule | str:
        found = self._parsed.get(text)
        if found is None:
            try:
                found = schedule_from_json(text)
            except TunecacheError as exc:
                found = str(exc)
            self._parsed[text] = found
        return found


def _check_winner(op_id: str, op_text: str, schedule: Schedule | str,
                  schedule_id: str) -> str | None:
    """Why this winner cannot be published (None when it can)."""
    if isinstance(schedule, str):
        return schedule
    if schedule.schedule_id != schedule_id:
        return f"schedule JSON does not hash to schedule_id {schedule_id}"
    try:
        op = OpSignature.parse(op_text)
    except TunecacheError as exc:
        return str(exc)
    if op.op_id != op_id:
        return f"op text {op_text!r} does not hash to op_id {op_id}"
    return None


def best_of(records: pa.Table) -> pa.Table:
    """The best-only snapshot of ``records`` (see the module docstring for the rule)."""
    missing = [c for c in PUBLISH_COLUMNS if c not in records.column_names]
    if missing:
        raise ValueError(f"best_of needs record column(s) {', '.join(missing)}")
    usable = _usable(records.select(list(PUBLISH_COLUMNS)))
    if usable.num_rows == 0:
        return SNAPSHOT_SCHEMA.empty_table()
    df = _frame(usable)
    keys5 = [*GROUP_KEYS, "schedule_id"]
    grouped = df.groupby(keys5, observed=True, sort=False)
    agg = grouped.agg(
        median_s=("median_s", "median"),
        min_s=("min_s", "min"),
        gflops=("gflops", "median"),
        n_measurements=("median_s", "size"),
    ).reset_index()
    agg["_sid"] = agg["schedule_id"].astype(str)
    agg = agg.sort_values(["median_s", "_sid"], kind="stable")

    latest = df.sort_values(["timestamp", "record_id"], ascending=False, kind="stable")
    latest = latest.drop_duplicates(keys5)
    rejected: set[tuple[object, ...]] = set()
    schedules = _Schedules()
    while True:
        winners = agg.drop_duplicates(GROUP_KEYS, keep="first")
        rows = winners.merge(
            latest.drop(columns=["median_s", "min_s", "gflops", "status"]),
            on=keys5, how="left", validate="one_to_one",
        )
        bad = []
        for i, (op_id, op_text, schedule_json, schedule_id) in enumerate(
            zip(rows["op_id"].astype(str), rows["op_text"].astype(str),
                rows["schedule_json"].astype(str), rows["schedule_id"].astype(str),
                strict=True)
        ):
            reason = _check_winner(op_id, op_text, schedules.get(schedule_json), schedule_id)
            if reason is not None:
                bad.append(i)
                warnings.warn(
                    f"not publishing schedule {rows['schedule_id'].iloc[i]} for op {op_id}: "
                    f"{reason}",
                    stacklevel=2,
                )
        if not bad:
            break
        drop = rows.iloc[bad][keys5]
        rejected.update(map(tuple, drop.astype(str).to_numpy().tolist()))
        key = agg[keys5].astype(str).apply(tuple, axis=1)
        agg = agg[~key.isin(rejected)]
    families = [cast(Schedule, schedules.get(text)).family
                for text in rows["schedule_json"].astype(str)]
    return _snapshot_table(rows, families)


def _snapshot_table(rows: pd.DataFrame, families: list[str]) -> pa.Table:
    n = len(rows)

    def text(name: str, empty_is_null: bool = False) -> pa.Array:
        values = [None if (v is None or (isinstance(v, float) and math.isnan(v))) else str(v)
                  for v in rows[name].tolist()]
        if empty_is_null:
            values = [v or None for v in values]
        return pa.array(values, _S)

    def floats(name: str) -> pa.Array:
        return pa.array(rows[name].to_numpy(dtype=np.float64), pa.float64(),
                        from_pandas=True)

    columns: dict[str, pa.Array] = {
        "snapshot_version": pa.array([SNAPSHOT_VERSION] * n, pa.int16()),
        "hw_id": text("hw_id"),
        "op_id": text("op_id"),
        "op_kind": text("op_kind"),
        "op_text": text("op_text"),
        "codegen_version": text("codegen_version", empty_is_null=True),
        "compiler": text("compiler", empty_is_null=True),
        "schedule_family": pa.array(families, _S),
        "schedule_id": text("schedule_id"),
        "schedule_json": text("schedule_json"),
        "median_s": floats("median_s"),
        "min_s": floats("min_s"),
        "gflops": floats("gflops"),
        "n_measurements": pa.array(rows["n_measurements"].to_numpy(), pa.int32()),
        "source": text("source"),
        "job_id": text("job_id"),
        "host": text("host"),
        "record_id": text("record_id"),
        "measured_at": pa.array(rows["timestamp"], pa.timestamp("us", tz="UTC")),
    }
    table = pa.table(columns, schema=SNAPSHOT_SCHEMA)
    order = pc.sort_indices(
        table, [("hw_id", "ascending"), ("op_id", "ascending"),
                ("codegen_version", "ascending"), ("compiler", "ascending")],
    )
    return table.take(order)


def snapshot_digest(snapshot: pa.Table) -> str:
    """A digest of a snapshot's content (independent of how it was serialised)."""
    table = snapshot.select(SNAPSHOT_SCHEMA.names).replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return hashlib.sha256(memoryview(sink.getvalue())).hexdigest()


def snapshot_bytes(snapshot: pa.Table) -> pa.Buffer:
    """Serialise a snapshot as Parquet with its version in the file metadata."""
    sink = pa.BufferOutputStream()
    pq.write_table(snapshot.replace_schema_metadata(SNAPSHOT_SCHEMA.metadata), sink,
                   compression="zstd", compression_level=1)
    return sink.getvalue()
