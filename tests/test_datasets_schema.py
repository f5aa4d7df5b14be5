"""Record schema v2: columns derived from the kind registry, v1 files, kind-agnostic store."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tunecache.cache import paths
from tunecache.cache.index import Index
from tunecache.cache.publish import SNAPSHOT_VERSION, best_of, snapshot_bytes, snapshot_digest
from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import OpKind, all_kinds, op_kind
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import KindSpec, OpSignature
from tunecache.compiler.schedule import ScheduleData, knob_types
from tunecache.datasets import SchemaError
from tunecache.datasets.io import dedup, load
from tunecache.datasets.paths import new_fragment_name, partition_dir
from tunecache.datasets.records import Record, records_from_table, records_to_table
from tunecache.datasets.schema import (
    DIM_COLUMNS,
    FIXED_COLUMNS,
    KNOB_COLUMNS,
    PARTITION_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION_KEY,
    V1_COLUMNS,
    build_layout,
    conform,
)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "measurements.parquet"
HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
MM = matmul_op(64, 64, 64)
CONV = conv2d_op(1, 16, 8, 8, 32, 3, 3, pads=1)
MM_S = MatmulSchedule(mr=6, nr=16, kc=64, mc=48, nc=64)
CONV_S = Conv2dSchedule(oc_block=16, ow_block=4, ic_block=16)


# -- the schema --------------------------------------------------------------------------


def test_v1_columns_come_first_with_their_names_order_and_types():
    assert SCHEMA.names[:len(V1_COLUMNS)] == [f.name for f in V1_COLUMNS]
    for old in V1_COLUMNS:
        assert SCHEMA.field(old.name).equals(old)
    assert SCHEMA.field("dim_m").type == pa.int64()
    assert SCHEMA.field("stride_h").type == pa.int32()
    assert SCHEMA.field("mr").type == pa.int32()
    assert SCHEMA.field("algorithm").type == pa.string()
    assert set(FIXED_COLUMNS) < set(SCHEMA.names)


def test_every_registered_kind_has_its_dim_and_knob_columns():
    for kind in all_kinds():
        for column in kind.dim_columns.values():
            assert column in DIM_COLUMNS
            assert pa.types.is_integer(SCHEMA.field(column).type)
        for name, py_type in knob_types(kind.schedule).items():
            assert name in KNOB_COLUMNS
            assert SCHEMA.field(name).type == (pa.int32() if py_type is int else pa.string())
    assert not set(DIM_COLUMNS) & set(KNOB_COLUMNS)


@dataclass(frozen=True, slots=True)
class _RowSchedule(ScheduleData):
    family: ClassVar[str] = "rowwise_test"
    tvec: int
    trows: int = 1
    tmode: str = "a"
    threads: int = 1


def _kind(name: str, schedule: type[ScheduleData], dim_columns: dict[str, str]) -> OpKind:
    def unused(*args: Any) -> Any:
        raise AssertionError("not called")

    return OpKind(
        name=name, spec=KindSpec(dims=tuple(dim_columns), attrs={}, epilogues=()),
        arguments=unused, flops=unused, schedule=schedule, problems=unused,
        default_schedule=unused, emit=unused, reference=unused, reduction_length=unused,
        dim_columns=dim_columns,
    )


def test_new_kinds_append_their_columns_after_the_v1_ones():
    rowwise = _kind("rowwise_test", _RowSchedule, {"M": "dim_m", "N": "dim_n", "Q": "dim_tq"})
    layout = build_layout([*all_kinds(), rowwise])
    appended = layout.schema.names[len(V1_COLUMNS):]
    assert appended[-4:] == ["dim_tq", "tvec", "trows", "tmode"]
    assert layout.schema.field("dim_tq").type == pa.int64()
    assert layout.schema.field("tvec").type == pa.int32()
    assert layout.schema.field("tmode").type == pa.string()
    assert "dim_tq" in layout.dim_columns and "tmode" in layout.knob_columns
    assert layout.schema.names.count("threads") == 1
    # Registration order does not matter: non-builtin kinds are ordered by name.
    assert build_layout([rowwise, *reversed(all_kinds())]).schema.equals(layout.schema)


def _schedule_class(family: str, **knobs: type) -> type[ScheduleData]:
    namespace: dict[str, Any] = {"__annotations__": dict(knobs), "family": family}
    namespace["__annotations__"]["family"] = ClassVar[str]
    return dataclass(frozen=True, slots=True)(type(f"S_{family}", (ScheduleData,), namespace))


@pytest.mark.parametrize(("knobs", "dims", "message"), [
    ({"threads": str}, {"M": "dim_m"}, "needs one type"),
    ({"algorithm": int}, {"M": "dim_m"}, "needs one type"),
    ({"status": int}, {"M": "dim_m"}, "fixed record column"),
    ({"vec": int}, {"M": "status"}, "fixed record column"),
    ({"vec": int}, {"M": "mr"}, "one meaning"),
    ({"dim_m": int}, {"M": "dim_n"}, "one meaning"),
])
def test_a_column_with_two_meanings_or_types_is_refused(knobs, dims, message):
    bad = _kind("bad_test", _schedule_class("bad_test", **knobs), dims)
    with pytest.raises(SchemaError, match=message):
        build_layout([*all_kinds(), bad])


@pytest.mark.parametrize(("knobs", "dims"), [
    ({"algorithm": int}, {"M": "dim_m"}),
    ({"vec": int}, {"M": "algorithm"}),
])
def test_a_version_1_column_keeps_its_type_even_unclaimed(knobs, dims):
    bad = _kind("bad_test", _schedule_class("bad_test", **knobs), dims)
    with pytest.raises(SchemaError, match="record schema has it as string"):
        build_layout([op_kind("matmul"), bad])


def test_a_kind_registered_before_import_gets_columns_end_to_end(tmp_path):
    script = textwrap.dedent(f"""
        from dataclasses import dataclass
        from typing import ClassVar
        from tunecache.compiler.kinds import OpKind, register
        from tunecache.compiler.ops import KindSpec, OpSignature
        from tunecache.compiler.schedule import ScheduleData

        @dataclass(frozen=True, slots=True)
        class RowSchedule(ScheduleData):
            family: ClassVar[str] = "rowwise_test"
            tvec: int
            trows: int = 1
            threads: int = 1

        def kind(name, columns):
            return OpKind(
                name=name, spec=KindSpec(dims=tuple(columns), attrs={{}}, epilogues=()),
                arguments=None, flops=lambda op: 2 * op.dim("M") * op.dim("N"),
                schedule=RowSchedule, problems=None, default_schedule=None, emit=None,
                reference=None, reduction_length=None, dim_columns=columns)

        register(kind("rowwise_test", {{"M": "dim_m", "N": "dim_n", "Q": "dim_tq"}}))
        from tunecache.cache.index import Index
        from tunecache.cache.store import Store
        from tunecache.datasets import SchemaError
        from tunecache.datasets.records import Record, records_from_table, records_to_table
        from tunecache.datasets.schema import SCHEMA

        assert SCHEMA.names[-3:] == ["dim_tq", "tvec", "trows"], SCHEMA.names[-3:]
        op = OpSignature("rowwise_test", (("M", 4), ("N", 8), ("Q", 2)))
        s = RowSchedule(tvec=8, trows=2)
        record = Record.create(op=op, hw="h-1", schedule=s, status="ok", runtimes_s=[1e-3])
        assert (record.dim_m, record.dim_tq, record.tvec, record.trows, record.threads) == \\
            (4, 2, 8, 2, 1)
        assert records_from_table(records_to_table([record])) == [record]
        store = Store({str(tmp_path)!r})
        store.append([record])
        store.publish()
        entry = Index({str(tmp_path)!r}, "h-1").lookup(op)
        assert entry is not None and entry.schedule == s
        assert store.verify().ok

        register(kind("late_test", {{"M": "dim_late"}}))
        try:
            Record.create(op=OpSignature("late_test", (("M", 4),)), hw="h-1", status="ok")
        except SchemaError as exc:
            assert "dim_late" in str(exc) and "registered" in str(exc)
        else:
            raise AssertionError("a kind registered after the schema got no error")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- records ------------------------------------------------------------------------------


