"""Record values, the canonical schema, path-part validation and schema evolution."""

from __future__ import annotations

import types
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.datasets import SCHEMA, SCHEMA_VERSION, PathPartError, SchemaError
from tunecache.datasets.paths import check_part, parse_partition, partition_dir
from tunecache.datasets.records import Record, records_from_table, records_to_table
from tunecache.datasets.schema import FILE_SCHEMA, REQUIRED_COLUMNS, conform

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
OP = matmul_op(128, 256, 64, epilogue="bias")
SCHED = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=1024)


def test_schema_has_every_column_group_and_version():
    assert SCHEMA_VERSION == 2
    assert SCHEMA.metadata[b"tunecache.schema_version"] == b"2"
    for name in ("record_id", "timestamp", "schema_version", "hw_id", "hw_json", "op_kind",
                 "op_id", "op_text", "dim_batch", "dim_m", "schedule_json", "schedule_id",
                 "mr", "loop_order", "parallel", "compiler", "flags", "codegen_version",
                 "source_hash", "status", "error", "runtimes_s", "median_s", "min_s",
                 "gflops", "compile_s", "job_id", "host", "source", "predicted",
                 "model_version"):
        assert name in SCHEMA.names
    assert set(REQUIRED_COLUMNS) == {"record_id", "timestamp", "schema_version", "hw_id",
                                     "op_kind", "op_id", "op_text", "status"}
    assert SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert SCHEMA.field("runtimes_s").type == pa.list_(pa.float64())
    assert "hw_id" not in FILE_SCHEMA.names
    assert "op_kind" not in FILE_SCHEMA.names


def test_create_fills_identity_dims_knobs_and_outcome():
    record = Record.create(op=OP, hw=HW, schedule=SCHED, status="ok",
                           runtimes_s=[3e-3, 1e-3, 2e-3], source="tiler", job_id="j1")
    assert len(record.record_id) == 32
    assert record.timestamp.tzinfo is not None
    assert (record.hw_id, record.hw_isa, record.hw_cores) == (HW.hw_id, "avx2", 4)
    assert HardwareSpec.from_json(record.hw_json or "") == HW
    assert (record.op_kind, record.op_id, record.op_text) == ("matmul", OP.op_id, OP.text)
    assert (record.dim_batch, record.dim_m, record.dim_n, record.dim_k) == (None, 128, 256, 64)
    assert record.schedule_id == SCHED.schedule_id
    assert record.schedule_json == SCHED.to_json()
    assert (record.mr, record.nr, record.kc, record.loop_order) == (6, 16, 256, "jpi")
    assert record.median_s == 2e-3
    assert record.min_s == 1e-3
    assert record.gflops == pytest.approx(OP.flops / 2e-3 / 1e9)
    batch = Record.create(op=batch_matmul_op(8, 16, 16, 16), hw="h-1",
                          status="timeout")
    assert batch.dim_batch == 8
    assert batch.hw_isa is None
    assert batch.median_s is None


def test_record_rejects_bad_status_unsafe_hw_id_and_naive_time():
    with pytest.raises(SchemaError, match="status"):
        Record.create(op=OP, hw=HW, status="great")
    with pytest.raises(PathPartError):
        Record.create(op=OP, hw="../../etc", status="ok")
    with pytest.raises(SchemaError, match="timezone"):
        Record.create(op=OP, hw=HW, status="ok", timestamp=datetime(2024, 1, 1))


def test_table_round_trip():
    records = [
        Record.create(op=OP, hw=HW, schedule=SCHED, status="ok", runtimes_s=[1e-3]),
        Record.create(op=OP, hw=HW, status="compile_error", error="boom", compiler="gcc"),
    ]
    table = records_to_table(records)
    assert table.schema.equals(SCHEMA, check_metadata=True)
    assert records_from_table(table) == records


@pytest.mark.parametrize("value", ["", "..", "a/b", "a\\b", ".hidden", "x=1", "a..b",
                                   "x" * 129, "sp ace", "-lead", "nul\x00"])
def test_unsafe_path_parts_are_refused(value):
    with pytest.raises(PathPartError):
        check_part("hw_id", value)


