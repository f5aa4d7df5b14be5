"""The publish rule: from measurement records to a best-only snapshot (a pure function).

For every ``(hw_id, op_id, codegen_version, compiler)`` the snapshot holds one row, the best
measured *valid* schedule:

1. Only ``ok`` records with a finite, positive ``median_s`` and a schedule count.
2. A record is rejected (counted, never served) unless its schedule JSON parses and hashes
   to its ``schedule_id``, its op text parses and hashes to its ``op_id``, the op is of the
   kind of the partition it was stored in, and the schedule's family is the op kind's. Each
   check runs once per distinct schedule JSON or op text, not per record.
3. Repeated measurements of the same schedule (same ``schedule_id``) are aggregated by the
   **median of their medians**, so one lucky run does not make a schedule win.
4. The schedule with the lowest aggregated latency wins, each measurement first divided by
   its job's phase (``phases.py``: how fast the machine ran during that job, fitted from the
   schedules jobs measured in common), so a schedule timed again in a slow phase does not
   lose to one timed once in a fast one. Exact ties go to the smallest ``schedule_id``, so
   the result never depends on file or row order. The snapshot's ``median_s`` is the raw
   median of medians.
5. A winner measured with this codegen version on hardware whose spec is known (from the
   records' ``hw_json``) must be legal for its op on that hardware
   (:func:`tunecache.compiler.schedule.problems`); an illegal winner is rejected and the
   next best of its group wins. Rows of other codegen versions are judged by that version's
   code when it reads them, not here.
6. Provenance (source, job, host, record id, time) is that of the most recent measurement of
   the winning schedule (ties: largest ``record_id``).

:func:`select` returns the snapshot with every rejection (records, reason); :func:`best_of`
returns the snapshot and warns about them. The output is sorted by
``(op_id, codegen_version, compiler)``, so the same records always give the same snapshot,
byte for byte in content digest.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tunecache.cache.phases import job_phases
from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind as kind_of
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems, schedule_from_json

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


@dataclass(frozen=True, slots=True)
class Rejection:
    """Measurements publishing refused to serve: how many, and why (one line)."""

    records: int
    reason: str


@dataclass(frozen=True)
class Selection:
    """What :func:`select` chose: the snapshot and every rejected candidate."""

    snapshot: pa.Table
    rejections: tuple[Rejection, ...] = ()

    @property
    def rejected(self) -> int:
        """The measurements rejected (whatever the reason)."""
        return sum(r.records for r in self.rejections)


class _Parsed:
    """Schedule JSON and op texts, each parsed once: the value or why it does not parse."""

    def __init__(self) -> None:
        self._schedules: dict[str, Schedule | str] = {}
        self._ops: dict[str, OpSignature | str] = {}

    def schedule(self, text: str) -> Schedule | str:
        found = self._schedules.get(text)
        if found is None:
            try:
                found = schedule_from_json(text)
            except TunecacheError as exc:
                found = str(exc)
            self._schedules[text] = found
        return found

    def op(self, text: str) -> OpSignature | str:
        found = self._ops.get(text)
        if found is None:
            try:
                found = OpSignature.parse(text)
            except TunecacheError as exc:
                found = str(exc)
            self._ops[text] = found
        return found


# Why a row is refused before aggregation (0: it is not). Checked in this order.
_BAD_JSON, _BAD_SCHEDULE_ID, _BAD_OP_TEXT, _BAD_OP_ID, _BAD_PARTITION, _BAD_FAMILY = \
    range(1, 7)


def _codes_of(column: pd.Series, values: Sequence[object]) -> np.ndarray:
    """Each of ``values`` as a code of ``column``'s categories (-1: not among them)."""
    categories = column.cat.categories
    return np.asarray(categories.get_indexer(pd.Index(values, dtype=object)), dtype=np.int64)


