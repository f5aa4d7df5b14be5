"""Reading the records dataset: listing fragments, reading them safely, filters, pandas.

Readers never trust the directory: hidden and temporary files are ignored, a fragment that
cannot be read is skipped with a :class:`DamagedFragmentWarning`, and rows are de-duplicated
by ``record_id`` (compaction writes merged fragments before deleting their sources, so a
reader may briefly see both). A fragment deleted while being read (by a compactor) makes the
reader list again, so the merged fragment that replaced it is picked up.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tunecache.compiler.ops import OpSignature
from tunecache.datasets import fs, location
from tunecache.datasets.errors import DamagedFragmentWarning, DatasetError, SchemaError
from tunecache.datasets.location import Location
from tunecache.datasets.paths import (
    RECORDS_DIR,
    check_part,
    is_fragment_name,
    parse_partition,
)
from tunecache.datasets.schema import (
    FILE_SCHEMA,
    PARTITION_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    conform,
)

MAX_READ_THREADS = 16
_RELIST_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class Fragment:
    """One fragment file of the records dataset."""

    path: str
    hw_id: str
    op_kind: str
    size: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _as_list(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


LISTING_ATTEMPTS = 5
"""How often a listing is tried when a directory vanishes or appears during the walk (a
concurrent writer creating the store's first partition)."""


def _walk(loc: Location, base: str) -> list[pafs.FileInfo]:
    """Everything under ``base`` (nothing when it does not exist), tolerating writers."""
    for _ in range(LISTING_ATTEMPTS - 1):
        try:
            return fs.infos(loc, base, recursive=True)
        except FileNotFoundError:
            # A directory seen a moment ago is not there yet or any more (a writer is
            # between its mkdir and its rename); list again.
            continue
    return fs.infos(loc, base, recursive=True)


def list_fragments(
    loc: Location,
    hw_id: str | Iterable[str] | None = None,
    op_kind: str | Iterable[str] | None = None,
) -> list[Fragment]:
    """Every visible fragment (sorted by path), pruned by partition values if given.

    Files that are hidden, temporary or not named like fragments, and directories that are
    not valid partitions, are not fragments and are ignored.
    """
    hw_ids = [check_part("hw_id", h) for h in _as_list(hw_id) or []] or None
    kinds = [check_part("op_kind", k) for k in _as_list(op_kind) or []] or None
    records = loc.path(RECORDS_DIR)
    bases = [loc.path(f"{RECORDS_DIR}/hw_id={h}") for h in hw_ids] if hw_ids else [records]
    found: list[Fragment] = []
    for base in bases:
        for info in _walk(loc, base):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(records):].strip("/")
            directory, _, name = relative.rpartition("/")
            if not is_fragment_name(name):
                continue
            partition = parse_partition(directory)
            if partition is None:
                continue
            if kinds is not None and partition[1] not in kinds:
                continue
            found.append(Fragment(info.path, partition[0], partition[1], info.size or 0))
    found.sort(key=lambda f: f.path)
    return found


