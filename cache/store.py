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

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
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
    parse_hardware,
    select,
    snapshot_bytes,
    snapshot_digest,
)
from tunecache.cache.wanted import verify_wanted
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
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
from tunecache.datasets.schema import SCHEMA, STATUSES, conform

MAX_ROWS_PER_FRAGMENT = 2_000_000
COMPACT_MAX_FRAGMENT_BYTES = 256 << 20
STALE_TEMP_SECONDS = 3600.0
_SHA256_RE = re.compile(r"[0-9a-f]{64}")

RecordsLike: TypeAlias = Iterable[Record] | pa.Table | pd.DataFrame


@dataclass(frozen=True, slots=True)
class Pointer:
    """The content of ``published/<hw_id>/CURRENT``.

    ``digest`` is the digest of the snapshot's content (:func:`snapshot_digest`),
    ``file_sha256`` the SHA-256 of the snapshot file's bytes, checked by every reader
    (empty in pointers written before it existed: then the file is checked by reading it).
    """

    snapshot: str
    digest: str
    entries: int
    published_at: str
    snapshot_version: int = SNAPSHOT_VERSION
    file_sha256: str = ""

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
                file_sha256=str(data.get("file_sha256", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"damaged snapshot pointer: {exc}") from None
        if pointer.file_sha256 and _SHA256_RE.fullmatch(pointer.file_sha256) is None:
            raise SnapshotError("damaged snapshot pointer: file_sha256 is not a SHA-256 "
                                "hex digest")
        return pointer


def check_snapshot_bytes(hw_id: str, pointer: Pointer, data: bytes | None) -> bytes:
    """``data``, the bytes of the snapshot ``pointer`` names, if they are the ones it pins.

    Raises :class:`SnapshotError` when the file is missing or its SHA-256 differs from the
    pointer's (damaged, truncated or replaced since it was published).
    """
    if data is None:
        raise SnapshotError(f"snapshot {pointer.snapshot} of {hw_id} is missing")
    if pointer.file_sha256 and hashlib.sha256(data).hexdigest() != pointer.file_sha256:
        raise SnapshotError(f"snapshot {pointer.snapshot} of {hw_id} does not match the "
                            "digest its CURRENT pointer records (damaged or replaced)")
    return data


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What :meth:`Store.publish` did for one hardware.

    ``snapshot``/``entries``: the current snapshot afterwards. ``rejected``: records refused
    by validation (``rejections``: the first reasons, one line each). ``damaged``: record
    fragments that could not be read (path: reason). ``lost``: entries of the previous
    snapshot the new one lacks with no newer measurement of their op. ``refused``: why the
    new snapshot was not made current (None when it was, or nothing changed).
    ``repaired``: the current snapshot was damaged and has been rewritten.
    """

    hw_id: str
    snapshot: str
    entries: int
    records: int
    changed: bool
    rejected: int = 0
    rejections: tuple[str, ...] = ()
    damaged: tuple[str, ...] = ()
    lost: int = 0
    refused: str | None = None
    repaired: bool = False


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
    """Findings of :meth:`Store.verify`. ``ok`` is false when anything is damaged.

    ``damaged``: record fragments and wanted-list files that do not read (path, reason).
    ``wanted_files``: wanted-list files read. ``models``: stored cost-model versions that
    load (their ``model.json`` matches the digest in ``meta.json``). ``problems``: published
    snapshots, pointers and models that are damaged or inconsistent.
    """

    fragments: int
    rows: int
    damaged: list[tuple[str, str]] = field(default_factory=list)
    duplicate_rows: int = 0
    stray_files: list[str] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)
    published: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    wanted_files: int = 0
    models: list[str] = field(default_factory=list)

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

    def publish(self, hw_id: str | Sequence[str] | None = None, *,
                force: bool = False) -> list[PublishResult]:
        """Publish the best valid schedule per op for each hardware (all with records by
        default); see :mod:`tunecache.cache.publish` for the rule.

        A snapshot identical in content to the current one is not written again, unless the
        current one is damaged (then it is rewritten). Without ``force`` a new snapshot does
        not become current when a record fragment of its hardware could not be read, or
        when it would lose entries of the current one (an entry whose key is gone and whose
        op has no newer measurement); the result then says why in ``refused``.
        """
        if hw_id is None:
            hw_ids = sorted({f.hw_id for f in self.fragments()})
        else:
            hw_ids = [hw_id] if isinstance(hw_id, str) else list(hw_id)
        return [self._publish_one(check_part("hw_id", hw), force) for hw in hw_ids]

    def _publish_one(self, hw: str, force: bool) -> PublishResult:
        records, damaged = self._read_records(hw)
        spec = self.hardware_spec(hw)
        selection = select(records, {hw: spec} if spec is not None else {})
        snapshot = selection.snapshot
        current, previous = self._current_state(hw)
        lost = 0
        if current is not None:
            lost = _lost(previous, snapshot) if previous is not None \
                else max(0, current.entries - snapshot.num_rows)
        result = PublishResult(
            hw, current.snapshot if current else "", current.entries if current else 0,
            records.num_rows, False, rejected=selection.rejected,
            rejections=tuple(r.reason for r in selection.rejections[:MAX_REASONS]),
            damaged=tuple(f"{path}: {reason}" for path, reason in damaged), lost=lost,
        )
        refused = _refusal(hw, damaged, lost, current)
        if refused is not None and not force:
            return replace(result, refused=refused)
        if spec is not None:
            self._write_spec(spec)
        digest = snapshot_digest(snapshot)
        if current is not None and previous is not None and current.digest == digest:
            return result
        name = self._make_current(hw, snapshot, digest)
        return replace(result, snapshot=name, entries=snapshot.num_rows, changed=True,
                       repaired=current is not None and previous is None)

    def _write_spec(self, spec: HardwareSpec) -> None:
        """Keep ``published/<hw_id>/HARDWARE.json`` beside the snapshots (written once)."""
        path = paths.hardware_path(spec.hw_id)
        text = spec.to_json().encode()
        if fs.read_bytes(self.location, path) != text:
            fs.write_atomic(self.location, path, text)

    def _current_state(self, hw_id: str) -> tuple[Pointer | None, pa.Table | None]:
        """The current pointer and, if intact, its snapshot (None when damaged)."""
        try:
            current = self.current(hw_id)
        except SnapshotError as exc:
            warnings.warn(f"{hw_id}: replacing a damaged pointer ({exc})", stacklevel=4)
            return None, None
        if current is None:
            return None, None
        try:
            return current, self._current_table(hw_id, current)
        except SnapshotError:
            return current, None  # damaged: the next snapshot replaces it

    def _make_current(self, hw_id: str, snapshot: pa.Table, digest: str) -> str:
        """Write ``snapshot``, then point ``CURRENT`` at it (its file's SHA-256 included)."""
        name = paths.new_snapshot_name(digest)
        data = snapshot_bytes(snapshot).to_pybytes()
        fs.write_atomic(self.location, paths.snapshot_path(hw_id, name), data)
        self._set_pointer(hw_id, Pointer(name, digest, snapshot.num_rows,
                                         datetime.now(timezone.utc).isoformat(),
                                         file_sha256=hashlib.sha256(data).hexdigest()))
        return name

    def _read_records(self, hw_id: str) -> tuple[pa.Table, list[tuple[str, str]]]:
        """The publish columns of every readable record of ``hw_id``, de-duplicated, and
        the fragments that could not be read (path, reason)."""
        columns = list(PUBLISH_COLUMNS)
        tables: dict[str, pa.Table] = {}
        damaged: dict[str, str] = {}
        for _ in range(RELIST_ATTEMPTS):
            todo = [f for f in self.fragments(hw_id)
                    if f.path not in tables and f.path not in damaged]
            got, vanished, bad = io.read_fragments(self.location, todo, columns)
            tables.update(got)
            damaged.update((f.path, reason) for f, reason in bad)
            if not vanished:
                break
        else:
            raise StoreError(f"fragments of {hw_id} under {self.root} kept disappearing "
                             "while being read; try again")
        parts = [tables[path] for path in sorted(tables)]
        table = pa.concat_tables(parts) if parts else \
            pa.schema([SCHEMA.field(c) for c in columns]).empty_table()
        return io.dedup(table), sorted(damaged.items())

    def hardware_spec(self, hw_id: str) -> HardwareSpec | None:
        """The spec of ``hw_id`` from its records' ``hw_json`` (None when none has it).

        A spec is identified by the hash of its content, so the first stored spec that
        hashes to ``hw_id`` is the one; the column is read dictionary-encoded, fragment by
        fragment until one is found.
        """
        for fragment in self.fragments(hw_id):
            try:
                with self.location.fs.open_input_file(fragment.path) as handle:
                    parquet = pq.ParquetFile(handle, read_dictionary=["hw_json"])
                    if "hw_json" not in parquet.schema_arrow.names:
                        continue
                    column = parquet.read(columns=["hw_json"], use_threads=False)["hw_json"]
            except (OSError, pa.ArrowException):
                continue
            for chunk in column.chunks:
                values = chunk.dictionary if pa.types.is_dictionary(chunk.type) else \
                    pc.unique(chunk)
                for text in values.to_pylist():
                    spec = parse_hardware(text)
                    if spec is not None and spec.hw_id == hw_id:
                        return spec
        return None

    def _set_pointer(self, hw_id: str, pointer: Pointer) -> None:
        fs.write_atomic(self.location, paths.pointer_path(hw_id), pointer.to_json().encode())

    def current(self, hw_id: str) -> Pointer | None:
        """The current snapshot pointer of ``hw_id`` (None if nothing was published)."""
        try:
            data = fs.read_bytes(self.location, paths.pointer_path(hw_id))
        except fs.UnreadableFile as exc:
            raise SnapshotError(f"its CURRENT pointer {exc.strerror}") from None
        return None if data is None else Pointer.from_json(data)

    def snapshots(self, hw_id: str) -> list[str]:
        """Snapshot names of ``hw_id``, oldest first."""
        return [n for n in fs.list_names(self.location, paths.published_dir(hw_id))
                if paths.SNAPSHOT_RE.fullmatch(n)]

    def read_snapshot(self, hw_id: str, name: str | None = None) -> pa.Table:
        """A published snapshot (the current one by default) as an Arrow table.

        The current snapshot is checked against the digest its pointer records. Snapshots
        of every version read with the current snapshot columns (older versions' extra
        columns, such as version 1's typed matmul knobs, are dropped), so snapshots of
        several hardware concatenate.
        """
        if name is None:
            pointer = self.current(hw_id)
            if pointer is None:
                raise SnapshotError(f"nothing published for {hw_id} in {self.root}")
            return self._current_table(hw_id, pointer)
        return self._parse_snapshot(hw_id, name, self._snapshot_bytes(hw_id, name))

    def _snapshot_bytes(self, hw_id: str, name: str) -> bytes:
        try:
            data = fs.read_bytes(self.location, paths.snapshot_path(hw_id, name))
        except OSError as exc:
            raise SnapshotError(f"snapshot {name} of {hw_id} cannot be read: {exc}") from None
        if data is None:
            raise SnapshotError(f"snapshot {name} of {hw_id} is missing")
        return data

    def _current_table(self, hw_id: str, pointer: Pointer) -> pa.Table:
        """The snapshot ``pointer`` names, if intact: its file digest matches the pointer's
        (or, for pointers without one, its content digest does)."""
        data = check_snapshot_bytes(hw_id, pointer,
                                    self._snapshot_bytes(hw_id, pointer.snapshot))
        table = self._parse_snapshot(hw_id, pointer.snapshot, data)
        if not pointer.file_sha256 and snapshot_digest(table) != pointer.digest:
            raise SnapshotError(f"snapshot {pointer.snapshot} of {hw_id} does not match the "
                                "digest its CURRENT pointer records (damaged or replaced)")
        return table

    @staticmethod
    def _parse_snapshot(hw_id: str, name: str, data: bytes) -> pa.Table:
        try:
            table = io.read_parquet_bytes(data)
            return conform(table, SNAPSHOT_SCHEMA).replace_schema_metadata(table.schema.metadata)
        except (OSError, pa.ArrowException, SchemaError) as exc:
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
        data = self._snapshot_bytes(hw_id, to)
        table = self._parse_snapshot(hw_id, to, data)
        pointer = Pointer(to, snapshot_digest(table), table.num_rows,
                          datetime.now(timezone.utc).isoformat(),
                          file_sha256=hashlib.sha256(data).hexdigest())
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
        known = {f.path for f in fragments}
        for info in fs.infos(self.location, self.location.path(RECORDS_DIR), recursive=True):
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
                    self._current_table(hw, pointer), hw))
            except TunecacheError as exc:
                problems.append(f"{hw}: {exc}")
        wanted_files, wanted_damaged = verify_wanted(self.location)
        models, model_problems = _verify_models(self.location)
        return VerifyReport(
            fragments=len(fragments),
            rows=rows,
            damaged=[(f.path, reason) for f, reason in damaged] + wanted_damaged,
            duplicate_rows=rows - unique,
            stray_files=sorted(stray),
            temporaries=fs.temporaries(self.location, ""),
            published=published,
            problems=problems + model_problems,
            wanted_files=wanted_files,
            models=models,
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


MAX_REASONS = 20
"""Rejection reasons a :class:`PublishResult` keeps (it counts them all)."""
RELIST_ATTEMPTS = 5


def _lost(previous: pa.Table, snapshot: pa.Table) -> int:
    """Entries of ``previous`` that ``snapshot`` drops: their key is gone and their op has
    no measurement newer than theirs in ``snapshot``."""
    keys = ["op_id", "codegen_version", "compiler"]

    def frame(table: pa.Table) -> pd.DataFrame:
        df = table.select([*keys, "measured_at"]).to_pandas()
        df[keys] = df[keys].fillna("")
        return df

    old, new = frame(previous), frame(snapshot)
    present = old.merge(new[keys].drop_duplicates().assign(_present=True), on=keys,
                        how="left")["_present"].notna().to_numpy()
    gone = old[~present]
    if gone.empty:
        return 0
    newest = gone["op_id"].map(new.groupby("op_id")["measured_at"].max())
    replaced = (newest > gone["measured_at"]).fillna(False).to_numpy(dtype=bool)
    return int((~replaced).sum())


def _refusal(hw_id: str, damaged: Sequence[tuple[str, str]], lost: int,
             current: Pointer | None) -> str | None:
    """Why a new snapshot of ``hw_id`` must not become current (None: it may)."""
    why = []
    if damaged:
        why.append(f"{len(damaged)} damaged record fragment(s) could not be read "
                   f"(first: {damaged[0][0]}; run `tunecache cache verify`)")
    if lost and current is not None:
        why.append(f"it would drop {lost} of the {current.entries} entries of the current "
                   f"snapshot {current.snapshot}")
    if not why:
        return None
    return (f"{hw_id}: not publishing: " + "; ".join(why)
            + "; fix the store or publish with --force")


def _verify_models(loc: Location) -> tuple[list[str], list[str]]:
    """Stored cost-model versions that load, and problems (a damaged pointer or model)."""
    from tunecache.costmodel import registry

    if not fs.list_dirs(loc, registry.MODELS_DIR) and \
            not fs.exists(loc, f"{registry.MODELS_DIR}/{registry.POINTER}"):
        return [], []
    good: list[str] = []
    problems: list[str] = []
    for version in registry.list_versions(loc):
        try:
            registry.load_version(loc, version)
        except (TunecacheError, OSError) as exc:
            problems.append(f"models: {exc}")
        else:
            good.append(version)
    try:
        current = registry.current_version(loc)
    except (TunecacheError, OSError) as exc:
        problems.append(f"models: {exc}")
    else:
        if current is not None and current not in good:
            problems.append(f"models: CURRENT names {current}, which does not load")
    return good, problems


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