def test_create_fills_columns_from_the_kind_and_the_schedule_knobs():
    record = Record.create(op=CONV, hw=HW, schedule=CONV_S, status="ok", runtimes_s=[1e-3])
    assert (record.dim_batch, record.dim_c, record.dim_f, record.pad_t) == (1, 16, 32, 1)
    assert (record.oc_block, record.algorithm, record.threads) == (16, "direct", 1)
    assert record.dim_m is None and record.mr is None
    assert set(record.columns) == {*op_kind("conv2d").dim_columns.values(), *CONV_S.knobs()}
    assert records_from_table(records_to_table([record])) == [record]
    with pytest.raises(AttributeError):
        _ = record.no_such_column
    with pytest.raises(SchemaError, match="unknown record column"):
        Record.create(op=MM, hw=HW, status="ok", no_such_column=1)


# -- v1 files -----------------------------------------------------------------------------

_V1_FILE_SCHEMA = pa.schema([f for f in V1_COLUMNS if f.name not in PARTITION_COLUMNS],
                            metadata={SCHEMA_VERSION_KEY: b"1"})


def _write_v1_store(root: Path) -> pa.Table:
    """The fixture's real v1 rows, written as v1 fragments (v1 columns and metadata)."""
    fixture = pq.read_table(FIXTURE)
    v1_schema = pa.schema(list(V1_COLUMNS))
    for group in fixture.group_by(["hw_id", "op_kind"]).aggregate([]).to_pylist():
        part = fixture.filter(pc.and_(pc.equal(fixture["hw_id"], group["hw_id"]),
                                      pc.equal(fixture["op_kind"], group["op_kind"])))
        part = conform(part, v1_schema).drop_columns(list(PARTITION_COLUMNS))
        directory = root / partition_dir(group["hw_id"], group["op_kind"])
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(part.cast(_V1_FILE_SCHEMA), directory / new_fragment_name())
    return fixture