def fragment_bytes(table: pa.Table) -> pa.Buffer:
    """Serialise canonical rows of one partition as a fragment file (Parquet, zstd)."""
    table = conform(table).select(list(FILE_SCHEMA.names)).replace_schema_metadata(
        FILE_SCHEMA.metadata
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", compression_level=1)
    return sink.getvalue()


def read_parquet_bytes(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    """A whole Parquet file from its content (``schema`` as ``pq.read_table`` takes it).

    The content is first copied into memory Arrow owns. ``pq.read_table`` scans through
    Arrow's thread pool, and a worker can drop the scan's last reference to its input after
    the call has returned; an input over Python bytes then needs the GIL to be freed, and
    during interpreter exit that aborts the process ("terminate called without an active
    exception", apache/arrow#34314): ``tunecache cache verify`` on a store with a damaged
    wanted-list file aborted in about 1 run in 40 beside CPU burners.
    """
    owned = pa.BufferOutputStream()
    owned.write(data)
    return pq.read_table(pa.BufferReader(owned.getvalue()), schema=schema)


def _subset_schema(columns: Sequence[str] | None) -> pa.Schema:
    if columns is None:
        return SCHEMA
    unknown = sorted(set(columns) - set(SCHEMA.names))
    if unknown:
        raise DatasetError(f"unknown record column(s) {', '.join(unknown)}")
    return pa.schema([SCHEMA.field(c) for c in columns])


def read_fragment(loc: Location, fragment: Fragment,
                  columns: Sequence[str] | None = None) -> pa.Table:
    """Read one fragment as canonical columns (partition columns from its path).

    Raises FileNotFoundError when it no longer exists, and :class:`SchemaError` or an Arrow
    error when it is damaged.
    """
    schema = _subset_schema(columns)
    with loc.fs.open_input_file(fragment.path) as handle:
        parquet = pq.ParquetFile(handle)
        present = set(parquet.schema_arrow.names)
        wanted = [n for n in schema.names if n in present and n not in PARTITION_COLUMNS]
        table = parquet.read(columns=wanted, use_threads=False)
        meta = parquet.schema_arrow.metadata or {}
    version = meta.get(SCHEMA_VERSION_KEY)
    if version is not None and not version.isdigit():
        raise SchemaError(f"bad schema version {version!r} in file metadata")
    for name, value in (("hw_id", fragment.hw_id), ("op_kind", fragment.op_kind)):
        if name in schema.names:
            table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
    return conform(table, schema)


def _exists(loc: Location, path: str) -> bool:
    try:
        return bool(loc.fs.get_file_info(path).type == pafs.FileType.File)
    except OSError:
        return False


def dedup(table: pa.Table) -> pa.Table:
    """Keep the first row of each ``record_id``."""
    if table.num_rows < 2:
        return table
    ids = table.column("record_id")
    if pc.count_distinct(ids).as_py() == table.num_rows:
        return table
    indexed = pa.table({"id": ids, "i": pa.array(np.arange(table.num_rows))})
    first = indexed.group_by("id", use_threads=False).aggregate([("i", "min")])
    return table.take(np.sort(first.column("i_min").to_numpy()))


def read_fragments(
    loc: Location,
    fragments: Sequence[Fragment],
    columns: Sequence[str] | None = None,
) -> tuple[dict[str, pa.Table], list[Fragment], list[tuple[Fragment, str]]]:
    """Read fragments in parallel: (tables by path, vanished ones, damaged ones + reason)."""
    tables: dict[str, pa.Table] = {}
    vanished: list[Fragment] = []
    damaged: list[tuple[Fragment, str]] = []

    def one(fragment: Fragment) -> tuple[Fragment, pa.Table | None, str | None]:
        try:
            return fragment, read_fragment(loc, fragment, columns), None
        except FileNotFoundError:
            return fragment, None, None
        except (OSError, pa.ArrowException, SchemaError, ValueError) as exc:
            if not _exists(loc, fragment.path):
                return fragment, None, None
            return fragment, None, f"{type(exc).__name__}: {exc}"

    workers = max(1, min(MAX_READ_THREADS, len(fragments)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for fragment, table, problem in pool.map(one, fragments):
            if table is not None:
                tables[fragment.path] = table
            elif problem is not None:
                damaged.append((fragment, problem))
            else:
                vanished.append(fragment)
    return tables, vanished, damaged


def warn_damaged(damaged: Sequence[tuple[Fragment, str]]) -> None:
    for fragment, reason in damaged:
        warnings.warn(
            f"skipping damaged fragment {fragment.path}: {reason} "
            "(run `tunecache cache verify`)",
            DamagedFragmentWarning,
            stacklevel=3,
        )


def _op_ids(op: OpSignature | str | Iterable[OpSignature | str] | None) -> list[str] | None:
    if op is None:
        return None
    items: Iterable[OpSignature | str] = [op] if isinstance(op, (OpSignature, str)) else op
    out = []
    for item in items:
        if isinstance(item, OpSignature):
            out.append(item.op_id)
        elif "(" in item:
            out.append(OpSignature.parse(item).op_id)
        else:
            out.append(item)
    return out


def _utc(value: datetime | str) -> pa.Scalar:
    stamp = pd.Timestamp(value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return pa.scalar(stamp.to_pydatetime(), pa.timestamp("us", tz="UTC"))


def scan(
    root: str | os.PathLike[str] | Location | None = None,
    *,
    hw_id: str | Iterable[str] | None = None,
    op_kind: str | Iterable[str] | None = None,
    op: OpSignature | str | Iterable[OpSignature | str] | None = None,
    status: str | Iterable[str] | None = None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Records as an Arrow table with the canonical schema (or the ``columns`` asked for).

    Filters: ``hw_id`` and ``op_kind`` (partition values, one or several), ``op`` (an
    :class:`OpSignature`, op text or ``op_id``, one or several), ``status``, and the time
    range ``since <= timestamp < until`` (naive times are UTC). Each record appears once.
    """
    loc = location.resolve(root)
    statuses = _as_list(status)
    op_ids = _op_ids(op)
    needed = list(columns) if columns is not None else list(SCHEMA.names)
    for extra in ["record_id"] + (["status"] if statuses else []) + \
            (["op_id"] if op_ids else []) + (["timestamp"] if since or until else []):
        if extra not in needed:
            needed.append(extra)

    tables: dict[str, pa.Table] = {}
    damaged_seen: set[str] = set()
    for _ in range(_RELIST_ATTEMPTS):
        listed = list_fragments(loc, hw_id, op_kind)
        todo = [f for f in listed if f.path not in tables and f.path not in damaged_seen]
        got, vanished, damaged = read_fragments(loc, todo, needed)
        tables.update(got)
        damaged_seen.update(f.path for f, _ in damaged)
        warn_damaged(damaged)
        if not vanished:
            break
    else:
        raise DatasetError(
            f"fragments under {loc.uri} kept disappearing while being read; try again"
        )

    schema = _subset_schema(needed)
    parts = [tables[path] for path in sorted(tables)]
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    mask: Any = None

    def both(a: Any, b: Any) -> Any:
        return b if a is None else pc.and_(a, b)

    if statuses:
        mask = both(mask, pc.is_in(table.column("status"), pa.array(statuses, pa.string())))
    if op_ids:
        mask = both(mask, pc.is_in(table.column("op_id"), pa.array(op_ids, pa.string())))
    if since is not None:
        mask = both(mask, pc.greater_equal(table.column("timestamp"), _utc(since)))
    if until is not None:
        mask = both(mask, pc.less(table.column("timestamp"), _utc(until)))
    if mask is not None:
        table = table.filter(mask)
    table = dedup(table)
    if columns is not None:
        table = table.select(list(columns))
    return table.replace_schema_metadata(
        {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()}
    )


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """Canonical pandas dtypes: Arrow-backed, so nullable integers and lists survive."""
    return table.to_pandas(types_mapper=pd.ArrowDtype)


def load(
    root: str | os.PathLike[str] | Location | None = None,
    **filters: Any,
) -> pd.DataFrame:
    """Records as a pandas DataFrame with the canonical (Arrow-backed) dtypes.

    Takes the filters of :func:`scan`. Without tunecache, the same rows can be read with
    ``pd.read_parquet(root + "/records", dtype_backend="pyarrow")`` (then de-duplicate by
    ``record_id`` if a compaction may be running).
    """
    return to_pandas(scan(root, **filters))