def test_safe_path_parts_and_partitions():
    assert check_part("hw_id", HW.hw_id) == HW.hw_id
    assert partition_dir("h-1", "matmul") == "records/hw_id=h-1/op_kind=matmul"
    assert parse_partition("hw_id=h-1/op_kind=matmul") == ("h-1", "matmul")
    assert parse_partition("hw_id=../op_kind=matmul") is None
    assert parse_partition("hw_id=a/b/op_kind=matmul") is None
    with pytest.raises(PathPartError):
        partition_dir("h/1", "matmul")
    with pytest.raises(PathPartError):
        check_part("hw_id", 3)


def test_conform_fills_older_and_drops_newer_columns():
    old = pa.table({
        "record_id": ["a"], "timestamp": pa.array([datetime(2024, 1, 1, tzinfo=timezone.utc)]),
        "schema_version": pa.array([0], pa.int64()), "hw_id": ["h"], "op_kind": ["matmul"],
        "op_id": ["x"], "op_text": ["t"], "status": ["ok"], "median_s": [1.0],
        "mr": pa.array([6], pa.int64()), "future_column": [1],
    })
    table = conform(old)
    assert table.schema.equals(SCHEMA)
    row = table.to_pylist()[0]
    assert row["mr"] == 6
    assert row["gflops"] is None
    assert "future_column" not in row
    with pytest.raises(SchemaError, match="status"):
        conform(old.drop_columns(["status"]))
    with pytest.raises(SchemaError, match="null"):
        conform(old.set_column(0, "record_id", pa.array([None], pa.string())))


def test_file_metadata_carries_schema_version(tmp_path):
    from tunecache.datasets.io import fragment_bytes

    data = fragment_bytes(records_to_table([Record.create(op=OP, hw=HW, status="ok")]))
    path = tmp_path / "f.parquet"
    path.write_bytes(data.to_pybytes())
    assert pq.read_schema(path).metadata[b"tunecache.schema_version"] == b"2"


def test_a_listing_survives_a_directory_appearing_mid_walk() -> None:
    """A reader polling a store while a writer creates its first partition can see a
    directory vanish or appear between two steps of the walk: the listing is tried again."""
    import pyarrow.fs as pafs

    from tunecache.datasets import io as store_io

    class Flaky:
        calls = 0

        def get_file_info(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
            self.calls += 1
            if self.calls < 3:
                raise FileNotFoundError(f"Cannot list directory {selector.base_dir!r}")
            return [pafs.FileInfo(f"{selector.base_dir}/x", pafs.FileType.File)]

    flaky = Flaky()
    found = store_io._walk(types.SimpleNamespace(fs=flaky, local=False), "root/records")  # type: ignore[arg-type]
    assert [i.path for i in found] == ["root/records/x"] and flaky.calls == 3

    class Gone:
        def get_file_info(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
            raise FileNotFoundError("Cannot list directory")

    with pytest.raises(FileNotFoundError):
        store_io._walk(types.SimpleNamespace(fs=Gone(), local=False), "root/records")  # type: ignore[arg-type]


def test_parquet_bytes_are_read_without_arrow_keeping_the_callers_bytes(monkeypatch) -> None:
    """A scan's worker thread may drop its last reference to the input after
    ``pq.read_table`` returns; over Python bytes that needs the GIL, and at interpreter exit
    it aborted ``cache verify`` (apache/arrow#34314). The reader hands Arrow a copy, never
    the caller's memory, and it reads like ``pq.read_table`` (schema and errors included)."""
    from tunecache.datasets.io import read_parquet_bytes

    table = pa.table({"op_text": ["a", "b"], "count": pa.array([3, 4], pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    handed: list[int] = []
    real = pq.read_table

    def spy(source, **kwargs):  # type: ignore[no-untyped-def]
        handed.append(source.read_buffer().address)
        source.seek(0)
        return real(source, **kwargs)

    monkeypatch.setattr(pq, "read_table", spy)
    assert read_parquet_bytes(data).equals(table)
    assert handed and handed[0] != pa.py_buffer(data).address
    narrow = pa.schema([pa.field("count", pa.int64())])
    assert read_parquet_bytes(data, narrow).column_names == ["count"]
    with pytest.raises(pa.ArrowInvalid):
        read_parquet_bytes(b"PAR1 not parquet")