def _row_problems(df: pd.DataFrame, parsed: _Parsed) -> np.ndarray:
    """Per row: which check of its identity fails (0: none), judged per distinct value.

    A row's schedule JSON must parse and hash to its ``schedule_id``; its op text must parse,
    hash to its ``op_id`` and be of the kind of the partition it was stored in; and the
    schedule's family must be the one of the op's kind.
    """
    schedules = [parsed.schedule(t) for t in df["schedule_json"].cat.categories.tolist()]
    json_bad = np.array([isinstance(s, str) for s in schedules], dtype=bool)
    json_id = _codes_of(df["schedule_id"], [None if isinstance(s, str) else s.schedule_id
                                            for s in schedules])
    families = {f: i for i, f in enumerate(sorted(
        {s.family for s in schedules if not isinstance(s, str)}))}
    json_family = np.array([-1 if isinstance(s, str) else families[s.family]
                            for s in schedules], dtype=np.int64)

    ops = [parsed.op(t) for t in df["op_text"].cat.categories.tolist()]
    op_bad = np.array([isinstance(o, str) for o in ops], dtype=bool)
    op_id = _codes_of(df["op_id"], [None if isinstance(o, str) else o.op_id for o in ops])
    op_kind = _codes_of(df["op_kind"], [None if isinstance(o, str) else o.kind for o in ops])
    op_family = np.array([-2 if isinstance(o, str) else
                          families.get(kind_of(o.kind).schedule.family, -2) for o in ops],
                         dtype=np.int64)

    j = df["schedule_json"].cat.codes.to_numpy()
    o = df["op_text"].cat.codes.to_numpy()
    checks = [
        (_BAD_JSON, json_bad[j]),
        (_BAD_SCHEDULE_ID, json_id[j] != df["schedule_id"].cat.codes.to_numpy()),
        (_BAD_OP_TEXT, op_bad[o]),
        (_BAD_OP_ID, op_id[o] != df["op_id"].cat.codes.to_numpy()),
        (_BAD_PARTITION, op_kind[o] != df["op_kind"].cat.codes.to_numpy()),
        (_BAD_FAMILY, json_family[j] != op_family[o]),
    ]
    code = np.zeros(len(df), dtype=np.int8)
    for value, failed in reversed(checks):
        code[failed] = value
    return code


def _row_reason(code: int, row: Any, parsed: _Parsed) -> str:
    """Why a row with problem ``code`` is refused (``row``: its columns as attributes)."""
    schedule = parsed.schedule(str(row.schedule_json))
    op = parsed.op(str(row.op_text))
    if code == _BAD_JSON:
        return str(schedule)
    if code == _BAD_SCHEDULE_ID:
        return f"schedule JSON does not hash to schedule_id {row.schedule_id}"
    if code == _BAD_OP_TEXT:
        return str(op)
    if code == _BAD_OP_ID:
        return f"op text {row.op_text!r} does not hash to op_id {row.op_id}"
    kind = op.kind if isinstance(op, OpSignature) else "?"
    if code == _BAD_PARTITION:
        return f"a {kind} op stored under op_kind={row.op_kind}"
    family = schedule.family if not isinstance(schedule, str) else "?"
    return f"a {family} schedule cannot drive a {kind} op"


def _row_rejections(df: pd.DataFrame, code: np.ndarray, parsed: _Parsed) -> list[Rejection]:
    """One rejection per (reason, hardware, op, schedule) among the refused rows."""
    failed = code != 0
    if not failed.any():
        return []
    bad = df[failed].assign(problem=code[failed])
    keys = ["problem", "hw_id", "op_id", "schedule_id"]
    counts = bad.groupby(keys, observed=True).size()
    out = []
    for row in bad.drop_duplicates(keys).itertuples(index=False):
        count = int(counts[(row.problem, row.hw_id, row.op_id, row.schedule_id)])
        reason = _row_reason(int(row.problem), row, parsed)
        out.append(Rejection(count, f"{row.hw_id}: op {row.op_id}, schedule "
                                    f"{row.schedule_id}: {reason}"))
    return out


def _first_values(df: pd.DataFrame, key: str, value: str) -> dict[str, str]:
    """Each ``key`` value's ``value`` in its first row of ``df``.

    After the row checks a schedule id has one JSON and an op id one op text.
    """
    codes = df[key].cat.codes.to_numpy()
    found, first = np.unique(codes, return_index=True)
    keys, texts = df[key].cat.categories.tolist(), df[value].cat.categories.tolist()
    return {str(keys[k]): str(texts[t]) for k, t in
            zip(found.tolist(), df[value].cat.codes.to_numpy()[first].tolist(), strict=True)}


