"""Deploy-time lookups: the current published snapshot of one hardware, in memory.

:class:`Index` reads the snapshot once and keeps its columns as compact numpy arrays (about
a hundred bytes per entry plus a dict from op text to row), so opening costs milliseconds
and :meth:`Index.lookup` builds its :class:`IndexEntry` in a few microseconds without
parsing JSON. Matmul schedules are rebuilt from the snapshot's typed knob columns (which
``publish`` derived from schedules it validated with ``schedule_from_json``); other schedule
families are parsed from their JSON with ``schedule_from_json`` on lookup.

Rows are ignored, never served, when their snapshot version is newer than this code reads,
their codegen version differs from the running one, their compiler identity differs from
the one asked for (when one is), or their schedule columns are incomplete. A missing or
damaged snapshot gives an empty index and a warning: a deploy then simply misses.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tunecache.cache import fs, paths
from tunecache.cache.errors import SnapshotError
from tunecache.cache.publish import SNAPSHOT_VERSION
from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import (
    LOOP_ORDERS,
    PARALLEL_AXES,
    MatmulSchedule,
    Schedule,
    schedule_from_json,
)
from tunecache.datasets.location import Location, resolve
from tunecache.datasets.paths import check_part
from tunecache.datasets.schema import KNOB_COLUMNS

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_COLUMNS = [
    "snapshot_version", "hw_id", "op_text", "codegen_version", "compiler", "schedule_family",
    "schedule_json", *KNOB_COLUMNS, "loop_order", "parallel", "median_s", "min_s", "gflops",
    "n_measurements", "source", "job_id", "host", "record_id", "measured_at",
]


class SnapshotWarning(UserWarning):
    """The current snapshot could not be read; the index is empty."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """The published best schedule of one op, with its measured latency and provenance."""

    op_text: str
    schedule: Schedule
    median_s: float
    min_s: float | None
    gflops: float | None
    n_measurements: int
    codegen_version: str
    compiler: str | None
    source: str | None
    job_id: str | None
    host: str | None
    record_id: str
    measured_at: datetime


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
        return self._data[self._offsets[i]:self._offsets[i + 1]].decode()

    def nbytes(self) -> int:
        return len(self._data) + self._offsets.nbytes + self._valid.nbytes


class _Codes:
    """A low-cardinality string column as int32 codes into a tuple of values."""

    __slots__ = ("_codes", "_values")

    def __init__(self, array: pa.Array) -> None:
        encoded = pc.dictionary_encode(array).combine_chunks() \
            if isinstance(array, pa.ChunkedArray) else pc.dictionary_encode(array)
        self._values: tuple[str | None, ...] = (*encoded.dictionary.to_pylist(), None)
        null_code = len(self._values) - 1
        self._codes = pc.fill_null(encoded.indices, null_code).to_numpy().astype(np.int32)

    def get(self, i: int) -> str | None:
        return self._values[self._codes[i]]

    def nbytes(self) -> int:
        return self._codes.nbytes


def _float_or_none(value: float) -> float | None:
    return None if value != value else value


class Index:
    """The published best schedules of one hardware, for microsecond lookups.

    Args:
        root: the store root (see :class:`~tunecache.cache.store.Store`), or a Location.
        hw_id: the hardware to serve.
        codegen_version: only entries measured with this codegen version are served.
        compiler: when given, only entries measured with this compiler identity; otherwise
            the fastest entry over all compilers.
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
        table = self._read()
        if table is not None:
            self._build(table)

    def _read(self) -> pa.Table | None:
        try:
            data = fs.read_bytes(self.location, paths.pointer_path(self.hw_id))
            if data is None:
                return None
            from tunecache.cache.store import Pointer

            pointer = Pointer.from_json(data)
            path = self.location.path(paths.snapshot_path(self.hw_id, pointer.snapshot))
            with self.location.fs.open_input_file(path) as handle:
                parquet = pq.ParquetFile(handle)
                missing = [c for c in _COLUMNS if c not in parquet.schema_arrow.names]
                if missing:
                    raise SnapshotError(f"snapshot lacks column(s) {', '.join(missing)}")
                table = parquet.read(columns=_COLUMNS)
            self.snapshot = pointer.snapshot
            return table
        except (TunecacheError, OSError, pa.ArrowException) as exc:
            warnings.warn(
                f"no published schedules for {self.hw_id} in {self.location.uri}: cannot read "
                f"the current snapshot ({exc}); run `tunecache cache verify`",
                SnapshotWarning,
                stacklevel=3,
            )
            return None

    def _build(self, table: pa.Table) -> None:
        total = table.num_rows
        keep = pc.and_(
            pc.less_equal(table["snapshot_version"], SNAPSHOT_VERSION),
            pc.and_(pc.equal(table["hw_id"], self.hw_id),
                    pc.equal(table["codegen_version"], self.codegen_version)),
        )
        if self.compiler is not None:
            keep = pc.and_(keep, pc.equal(table["compiler"], self.compiler))
        matmul = pc.equal(table["schedule_family"], "matmul")
        knobs_ok = pc.and_(
            pc.is_in(table["loop_order"], pa.array(LOOP_ORDERS)),
            pc.is_in(table["parallel"], pa.array(PARALLEL_AXES)),
        )
        for name in KNOB_COLUMNS:
            knobs_ok = pc.and_(knobs_ok, pc.is_valid(table[name]))
        usable = pc.or_(pc.and_(matmul, knobs_ok),
                        pc.and_(pc.invert(matmul), pc.is_valid(table["schedule_json"])))
        keep = pc.and_(keep, usable)
        keep = pc.and_(keep, pc.and_(pc.is_finite(table["median_s"]),
                                     pc.is_valid(table["record_id"])))
        table = table.filter(pc.fill_null(keep, False))
        # With several compilers per op, the fastest wins; then compiler name, for determinism.
        table = table.take(pc.sort_indices(
            table, [("median_s", "ascending"), ("compiler", "ascending")]))
        texts = table["op_text"].to_pylist()
        pos: dict[str, int] = {}
        for i, text in enumerate(texts):
            pos.setdefault(text, i)
        rows = np.fromiter(sorted(pos.values()), dtype=np.int64, count=len(pos))
        table = table.take(rows)
        self._pos = {text: i for i, text in enumerate(texts[r] for r in rows)}
        self.ignored = total - table.num_rows

        self._knobs = np.column_stack([
            pc.fill_null(table[name], 0).to_numpy().astype(np.int32) for name in KNOB_COLUMNS
        ]) if table.num_rows else np.zeros((0, len(KNOB_COLUMNS)), np.int32)
        self._loop_order = _Codes(table["loop_order"])
        self._parallel = _Codes(table["parallel"])
        self._matmul = pc.fill_null(pc.equal(table["schedule_family"], "matmul"),
                                    False).to_numpy(zero_copy_only=False).astype(bool)
        self._json = None if bool(self._matmul.all()) else _Strings(table["schedule_json"])
        self._median = table["median_s"].to_numpy().astype(np.float64)
        self._min = pc.fill_null(table["min_s"], np.nan).to_numpy().astype(np.float64)
        self._gflops = pc.fill_null(table["gflops"], np.nan).to_numpy().astype(np.float64)
        self._n = pc.fill_null(table["n_measurements"], 0).to_numpy().astype(np.int32)
        self._compiler = _Codes(table["compiler"])
        self._source = _Codes(table["source"])
        self._job = _Codes(table["job_id"])
        self._host = _Codes(table["host"])
        self._record_id = _Strings(table["record_id"])
        self._measured = pc.cast(table["measured_at"], pa.int64()).to_numpy()

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, op: OpSignature) -> bool:
        return op.text in self._pos

    def lookup(self, op: OpSignature) -> IndexEntry | None:
        """The published entry for ``op``, or None on a miss."""
        i = self._pos.get(op.text)
        if i is None:
            return None
        schedule: Schedule
        if self._matmul[i]:
            mr, nr, kc, mc, nc, pack_a, pack_b, unroll, threads = self._knobs[i].tolist()
            schedule = MatmulSchedule(mr, nr, kc, mc, nc, pack_a, pack_b,
                                      self._loop_order.get(i) or "", unroll, threads,
                                      self._parallel.get(i) or "")
        else:
            assert self._json is not None
            try:
                schedule = schedule_from_json(self._json.get(i) or "")
            except TunecacheError:
                return None
        return IndexEntry(
            op_text=op.text,
            schedule=schedule,
            median_s=float(self._median[i]),
            min_s=_float_or_none(float(self._min[i])),
            gflops=_float_or_none(float(self._gflops[i])),
            n_measurements=int(self._n[i]),
            codegen_version=self.codegen_version,
            compiler=self._compiler.get(i),
            source=self._source.get(i),
            job_id=self._job.get(i),
            host=self._host.get(i),
            record_id=self._record_id.get(i) or "",
            measured_at=_EPOCH + timedelta(microseconds=int(self._measured[i])),
        )

    def ops(self) -> list[str]:
        """The op texts this index serves."""
        return list(self._pos)
