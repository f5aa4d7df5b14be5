"""Store: appending, loading with filters, plain pandas access, damage, compaction, verify."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.datasets import DamagedFragmentWarning, PathPartError, SchemaError, load
from tunecache.datasets.location import HOME_ENV, default_root
from tunecache.datasets.records import Record, records_to_table
from tunecache.datasets.schema import SCHEMA

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
HW2 = HW.with_isa("generic")
OPS = [matmul_op(64 * i, 128, 64) for i in range(1, 4)]
BMM = batch_matmul_op(4, 32, 32, 32)
S1 = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=1024)


def _records(hw: HardwareSpec = HW, n: int = 2) -> list[Record]:
    out = []
    for op in [*OPS, BMM]:
        for i in range(n):
            out.append(Record.create(op=op, hw=hw, schedule=S1, status="ok",
                                     runtimes_s=[1e-3 * (i + 1)]))
        out.append(Record.create(op=op, hw=hw, status="compile_error", error="boom"))
    return out


def test_append_records_and_load_back(tmp_path):
    store = Store(tmp_path)
    records = _records()
    paths = store.append(records)
    assert len(paths) == 2  # one fragment per (hw_id, op_kind)
    assert all("/records/hw_id=" in p and "/op_kind=" in p for p in paths)
    df = store.load()
    assert len(df) == len(records)
    assert set(df["record_id"]) == {r.record_id for r in records}
    assert str(df["dim_batch"].dtype) == "int64[pyarrow]"
    assert df["dim_batch"].isna().sum() == 9  # plain matmul has no batch dim
    assert list(df.columns) == SCHEMA.names
    assert not [n for n in os.listdir(os.path.dirname(paths[0])) if n.startswith(".")]


def test_append_accepts_tables_and_dataframes(tmp_path):
    store = Store(tmp_path)
    table = records_to_table(_records())
    store.append(table)
    frame = records_to_table(_records()).to_pandas()
    frame["mr"] = frame["mr"].astype("float64")  # pandas turns nullable ints into floats
    store.append(frame)
    assert store.scan().num_rows == 2 * table.num_rows


def test_append_validates(tmp_path):
    store = Store(tmp_path)
    table = records_to_table(_records())
    bad_status = table.set_column(table.schema.get_field_index("status"), "status",
                                  pa.array(["great"] * table.num_rows))
    with pytest.raises(SchemaError, match="great"):
        store.append(bad_status)
    bad_hw = table.set_column(table.schema.get_field_index("hw_id"), "hw_id",
                              pa.array(["../../x"] * table.num_rows))
    with pytest.raises(PathPartError):
        store.append(bad_hw)
    with pytest.raises(SchemaError, match="status"):
        store.append(table.drop_columns(["status"]))
    assert store.fragments() == []


def test_filters(tmp_path):
    store = Store(tmp_path)
    old = Record.create(op=OPS[0], hw=HW, status="ok", runtimes_s=[1.0],
                        timestamp=datetime(2020, 1, 1, tzinfo=timezone.utc))
    store.append([*_records(), *_records(HW2), old])
    assert store.scan(hw_id=HW2.hw_id).num_rows == 12
    assert set(store.scan(op_kind="batch_matmul").column("op_kind").to_pylist()) == \
        {"batch_matmul"}
    assert store.scan(op=OPS[0]).num_rows == 7
    assert store.scan(op=OPS[0].text, hw_id=HW.hw_id).num_rows == 4
    assert store.scan(op=[OPS[0].op_id, OPS[1]]).num_rows == 13
    assert store.scan(status="compile_error").num_rows == 8
    assert store.scan(until="2021-01-01").num_rows == 1
    recent = datetime.now(timezone.utc) - timedelta(hours=1)
    assert store.scan(since=recent).num_rows == 24
    assert store.scan(columns=["op_id", "median_s"]).column_names == ["op_id", "median_s"]
    df = load(tmp_path, hw_id=HW.hw_id, status=["ok"])
    assert len(df) == 9
    assert set(df["status"]) == {"ok"}
    with pytest.raises(PathPartError):
        store.scan(hw_id="../x")


def test_plain_pandas_reads_the_records_folder(tmp_path):
    store = Store(tmp_path)
    store.append([*_records(), *_records(HW2)])
    df = pd.read_parquet(tmp_path / "records", filters=[("hw_id", "==", HW.hw_id)],
                         dtype_backend="pyarrow")
    assert len(df) == 12
    assert set(df["hw_id"].astype(str)) == {HW.hw_id}
    assert {"op_kind", "median_s", "runtimes_s"} <= set(df.columns)


def test_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert default_root() == str(tmp_path / "home")
    assert Store().root == str(tmp_path / "home")
    monkeypatch.delenv(HOME_ENV)
    assert default_root().endswith("store")


def test_damaged_fragments_are_skipped_and_reported(tmp_path):
    store = Store(tmp_path)
    store.append(_records())
    good = store.fragments()
    victim = next(f for f in good if f.op_kind == "matmul")
    data = Path(victim.path).read_bytes()
    with open(victim.path, "wb") as out:
        out.write(data[: len(data) // 2])  # truncated
    garbage = os.path.join(os.path.dirname(victim.path),
                           "part-20240101T000000000000Z-" + "0" * 32 + ".parquet")
    with open(garbage, "wb") as out:
        out.write(b"not parquet at all")
    with pytest.warns(DamagedFragmentWarning, match="damaged fragment"):
        df = store.load()
    assert set(df["op_kind"]) == {"batch_matmul"}
    report = store.verify()
    assert not report.ok
    assert {p for p, _ in report.damaged} == {victim.path, garbage}
    with pytest.warns(DamagedFragmentWarning):
        store.compact()
    assert os.path.exists(victim.path)  # left for inspection, never deleted


def test_older_and_newer_schema_files_load(tmp_path):
    store = Store(tmp_path)
    directory = tmp_path / "records" / f"hw_id={HW.hw_id}" / "op_kind=matmul"
    directory.mkdir(parents=True)
    old = pa.table({
        "record_id": ["r-old"], "timestamp": pa.array([datetime(2023, 5, 1)],
                                                      pa.timestamp("ms")),
        "schema_version": pa.array([0], pa.int16()), "op_id": [OPS[0].op_id],
        "op_text": [OPS[0].text], "status": ["ok"], "median_s": [2e-3],
    }).replace_schema_metadata({b"tunecache.schema_version": b"0"})
    pq.write_table(old, directory / ("part-20230501T000000000000Z-" + "1" * 32 + ".parquet"))
    newer = records_to_table(_records()[:1]).drop_columns(["hw_id", "op_kind"])
    newer = newer.append_column("energy_j", pa.array([0.5])).replace_schema_metadata(
        {b"tunecache.schema_version": b"2"})
    pq.write_table(newer, directory / ("part-20250501T000000000000Z-" + "2" * 32 + ".parquet"))
    df = store.load()
    assert len(df) == 2
    assert list(df.columns) == SCHEMA.names
    row = df[df["record_id"] == "r-old"].iloc[0]
    assert row["hw_id"] == HW.hw_id
    assert pd.isna(row["gflops"])
    assert row["median_s"] == 2e-3


def test_compact_merges_without_loss_or_duplicates(tmp_path):
    store = Store(tmp_path)
    ids = set()
    for _ in range(5):
        records = _records()
        ids |= {r.record_id for r in records}
        store.append(records)
    store.append(_records()[:2] * 1)  # new records
    ids = set(store.scan().column("record_id").to_pylist())
    # a crash between writing the merged fragment and deleting a source leaves duplicates:
    duplicate = store.fragments(op_kind="matmul")[0]
    copy = os.path.join(os.path.dirname(duplicate.path),
                        "part-20990101T000000000000Z-" + "f" * 32 + ".parquet")
    with open(duplicate.path, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    assert store.scan().num_rows == len(ids)
    assert store.verify().duplicate_rows > 0
    stale = tmp_path / "records" / ".leftover.parquet.abc.tmp"
    stale.write_bytes(b"partial")
    os.utime(stale, (0, 0))
    result = store.compact()
    assert result.fragments_after == 2
    assert result.temporaries_removed == 1
    assert len(store.fragments()) == 2
    table = store.scan()
    assert sorted(table.column("record_id").to_pylist()) == sorted(ids)
    report = store.verify()
    assert report.ok
    assert report.duplicate_rows == 0
    assert report.rows == len(ids)
    assert store.compact().records == 0  # nothing left to merge


def test_stats(tmp_path):
    store = Store(tmp_path)
    store.append(_records())
    store.append(_records())
    stats = store.stats()
    matmul = next(p for p in stats["partitions"] if p["op_kind"] == "matmul")
    assert matmul["fragments"] == 2
    assert matmul["rows"] == 18
    assert matmul["bytes"] > 0
    assert stats["published"] == {}
    store.publish()
    assert store.stats()["published"][HW.hw_id]["entries"] == 4