class _Legality:
    """Whether a candidate (agg row) is legal on its hardware, memoised per (hw, op,
    schedule). Only rows of this codegen version on hardware with a known spec are judged:
    legality is the current code generator's rule, for one machine."""

    def __init__(self, df: pd.DataFrame, agg: pd.DataFrame,
                 hardware: Mapping[str, HardwareSpec], parsed: _Parsed) -> None:
        self.hw_ids = [str(h) for h in agg["hw_id"].cat.categories.tolist()]
        self.op_ids = [str(o) for o in agg["op_id"].cat.categories.tolist()]
        self.schedule_ids = [str(i) for i in agg["schedule_id"].cat.categories.tolist()]
        # Categories no remaining row uses (rows refused by the row checks) map to None.
        op_texts = _first_values(df, "op_id", "op_text")
        self._ops = [parsed.op(op_texts[c]) if c in op_texts else None for c in self.op_ids]
        jsons = _first_values(df, "schedule_id", "schedule_json")
        self._schedules = [parsed.schedule(jsons[c]) if c in jsons else None
                           for c in self.schedule_ids]
        self._specs = [hardware.get(h) for h in self.hw_ids]
        self.hw = agg["hw_id"].cat.codes.to_numpy()
        self.op = agg["op_id"].cat.codes.to_numpy()
        self.schedule = agg["schedule_id"].cat.codes.to_numpy()
        codegen = agg["codegen_version"].cat
        current = int(codegen.categories.get_indexer(pd.Index([CODEGEN_VERSION]))[0])
        judged_hw = np.array([spec is not None for spec in self._specs] + [False])
        self.judged = (codegen.codes.to_numpy() == current) & (current >= 0) & \
            judged_hw[self.hw]
        self._memo: dict[tuple[int, int, int], str | None] = {}

    def where(self, row: int) -> str:
        """``<hw_id>: op <op_id>, schedule <schedule_id>`` of agg row ``row``."""
        return (f"{self.hw_ids[self.hw[row]]}: op {self.op_ids[self.op[row]]}, schedule "
                f"{self.schedule_ids[self.schedule[row]]}")

    def problem(self, row: int) -> str | None:
        """Why agg row ``row`` is illegal (None: legal, or not judged here)."""
        if not self.judged[row]:
            return None
        key = (int(self.hw[row]), int(self.op[row]), int(self.schedule[row]))
        if key in self._memo:
            return self._memo[key]
        op, schedule, spec = self._ops[key[1]], self._schedules[key[2]], self._specs[key[0]]
        reason = None
        if isinstance(op, OpSignature) and isinstance(schedule, Schedule) and spec:
            try:
                reasons = problems(op, schedule, spec)
            except TunecacheError as exc:
                reasons = [str(exc)]
            if reasons:
                reason = "illegal on its hardware: " + "; ".join(reasons)
        self._memo[key] = reason
        return reason


def _winners(df: pd.DataFrame, agg: pd.DataFrame, hardware: Mapping[str, HardwareSpec],
             parsed: _Parsed) -> tuple[np.ndarray, list[Rejection]]:
    """Positions in ``agg`` of the fastest legal candidate of each group, and the illegal
    candidates that were faster.

    ``agg`` is sorted fastest first (ties: smallest schedule id). Each group's candidates
    are judged in that order until one is legal, every group advancing at once, so only
    the candidates that would otherwise win are judged.
    """
    groups = agg.groupby(GROUP_KEYS, observed=True, sort=False).ngroup().to_numpy()
    order = np.argsort(groups, kind="stable")  # by group, fastest first within each
    starts = np.flatnonzero(np.r_[True, groups[order][1:] != groups[order][:-1]])
    ends = np.r_[starts[1:], len(order)]
    legality = _Legality(df, agg, hardware, parsed)
    chosen: list[np.ndarray] = []
    rejections: list[Rejection] = []
    measurements = agg["n_measurements"].to_numpy()
    cursor = starts.copy()
    active = np.arange(len(starts))
    while active.size:
        rows = order[cursor[active]]
        reasons = [legality.problem(r) for r in rows.tolist()]
        bad = np.array([reason is not None for reason in reasons], dtype=bool)
        chosen.append(rows[~bad])
        for row, reason in zip(rows.tolist(), reasons, strict=True):
            if reason is not None:
                rejections.append(Rejection(int(measurements[row]),
                                            f"{legality.where(row)}: {reason}"))
        active = active[bad]
        cursor[active] += 1
        active = active[cursor[active] < ends[active]]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64), rejections