def test_v1_fragments_of_real_measurements_still_load_and_publish(tmp_path):
    fixture = _write_v1_store(tmp_path)
    store = Store(tmp_path)
    table = store.scan()
    assert table.schema.equals(SCHEMA)
    assert table.num_rows == dedup(fixture).num_rows
    assert set(table["schema_version"].to_pylist()) == {1}
    assert set(table["op_dtype"].to_pylist()) == {"float32"}  # every op was, then
    by_id = {r["record_id"]: r for r in fixture.to_pylist()}
    for row in table.slice(0, 500).to_pylist():
        old = by_id[row["record_id"]]
        for name in ("op_text", "schedule_json", "status", "median_s", "loop_order"):
            assert row[name] == old[name]
        for name in ("dim_m", "dim_c", "mr", "oc_block", "stride_h"):
            assert row[name] == (None if old[name] is None else int(old[name]))
    records = records_from_table(table.slice(0, 200))
    assert all(r.op_kind == "conv2d" or r.dim_m is not None for r in records)
    assert records_to_table(records).equals(table.slice(0, 200))

    results = store.publish()
    assert results and all(r.entries for r in results)
    for result in results:
        versions = store.read_snapshot(result.hw_id)["codegen_version"].unique().to_pylist()
        index = Index(tmp_path, result.hw_id, codegen_version=versions[0])
        assert len(index) > 0
        for text in index.ops()[:50]:
            entry = index.lookup(OpSignature.parse(text))
            assert entry is not None
            assert entry.schedule.to_json() in set(fixture["schedule_json"].to_pylist())
    assert store.verify().ok


# -- snapshots and the index --------------------------------------------------------------


def _rec(op: OpSignature, schedule: ScheduleData, median: float) -> Record:
    return Record.create(op=op, hw=HW, schedule=schedule, status="ok", median_s=median,
                         runtimes_s=[median])


def test_snapshot_carries_the_schedule_only_as_family_id_and_json():
    snapshot = best_of(records_to_table([_rec(MM, MM_S, 1.0), _rec(CONV, CONV_S, 2.0)]))
    assert not set(snapshot.column_names) & set(KNOB_COLUMNS)
    rows = {r["op_text"]: r for r in snapshot.to_pylist()}
    assert rows[CONV.text]["schedule_family"] == "conv2d"
    assert rows[CONV.text]["schedule_json"] == CONV_S.to_json()
    assert set(snapshot["snapshot_version"].to_pylist()) == {SNAPSHOT_VERSION}


def test_index_serves_every_family_and_parses_each_schedule_once(tmp_path):
    other = conv2d_op(1, 16, 8, 8, 32, 1, 1)
    store = Store(tmp_path)
    store.append([_rec(MM, MM_S, 1.0), _rec(CONV, CONV_S, 2.0), _rec(other, CONV_S, 3.0)])
    store.publish()
    index = Index(tmp_path, HW.hw_id)
    assert (len(index), index.ignored) == (3, 0)
    mm, conv, conv2 = (index.lookup(op) for op in (MM, CONV, other))
    assert mm is not None and conv is not None and conv2 is not None
    assert (mm.schedule, conv.schedule) == (MM_S, CONV_S)
    assert conv.schedule is conv2.schedule
    assert index.lookup(CONV) is conv


