"""Deploy-time lookups: the current published snapshot of one hardware, in memory.

:class:`Index` reads the snapshot once and keeps its columns as compact numpy arrays (about
a hundred bytes per entry plus a dict from op text to row), so opening costs milliseconds
and :meth:`Index.lookup` is a dict hit that builds its :class:`IndexEntry` from one packed
row without parsing anything. Schedules, whatever their family, are parsed from their JSON
with ``schedule_from_json`` when the index is built, once per *distinct* schedule (there
are far fewer schedules than entries), and shared by the entries that use them. A process
keeps the columns built from the last few snapshots (by the SHA-256 of their bytes, with the
hardware, codegen and compiler asked for): opening the same snapshot again, as a model planned
at many input shapes does, reads and checks the bytes but builds nothing.

Rows are ignored, never served, when their snapshot version is newer than this code reads,
their codegen version differs from the running one, their compiler's family and major
version (:func:`compiler_key`) differ from those of the compiler asked for (when one is),
their schedule JSON does not parse, or the parsed schedule's ``schedule_id`` differs from the
row's (a forged or damaged row); the schedule served is always the one parsed from the
JSON, never the typed knob columns of version 1 snapshots. For an op whose fastest row is
ignored, the next fastest valid one is served. A missing snapshot gives an empty index; a
damaged one, or one whose bytes differ from the SHA-256 its pointer records, gives an empty
index and a :class:`SnapshotWarning`: a deploy then simply misses.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import warnings
from array import array
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tunecache.cache import paths
from tunecache.cache.errors import SnapshotError, StoreWarning
from tunecache.cache.publish import SNAPSHOT_VERSION
from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, schedule_from_json
from tunecache.datasets import fs
from tunecache.datasets.location import Location, resolve
from tunecache.datasets.paths import check_part

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_COLUMNS = [
    "snapshot_version", "hw_id", "op_text", "codegen_version", "compiler", "schedule_id",
    "schedule_json", "median_s", "min_s", "gflops", "n_measurements", "source", "job_id",
    "host", "record_id", "measured_at",
]
"""What the index reads: common to every snapshot version it serves."""


class SnapshotWarning(StoreWarning):
    """The current snapshot could not be read; the index is empty."""


_VERSION_AFTER_WORD = re.compile(r"version (\d+)\.")
_DOTTED_VERSION = re.compile(r"(?<![\w.])(\d+)\.\d+")
_GCC_NAME = re.compile(r"(?:[\w.+-]+-)?(?:gcc|cc)(?:-[\d.]+)?")


def compiler_key(identity: str | None) -> str | None:
    """The family and major version of a compiler identity, e.g. ``"gcc 12"``.

    ``identity`` is what records store (``<first line of --version>;<target>``, e.g.
    ``gcc (Debian 12.2.0-14+deb12u1) 12.2.0;x86_64-linux-gnu``). GCC under any name
    (``cc``, ``gcc-12``, ``x86_64-linux-gnu-gcc``) is ``gcc``; Clang is ``clang`` (Apple's,
    numbered differently, ``apple-clang``). Without a version it is the family alone; None
    for an empty identity.
    """
    if not identity:
        return None
    first = identity.split(";")[0].strip()
    lower = first.lower()
    name = (lower.split() or [""])[0].rsplit("/", 1)[-1]
    if "clang" in lower:
        family = "apple-clang" if lower.startswith("apple") else "clang"
    elif _GCC_NAME.fullmatch(name):
        family = "gcc"
    else:
        family = name.rstrip("0123456789.-") or name
    match = _VERSION_AFTER_WORD.search(lower)
    majors = [match.group(1)] if match else _DOTTED_VERSION.findall(first)
    return f"{family} {int(majors[-1])}" if majors else family or None


class _Columns:
    """One snapshot's entries as packed columns (Python ``array`` objects: indexing one
    gives a Python number without building a numpy scalar), shared by every entry and
    every :class:`Index` built from those bytes. Never written after it is built."""

    __slots__ = ("codegen_version", "compiler", "compilers", "gflops", "host", "hosts", "job",
                 "jobs", "measured", "median", "min_s", "n", "n_mask", "n_shift", "record_ids",
                 "row_shift", "schedule", "schedule_mask", "schedule_shift", "schedules",
                 "source", "source_mask", "sources")

    def __init__(self, table: pa.Table, schedules: tuple[Schedule, ...],
                 codegen_version: str) -> None:
        self.codegen_version = codegen_version
        self.schedules = schedules
        self.schedule = _ints(table["_schedule"].to_numpy())
        self.n = _ints(pc.fill_null(table["n_measurements"], 0).to_numpy())
        codes = {name: _Codes(table[column]) for name, column in (
            ("compiler", "compiler"), ("source", "source"), ("job", "job_id"), ("host", "host"))}
        self.compiler, self.compilers = _ints(codes["compiler"].codes), codes["compiler"].values
        self.source, self.sources = _ints(codes["source"].codes), codes["source"].values
        self.job, self.jobs = _ints(codes["job"].codes), codes["job"].values
        self.host, self.hosts = _ints(codes["host"].codes), codes["host"].values
        self.record_ids = _Strings(table["record_id"])
        self.median = _floats(table["median_s"].to_numpy())
        self.min_s = _floats(pc.fill_null(table["min_s"], np.nan).to_numpy())
        self.gflops = _floats(pc.fill_null(table["gflops"], np.nan).to_numpy())
        # Microsecond timestamps stay exact in float64 (below 2**53).
        self.measured = _floats(pc.cast(table["measured_at"], pa.int64()).to_numpy())
        source_bits = max(1, (len(self.sources) - 1).bit_length())
        schedule_bits = max(1, len(schedules).bit_length())
        n_bits = max(1, max(self.n, default=0).bit_length())
        self.source_mask = (1 << source_bits) - 1
        self.schedule_shift, self.schedule_mask = source_bits, (1 << schedule_bits) - 1
        self.n_shift, self.n_mask = source_bits + schedule_bits, (1 << n_bits) - 1
        self.row_shift = self.n_shift + n_bits

    def keys(self) -> list[int]:
        """Each row's key: its row, measurement count, schedule and source packed into one
        int, each field as wide as this snapshot needs. A lookup reads the key and the
        median, not five columns: at a million entries each column read is a cache miss."""
        rows = len(self.median)
        if self.row_shift + rows.bit_length() <= 63:
            def field(values: array[int], shift: int) -> np.ndarray:
                return np.frombuffer(values, dtype=np.int32).astype(np.int64) << shift
            keys = (np.arange(rows, dtype=np.int64) << self.row_shift) | \
                field(self.n, self.n_shift) | field(self.schedule, self.schedule_shift) | \
                field(self.source, 0)
            return keys.tolist()
        return [row << self.row_shift | self.n[row] << self.n_shift |
                self.schedule[row] << self.schedule_shift | self.source[row]
                for row in range(rows)]


def _ints(values: np.ndarray) -> array[int]:
    return array("i", np.ascontiguousarray(values, dtype=np.int32).tobytes())


def _floats(values: np.ndarray) -> array[float]:
    return array("d", np.ascontiguousarray(values, dtype=np.float64).tobytes())


def _none_if_nan(value: float) -> float | None:
    return None if value != value else value


class IndexEntry(NamedTuple):
    """The published best schedule of one op, with its measured latency and provenance.

    A lookup builds what serving reads on every hit (``schedule``, ``median_s``,
    ``n_measurements``, ``source``); the rest of the provenance (``min_s``, ``gflops``,
    ``codegen_version``, ``compiler``, ``job_id``, ``host``, ``record_id``,
    ``measured_at``) is read from the snapshot's columns (``columns``, row ``row``) when
    asked for: building all thirteen fields was most of a lookup at a million entries.
    """

    op_text: str
    schedule: Schedule
    median_s: float
    n_measurements: int
    source: str | None
    row: int
    columns: _Columns

    def __repr__(self) -> str:
        return (f"IndexEntry(op_text={self.op_text!r}, schedule={self.schedule!r}, "
                f"median_s={self.median_s!r}, n_measurements={self.n_measurements}, "
                f"source={self.source!r})")

    @property
    def min_s(self) -> float | None:
        return _none_if_nan(self.columns.min_s[self.row])

    @property
    def gflops(self) -> float | None:
        return _none_if_nan(self.columns.gflops[self.row])

    @property
    def codegen_version(self) -> str:
        return self.columns.codegen_version

    @property
    def compiler(self) -> str | None:
        return self.columns.compilers[self.columns.compiler[self.row]]

    @property
    def job_id(self) -> str | None:
        return self.columns.jobs[self.columns.job[self.row]]

    @property
    def host(self) -> str | None:
        return self.columns.hosts[self.columns.host[self.row]]

    @property
    def record_id(self) -> str:
        return self.columns.record_ids.get(self.row) or ""

    @property
    def measured_at(self) -> datetime:
        return _EPOCH + timedelta(microseconds=int(self.columns.measured[self.row]))


class _Strings:
    """A string column as one bytes blob plus offsets: no Python object per row."""

    __slots__ = ("_data", "_offsets", "_valid")

    def __init__(self, array: pa.Array) -> None:
        array = pc.cast(array, pa.large_string())
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        self._valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        filled = pc.fill_null(array, "")
        buffers = filled.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[
            filled.offset: filled.offset + len(filled) + 1
        ]
        start, end = int(offsets[0]), int(offsets[-1])
        self._data = bytes(buffers[2])[start:end] if buffers[2] is not None else b""
        self._offsets = (offsets - start).astype(np.int64)

    def get(self, i: int) -> str | None:
        if not self._valid[i]:
            return None
        start, end = self._offsets[i:i + 2].tolist()
        return self._data[start:end].decode()


class _Codes:
    """A low-cardinality string column as int32 codes into a tuple of values."""

    __slots__ = ("codes", "values")

    def __init__(self, array: pa.Array) -> None:
        encoded = pc.dictionary_encode(array).combine_chunks() \
            if isinstance(array, pa.ChunkedArray) else pc.dictionary_encode(array)
        self.values: tuple[str | None, ...] = (*encoded.dictionary.to_pylist(), None)
        null_code = len(self.values) - 1
        self.codes = pc.fill_null(encoded.indices, null_code).to_numpy().astype(np.int32)


def _parse_schedules(
    texts: pa.ChunkedArray, ids: pa.ChunkedArray
) -> tuple[tuple[Schedule, ...], pa.Array]:
    """The distinct valid schedules, and each row's index into them (null: not valid).

    A schedule is parsed once however many rows use it; a row is valid when its JSON parses
    and the schedule's ``schedule_id`` is the row's.
    """
    encoded = pc.dictionary_encode(texts.combine_chunks())
    schedules: list[Schedule] = []
    position: list[int | None] = []
    schedule_ids: list[str | None] = []
    for text in encoded.dictionary.to_pylist():
        try:
            schedule = schedule_from_json(text)
        except TunecacheError:
            position.append(None)
            schedule_ids.append(None)
            continue
        position.append(len(schedules))
        schedule_ids.append(schedule.schedule_id)
        schedules.append(schedule)
    indices = encoded.indices
    codes = pc.take(pa.array(position, pa.int32()), indices)
    parsed_ids = pc.take(pa.array(schedule_ids, pa.string()), indices)
    matches = pc.fill_null(pc.equal(parsed_ids, ids.combine_chunks()), False)
    return tuple(schedules), pc.if_else(matches, codes, pa.scalar(None, pa.int32()))


MEMO_SIZE = 4096
"""Entries kept after a lookup, so repeated lookups of an op return the same object."""

BUILT_SNAPSHOTS = 8
"""Snapshots whose built columns a process keeps: a model compiled at many input shapes
opens the same indexes for every shape, and should not parse them again."""

BUILT_ENTRIES = 1_000_000
"""At most this many entries over the kept snapshots (about 300 bytes each)."""

_new_tuple = tuple.__new__  # builds an IndexEntry without its Python-level __new__


class _Snapshot(NamedTuple):
    """What an index builds from one snapshot's bytes: the row's key (see
    :meth:`_Columns.keys`) by op text, rows ignored, the packed columns."""

    pos: dict[str, int]
    ignored: int
    columns: _Columns


class _Built:
    """Built index columns by (snapshot bytes' SHA-256, hw_id, codegen, compiler), least
    recently used dropped first. The columns are never written after they are built."""

    def __init__(self, size: int, entries: int) -> None:
        self._size = size
        self._entries = entries
        self._items: OrderedDict[tuple[Any, ...], _Snapshot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> _Snapshot | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[Any, ...], built: _Snapshot) -> None:
        with self._lock:
            self._items[key] = built
            while len(self._items) > self._size or (
                    len(self._items) > 1 and self._held() > self._entries):
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def _held(self) -> int:
        return sum(len(built.pos) for built in self._items.values())


_BUILT = _Built(BUILT_SNAPSHOTS, BUILT_ENTRIES)


def forget_built() -> None:
    """Drop the columns this process keeps from the snapshots it opened: the next
    :class:`Index` of each builds them again (benchmarks time that; a long-lived process may
    free the memory)."""
    _BUILT.clear()


class Index:
    """The published best schedules of one hardware, for microsecond lookups.

    Args:
        root: the store root (see :class:`~tunecache.cache.store.Store`), or a Location.
        hw_id: the hardware to serve.
        codegen_version: only entries measured with this codegen version are served.
        compiler: when given (a compiler identity), only entries measured with a compiler
            of the same family and major version (:func:`compiler_key`); otherwise the
            fastest entry over all compilers.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location | None,
        hw_id: str,
        codegen_version: str = CODEGEN_VERSION,
        compiler: str | None = None,
        *,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        self.location = resolve(root, filesystem)
        self.hw_id = check_part("hw_id", hw_id)
        self.codegen_version = codegen_version
        self.compiler = compiler
        self.snapshot: str | None = None
        self.ignored = 0
        self._pos: dict[str, int] = {}
        self._memo: dict[str, IndexEntry] = {}
        self._load()

    def _load(self) -> None:
        """Read and verify the current snapshot; build the columns, or take those built
        from the same bytes (same hardware, codegen and compiler) earlier in this process."""
        try:
            data = fs.read_bytes(self.location, paths.pointer_path(self.hw_id))
            if data is None:
                return
            from tunecache.cache.store import Pointer, check_snapshot_bytes

            pointer = Pointer.from_json(data)
            content = fs.read_bytes(self.location,
                                    paths.snapshot_path(self.hw_id, pointer.snapshot))
            content = check_snapshot_bytes(self.hw_id, pointer, content)
            # The pointer's SHA-256 was just checked against these bytes; older pointers
            # lack it.
            digest = pointer.file_sha256 or hashlib.sha256(content).hexdigest()
            key = (digest, self.hw_id, self.codegen_version, self.compiler)
            built = _BUILT.get(key)
            if built is None:
                built = self._build(self._table(content))
                _BUILT.put(key, built)
            self._pos, self.ignored, self._columns = built
            self.snapshot = pointer.snapshot
        except (TunecacheError, OSError, pa.ArrowException) as exc:
            warnings.warn(
                f"no published schedules for {self.hw_id} in {self.location.uri}: cannot read "
                f"the current snapshot ({exc}); run `tunecache cache verify`",
                SnapshotWarning,
                stacklevel=3,
            )

    @staticmethod
    def _table(content: bytes) -> pa.Table:
        parquet = pq.ParquetFile(pa.BufferReader(content))
        missing = [c for c in _COLUMNS if c not in parquet.schema_arrow.names]
        if missing:
            raise SnapshotError(f"snapshot lacks column(s) {', '.join(missing)}")
        return parquet.read(columns=_COLUMNS)

    def _build(self, table: pa.Table) -> _Snapshot:
        total = table.num_rows
        keep = pc.and_(
            pc.less_equal(table["snapshot_version"], SNAPSHOT_VERSION),
            pc.and_(pc.equal(table["hw_id"], self.hw_id),
                    pc.equal(table["codegen_version"], self.codegen_version)),
        )
        if self.compiler is not None:
            want = compiler_key(self.compiler)
            same = [c for c in pc.unique(table["compiler"]).to_pylist()
                    if c is not None and compiler_key(c) == want]
            keep = pc.and_(keep, pc.is_in(table["compiler"], pa.array(same, pa.string())))
        keep = pc.and_(keep, pc.and_(pc.is_finite(table["median_s"]),
                                     pc.is_valid(table["record_id"])))
        table = table.filter(pc.fill_null(keep, False))
        schedules, codes = _parse_schedules(table["schedule_json"], table["schedule_id"])
        table = table.append_column("_schedule", codes).filter(pc.is_valid(codes))
        # With several compilers per op, the fastest wins; then compiler name, for determinism.
        table = table.take(pc.sort_indices(
            table, [("median_s", "ascending"), ("compiler", "ascending")]))
        texts = table["op_text"].to_pylist()
        pos: dict[str, int] = {}
        for i, text in enumerate(texts):
            pos.setdefault(text, i)
        rows = np.fromiter(sorted(pos.values()), dtype=np.int64, count=len(pos))
        table = table.take(rows)
        columns = _Columns(table, schedules, self.codegen_version)
        return _Snapshot(dict(zip((texts[r] for r in rows), columns.keys(), strict=True)),
                         total - table.num_rows, columns)

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, op: OpSignature) -> bool:
        return op.text in self._pos

    def lookup(self, op: OpSignature) -> IndexEntry | None:
        """The published entry for ``op``, or None on a miss."""
        return self.lookup_text(op.text)

    def lookup_text(self, text: str) -> IndexEntry | None:
        """The published entry for the op with canonical text ``text``, or None."""
        # The key first: an exact miss (then the nearest hardware's index is asked) costs
        # one probe.
        key = self._pos.get(text)
        if key is None:
            return None
        entry = self._memo.get(text)
        if entry is not None:
            return entry
        c = self._columns
        row = key >> c.row_shift
        entry = _new_tuple(IndexEntry, (
            text, c.schedules[(key >> c.schedule_shift) & c.schedule_mask], c.median[row],
            (key >> c.n_shift) & c.n_mask, c.sources[key & c.source_mask], row, c))
        if len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
        self._memo[text] = entry
        return entry

    def ops(self) -> list[str]:
        """The op texts this index serves."""
        return list(self._pos)
