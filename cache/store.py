"""The store: append-only Parquet records, published best-of snapshots, compaction.

Layout under the root (a local directory or any pyarrow filesystem URI)::

    records/hw_id=<hw_id>/op_kind=<kind>/part-<time>-<uuid>.parquet   append-only fragments
    published/<hw_id>/snapshot-<time>-<digest>.parquet               best-only snapshots
    published/<hw_id>/CURRENT                                         pointer (JSON)

Guarantees (see docs/STORE.md): every file appears atomically; writers only create files
with unique names, so concurrent appenders never lose each other's data; compaction writes
the merged fragment before deleting its sources and readers de-duplicate by ``record_id``,
so a record is never lost nor seen twice; the pointer is replaced atomically and old
snapshots are kept, so a deploy always reads a complete snapshot and ``rollback`` works.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeAlias

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tunecache.cache import paths
from tunecache.cache.errors import SnapshotError, StoreError
from tunecache.cache.publish import (
    PUBLISH_COLUMNS,
    SNAPSHOT_SCHEMA,
    SNAPSHOT_VERSION,
    best_of,
    snapshot_bytes,
    snapshot_digest,
)
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import schedule_from_json
from tunecache.datasets import fs, io
from tunecache.datasets.errors import SchemaError
from tunecache.datasets.io import Fragment
from tunecache.datasets.location import Location, resolve
from tunecache.datasets.paths import (
    RECORDS_DIR,
    check_part,
    new_fragment_name,
    parse_partition,
    partition_dir,
)
from tunecache.datasets.records import Record, records_to_table
from tunecache.datasets.schema import STATUSES, conform

MAX_ROWS_PER_FRAGMENT = 2_000_000
COMPACT_MAX_FRAGMENT_BYTES = 256 << 20
STALE_TEMP_SECONDS = 3600.0

RecordsLike: TypeAlias = Iterable[Record] | pa.Table | pd.DataFrame


@dataclass(frozen=True, slots=True)
class Pointer:
    """The content of ``published/<hw_id>/CURRENT``."""

    snapshot: str
    digest: str
    entries: int
    published_at: str
    snapshot_version: int = SNAPSHOT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: bytes | str) -> Pointer:
        try:
            data = json.loads(text)
            pointer = cls(
                snapshot=paths.check_snapshot_name(data["snapshot"]),
                digest=str(data["digest"]),
                entries=int(data["entries"]),
                published_at=str(data["published_at"]),
                snapshot_version=int(data.get("snapshot_version", SNAPSHOT_VERSION)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"damaged snapshot pointer: {exc}") from None
        return pointer


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What :meth:`Store.publish` did for one hardware."""

    hw_id: str
    snapshot: str
    entries: int
    records: int
    changed: bool


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What :meth:`Store.compact` did."""

    partitions: int
    fragments_before: int
    fragments_after: int
    records: int
    temporaries_removed: int


@dataclass(frozen=True)
class VerifyReport:
    """Findings of :meth:`Store.verify`. ``ok`` is false when anything is damaged."""

    fragments: int
    rows: int
    damaged: list[tuple[str, str]] = field(default_factory=list)
    duplicate_rows: int = 0
    stray_files: list[str] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)
    published: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.problems

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["damaged"] = [{"path": p, "reason": r} for p, r in self.damaged]
        return data


def _to_table(records: RecordsLike) -> pa.Table:
    if isinstance(records, pa.Table):
        table = records
    elif isinstance(records, pd.DataFrame):
        table = pa.Table.from_pandas(records, preserve_index=False)
    else:
        return records_to_table(records)
    return conform(table)


def _check_table(table: pa.Table) -> None:
    bad = pc.invert(pc.is_in(table.column("status"), pa.array(STATUSES)))
    if pc.any(bad).as_py():
        found = pc.unique(table.column("status").filter(bad)).to_pylist()
        raise SchemaError(f"unknown record status(es) {found}; expected {', '.join(STATUSES)}")
    for name in ("hw_id", "op_kind"):
        for value in pc.unique(table.column(name)).to_pylist():
            check_part(name, value)


class Store:
    """A tuning-record store rooted at a local directory or a pyarrow filesystem URI.

    Args:
        root: a directory, a URI such as ``s3://bucket/prefix?endpoint_override=...``, or
            None for the default (``$TUNECACHE_HOME``, else the user cache directory).
        filesystem: a pyarrow filesystem; ``root`` is then a path inside it.
    """

    def __init__(self, root: str | os.PathLike[str] | Location | None = None, *,
                 filesystem: pafs.FileSystem | None = None) -> None:
        self.location = resolve(root, filesystem)

    @property
    def root(self) -> str:
        return self.location.uri

    def __repr__(self) -> str:
        return f"Store({self.root!r})"

    # -- records --------------------------------------------------------------------------

    def append(self, records: RecordsLike) -> list[str]:
        """Add records (Records, or a table/DataFrame with the canonical columns).

        Writes one new fragment per (hw_id, op_kind) present, each appearing atomically.
        Returns the paths written.
        """
        table = _to_table(records)
        if table.num_rows == 0:
            return []
        _check_table(table)
        written = []
        groups = table.group_by(["hw_id", "op_kind"]).aggregate([]).to_pylist()
        for group in groups:
            part = table
            if len(groups) > 1:
                part = table.filter(pc.and_(
                    pc.equal(table.column("hw_id"), group["hw_id"]),
                    pc.equal(table.column("op_kind"), group["op_kind"]),
                ))
            written.extend(self._write_fragments(group["hw_id"], group["op_kind"], part))
        return written

    def _write_fragments(self, hw_id: str, op_kind: str, table: pa.Table) -> list[str]:
        directory = partition_dir(hw_id, op_kind)
        written = []
        for start in range(0, table.num_rows, MAX_ROWS_PER_FRAGMENT):
            chunk = table.slice(start, MAX_ROWS_PER_FRAGMENT)
            data = io.fragment_bytes(chunk)
            written.append(fs.write_atomic(self.location, f"{directory}/{new_fragment_name()}",
                                           data))
        return written

    def fragments(self, hw_id: str | None = None, op_kind: str | None = None) -> list[Fragment]:
        """The visible record fragments, optionally of one hardware / op kind."""
        return io.list_fragments(self.location, hw_id, op_kind)

    def scan(self, **filters: Any) -> pa.Table:
        """Records as an Arrow table; filters as :func:`tunecache.datasets.io.scan`."""
        return io.scan(self.location, **filters)

    def load(self, **filters: Any) -> pd.DataFrame:
        """Records as a pandas DataFrame with the canonical (Arrow-backed) dtypes."""
        return io.to_pandas(self.scan(**filters))

    def hardware(self) -> list[str]:
        """Every hw_id with records or published snapshots."""
        found = set()
        for name in fs.list_dirs(self.location, RECORDS_DIR):
            if name.startswith("hw_id="):
                hw_id = name[len("hw_id="):]
                if parse_partition(f"{name}/op_kind=x") is not None:
                    found.add(hw_id)
        for name in fs.list_dirs(self.location, paths.PUBLISHED_DIR):
            try:
                found.add(check_part("hw_id", name))
            except TunecacheError:
                continue
        return sorted(found)

    # -- publishing ----------------------------------------------------------------------

    def publish(self, hw_id: str | Sequence[str] | None = None) -> list[PublishResult]:
        """Publish the best schedule per op for each hardware (all with records by default).

        A snapshot identical in content to the current one is not written again.
        """
        if hw_id is None:
            hw_ids = sorted({f.hw_id for f in self.fragments()})
        else:
            hw_ids = [hw_id] if isinstance(hw_id, str) else list(hw_id)
        results = []
        for hw in hw_ids:
            check_part("hw_id", hw)
            records = self.scan(hw_id=hw, columns=list(PUBLISH_COLUMNS))
            snapshot = best_of(records)
            digest = snapshot_digest(snapshot)
            try:
                current = self.current(hw)
            except SnapshotError as exc:
                warnings.warn(f"{hw}: replacing a damaged pointer ({exc})", stacklevel=2)
                current = None
            if current is not None and current.digest == digest:
                results.append(PublishResult(hw, current.snapshot, current.entries,
                                             records.num_rows, False))
                continue
            name = paths.new_snapshot_name(digest)
            fs.write_atomic(self.location, paths.snapshot_path(hw, name),
                            snapshot_bytes(snapshot))
            pointer = Pointer(name, digest, snapshot.num_rows,
                              datetime.now(timezone.utc).isoformat())
            self._set_pointer(hw, pointer)
            results.append(PublishResult(hw, name, snapshot.num_rows, records.num_rows, True))
        return results

    def _set_pointer(self, hw_id: str, pointer: Pointer) -> None:
        fs.write_atomic(self.location, paths.pointer_path(hw_id), pointer.to_json().encode())

    def current(self, hw_id: str) -> Pointer | None:
        """The current snapshot pointer of ``hw_id`` (None if nothing was published)."""
        data = fs.read_bytes(self.location, paths.pointer_path(hw_id))
        return None if data is None else Pointer.from_json(data)

    def snapshots(self, hw_id: str) -> list[str]:
        """Snapshot names of ``hw_id``, oldest first."""
        return [n for n in fs.list_names(self.location, paths.published_dir(hw_id))
                if paths.SNAPSHOT_RE.fullmatch(n)]

    def read_snapshot(self, hw_id: str, name: str | None = None) -> pa.Table:
        """A published snapshot (the current one by default) as an Arrow table.

        Snapshots of every version read with the current snapshot columns (older versions'
        extra columns, such as version 1's typed matmul knobs, are dropped), so snapshots of
        several hardware concatenate.
        """
        if name is None:
            pointer = self.current(hw_id)
            if pointer is None:
                raise SnapshotError(f"nothing published for {hw_id} in {self.root}")
            name = pointer.snapshot
        path = self.location.path(paths.snapshot_path(hw_id, name))
        try:
            with self.location.fs.open_input_file(path) as handle:
                table = pq.read_table(handle)
        except FileNotFoundError:
            raise SnapshotError(f"snapshot {name} of {hw_id} is missing") from None
        except (OSError, pa.ArrowException) as exc:
            raise SnapshotError(f"snapshot {name} of {hw_id} is damaged: {exc}") from None
        try:
            return conform(table, SNAPSHOT_SCHEMA).replace_schema_metadata(table.schema.metadata)
        except SchemaError as exc:
            raise SnapshotError(f"snapshot {name} of {hw_id} is damaged: {exc}") from None

    def rollback(self, hw_id: str, to: str | None = None) -> Pointer:
        """Make an older snapshot current: ``to``, or the one before the current one."""
        names = self.snapshots(hw_id)
        current = self.current(hw_id)
        if to is None:
            if current is None:
                raise StoreError(f"nothing published for {hw_id}; nothing to roll back")
            older = [n for n in names if n < current.snapshot]
            if not older:
                raise StoreError(
                    f"{hw_id}: no snapshot older than {current.snapshot} to roll back to"
                )
            to = older[-1]
        paths.check_snapshot_name(to)
        if to not in names:
            raise StoreError(f"{hw_id} has no snapshot {to}; snapshots: {', '.join(names)}")
        table = self.read_snapshot(hw_id, to)
        pointer = Pointer(to, snapshot_digest(table), table.num_rows,
                          datetime.now(timezone.utc).isoformat())
        self._set_pointer(hw_id, pointer)
        return pointer

    # -- maintenance ---------------------------------------------------------------------

    def compact(
        self,
        hw_id: str | None = None,
        op_kind: str | None = None,
        *,
        max_fragment_bytes: int = COMPACT_MAX_FRAGMENT_BYTES,
        stale_temp_s: float = STALE_TEMP_SECONDS,
    ) -> CompactResult:
        """Merge the small fragments of each partition into one, de-duplicated and sorted.

        The merged fragment is written (atomically) before the fragments it replaces are
        deleted, so concurrent readers and a crash in between can at worst leave
        duplicates, which readers drop by ``record_id`` and the next compaction removes.
        Damaged fragments are left in place for ``verify`` to report. Leftover temporary
        files of killed writers older than ``stale_temp_s`` are removed.
        """
        all_fragments = self.fragments(hw_id, op_kind)
        by_partition: dict[tuple[str, str], list[Fragment]] = {}
        for fragment in all_fragments:
            by_partition.setdefault((fragment.hw_id, fragment.op_kind), []).append(fragment)
        before = after = records = 0
        for (hw, kind), fragments in sorted(by_partition.items()):
            small = [f for f in fragments if f.size < max_fragment_bytes]
            before += len(fragments)
            if len(small) < 2:
                after += len(fragments)
                continue
            tables, _vanished, damaged = io.read_fragments(self.location, small)
            io.warn_damaged(damaged)
            read = [f for f in small if f.path in tables]
            if len(read) < 2:
                after += len(fragments)
                continue
            merged = io.dedup(pa.concat_tables([tables[f.path] for f in read]))
            merged = merged.take(pc.sort_indices(
                merged, [("op_id", "ascending"), ("schedule_id", "ascending"),
                         ("timestamp", "ascending"), ("record_id", "ascending")]))
            written = self._write_fragments(hw, kind, merged)
            for fragment in read:
                fs.delete(self.location, fragment.path)
            records += merged.num_rows
            after += len(fragments) - len(read) + len(written)
        removed = 0
        for temp in fs.temporaries(self.location, "", stale_temp_s):
            removed += fs.delete(self.location, temp)
        return CompactResult(len(by_partition), before, after, records, removed)

    def verify(self) -> VerifyReport:
        """Read everything and report damaged fragments, strays and published problems."""
        fragments = self.fragments()
        tables, _vanished, damaged = io.read_fragments(self.location, fragments)
        rows = sum(t.num_rows for t in tables.values())
        unique = 0
        if tables:
            ids = pa.concat_arrays([t.column("record_id").combine_chunks()
                                    for t in tables.values()])
            unique = pc.count_distinct(ids).as_py()
        stray = []
        selector = pafs.FileSelector(self.location.path(RECORDS_DIR), recursive=True,
                                     allow_not_found=True)
        known = {f.path for f in fragments}
        for info in self.location.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and info.path not in known and not (
                info.base_name.startswith(".") and info.base_name.endswith(fs.TEMP_SUFFIX)
            ):
                stray.append(info.path)
        published: dict[str, str] = {}
        problems: list[str] = []
        for hw in fs.list_dirs(self.location, paths.PUBLISHED_DIR):
            try:
                check_part("hw_id", hw)
                pointer = self.current(hw)
                if pointer is None:
                    published[hw] = "(no CURRENT pointer)"
                    continue
                published[hw] = pointer.snapshot
                problems.extend(f"{hw}: {p}" for p in _snapshot_problems(
                    self.read_snapshot(hw, pointer.snapshot), hw))
            except TunecacheError as exc:
                problems.append(f"{hw}: {exc}")
        return VerifyReport(
            fragments=len(fragments),
            rows=rows,
            damaged=[(f.path, reason) for f, reason in damaged],
            duplicate_rows=rows - unique,
            stray_files=sorted(stray),
            temporaries=fs.temporaries(self.location, ""),
            published=published,
            problems=problems,
        )

    def stats(self) -> dict[str, Any]:
        """Fragments, bytes and rows per partition (from file footers) and what is published."""
        partitions: dict[tuple[str, str], dict[str, int]] = {}
        for fragment in self.fragments():
            entry = partitions.setdefault((fragment.hw_id, fragment.op_kind),
                                          {"fragments": 0, "bytes": 0, "rows": 0})
            entry["fragments"] += 1
            entry["bytes"] += fragment.size
            try:
                with self.location.fs.open_input_file(fragment.path) as handle:
                    entry["rows"] += pq.read_metadata(handle).num_rows
            except (OSError, pa.ArrowException):
                entry.setdefault("damaged", 0)
                entry["damaged"] += 1
        published: dict[str, dict[str, Any]] = {}
        for hw in self.hardware():
            try:
                pointer = self.current(hw)
            except SnapshotError as exc:
                published[hw] = {"error": str(exc)}
                continue
            if pointer is not None:
                published[hw] = {**asdict(pointer), "snapshots": len(self.snapshots(hw))}
        return {
            "root": self.root,
            "partitions": [
                {"hw_id": hw, "op_kind": kind, **values}
                for (hw, kind), values in sorted(partitions.items())
            ],
            "published": published,
        }


def _snapshot_problems(table: pa.Table, hw_id: str) -> list[str]:
    problems = []
    for row in table.to_pylist():
        where = f"op {row['op_id']}"
        if row["hw_id"] != hw_id:
            problems.append(f"{where}: hw_id {row['hw_id']} in the snapshot of {hw_id}")
        try:
            if OpSignature.parse(row["op_text"]).op_id != row["op_id"]:
                problems.append(f"{where}: op text does not hash to its op_id")
            schedule = schedule_from_json(row["schedule_json"])
        except TunecacheError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if schedule.schedule_id != row["schedule_id"]:
            problems.append(f"{where}: schedule JSON does not match schedule_id")
        if schedule.family != row["schedule_family"]:
            problems.append(f"{where}: schedule_family {row['schedule_family']} differs from "
                            f"the schedule JSON's {schedule.family}")
    return problems