def hardware_of(records: pa.Table) -> dict[str, HardwareSpec]:
    """The hardware specs in the ``hw_json`` column of ``records``, by the id they hash to.

    A spec is known by the hash of its content, so a spec here is the one of its hw_id
    whichever row it came from; texts that do not parse are ignored.
    """
    if "hw_json" not in records.column_names:
        return {}
    found: dict[str, HardwareSpec] = {}
    for text in pc.unique(records.column("hw_json")).to_pylist():
        spec = parse_hardware(text)
        if spec is not None:
            found.setdefault(spec.hw_id, spec)
    return found


def parse_hardware(text: object) -> HardwareSpec | None:
    """A hardware spec from its stored JSON, or None when it is absent or malformed."""
    if not isinstance(text, str):
        return None
    try:
        return HardwareSpec.from_json(text)
    except (TunecacheError, TypeError, ValueError):
        return None


def select(records: pa.Table,
           hardware: Mapping[str, HardwareSpec] | None = None) -> Selection:
    """The best-only snapshot of ``records`` and what was rejected (see the module doc).

    ``hardware``: the spec of each hw_id, to check legality; by default the specs found in
    the records' ``hw_json`` column. Hardware without a spec gets every check but legality.
    """
    missing = [c for c in PUBLISH_COLUMNS if c not in records.column_names]
    if missing:
        raise ValueError(f"best_of needs record column(s) {', '.join(missing)}")
    if hardware is None:
        hardware = hardware_of(records)
    usable = _usable(records.select(list(PUBLISH_COLUMNS)))
    if usable.num_rows == 0:
        return Selection(SNAPSHOT_SCHEMA.empty_table())
    df = _frame(usable)
    parsed = _Parsed()
    code = _row_problems(df, parsed)
    rejections = _row_rejections(df, code, parsed)
    if rejections:
        df = df[code == 0]
        if df.empty:
            return Selection(SNAPSHOT_SCHEMA.empty_table(), tuple(rejections))
    keys5 = [*GROUP_KEYS, "schedule_id"]
    df = df.assign(_ranked_s=df["median_s"].to_numpy() * np.exp(-job_phases(df, GROUP_KEYS)))
    agg = df.groupby(keys5, observed=True, sort=False).agg(
        median_s=("median_s", "median"),
        min_s=("min_s", "min"),
        gflops=("gflops", "median"),
        n_measurements=("median_s", "size"),
        _ranked_s=("_ranked_s", "median"),
    ).reset_index()
    agg["_sid"] = agg["schedule_id"].astype(str)
    agg = agg.sort_values(["_ranked_s", "_sid"], kind="stable", ignore_index=True)
    chosen, illegal = _winners(df, agg, hardware, parsed)
    latest = df.sort_values(["timestamp", "record_id"], ascending=False, kind="stable")
    latest = latest.drop_duplicates(keys5)
    rows = agg.iloc[chosen].merge(
        latest.drop(columns=["median_s", "min_s", "gflops", "status", "_ranked_s"]),
        on=keys5, how="left", validate="one_to_one")
    families = [cast(Schedule, parsed.schedule(text)).family
                for text in rows["schedule_json"].astype(str)]
    return Selection(_snapshot_table(rows, families), tuple(rejections + illegal))


MAX_WARNINGS = 10
"""Rejections :func:`best_of` warns about one by one; the rest in one summary warning."""


def best_of(records: pa.Table,
            hardware: Mapping[str, HardwareSpec] | None = None) -> pa.Table:
    """The best-only snapshot of ``records``, warning about each rejected candidate."""
    selection = select(records, hardware)
    for rejection in selection.rejections[:MAX_WARNINGS]:
        warnings.warn(f"not publishing {rejection.records} record(s): {rejection.reason}",
                      stacklevel=2)
    more = selection.rejections[MAX_WARNINGS:]
    if more:
        warnings.warn(f"not publishing {sum(r.records for r in more)} more record(s) of "
                      f"{len(more)} rejected candidate(s)", stacklevel=2)
    return selection.snapshot


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