def _forge(store: Store, tmp_path: Path, op: OpSignature, schedule_json: str) -> None:
    current = store.current(HW.hw_id)
    assert current is not None
    path = tmp_path / "published" / HW.hw_id / current.snapshot
    table = pq.read_table(path)
    forged = [schedule_json if text == op.text else js for text, js in
              zip(table["op_text"].to_pylist(), table["schedule_json"].to_pylist(), strict=True)]
    column = table.schema.get_field_index("schedule_json")
    pq.write_table(table.set_column(column, "schedule_json", pa.array(forged)), path)
    store.rollback(HW.hw_id, to=current.snapshot)  # re-point: CURRENT pins the file's digest


def test_a_row_whose_json_does_not_hash_to_its_schedule_id_is_never_served(tmp_path):
    store = Store(tmp_path)
    store.append([_rec(MM, MM_S, 1.0), _rec(CONV, CONV_S, 2.0)])
    store.publish()
    _forge(store, tmp_path, CONV, Conv2dSchedule(oc_block=8, ow_block=4, ic_block=16).to_json())
    index = Index(tmp_path, HW.hw_id)
    assert index.lookup(CONV) is None
    assert index.ignored == 1
    assert index.lookup(MM) is not None
    report = store.verify()
    assert not report.ok
    assert any("does not match schedule_id" in p for p in report.problems)
    _forge(store, tmp_path, CONV, '{"family":"conv2d","oc_block":"x"}')
    assert Index(tmp_path, HW.hw_id).lookup(CONV) is None


def test_publish_drops_a_winner_whose_json_does_not_hash_to_its_id():
    table = records_to_table([_rec(MM, MM_S, 1.0), _rec(MM, MM_S.replace(mr=4), 2.0)])
    fast = pc.equal(table["schedule_id"], MM_S.schedule_id)
    forged = pc.if_else(fast, MM_S.replace(kc=128).to_json(), table["schedule_json"])
    table = table.set_column(table.schema.get_field_index("schedule_json"), "schedule_json",
                             forged)
    with pytest.warns(UserWarning, match="does not hash to schedule_id"):
        snapshot = best_of(table)
    assert snapshot["schedule_id"].to_pylist() == [MM_S.replace(mr=4).schedule_id]


def test_index_and_verify_read_a_v1_snapshot_with_typed_knob_columns(tmp_path):
    store = Store(tmp_path)
    store.append([_rec(MM, MM_S, 1.0), _rec(CONV, CONV_S, 2.0)])
    store.publish()
    snapshot = store.read_snapshot(HW.hw_id)
    is_mm = [family == "matmul" for family in snapshot["schedule_family"].to_pylist()]
    v1 = snapshot.set_column(0, "snapshot_version", pa.array([1] * snapshot.num_rows, pa.int16()))
    for name, value in MM_S.knobs().items():
        type_ = pa.string() if isinstance(value, str) else pa.int32()
        v1 = v1.append_column(name, pa.array([value if m else None for m in is_mm], type_))
    name = paths.new_snapshot_name(snapshot_digest(v1))
    (tmp_path / "published" / HW.hw_id / name).write_bytes(snapshot_bytes(v1).to_pybytes())
    store.rollback(HW.hw_id, to=name)
    index = Index(tmp_path, HW.hw_id)
    assert index.lookup(MM).schedule == MM_S  # type: ignore[union-attr]
    assert index.lookup(CONV).schedule == CONV_S  # type: ignore[union-attr]
    assert store.read_snapshot(HW.hw_id).column_names == snapshot.column_names
    assert store.verify().ok


def test_the_op_dtype_is_a_column_for_analysts(tmp_path):
    int8 = matmul_op(16, 32, 64, dtype="int8")
    store = Store(tmp_path)
    store.append([Record.create(op=int8, hw=HW, status="ok", runtimes_s=[1e-5]),
                  Record.create(op=MM, hw=HW, status="ok", runtimes_s=[1e-5])])
    frame = load(tmp_path)
    assert sorted(frame["op_dtype"].tolist()) == ["float32", "int8"]
    assert frame.loc[frame["op_dtype"] == "int8", "op_text"].tolist() == [int8.text]
