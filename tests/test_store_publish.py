"""Publishing (the best-of rule), snapshots, rollback and the deploy-time Index."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pyarrow as pa
import pytest

from tunecache.cache.index import Index, SnapshotWarning
from tunecache.cache.publish import SNAPSHOT_VERSION, best_of, snapshot_digest
from tunecache.cache.store import Store, StoreError
from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.records import Record, records_to_table

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
OP = matmul_op(256, 256, 256)
OP2 = batch_matmul_op(8, 64, 64, 64, trans_b=True)
A = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=1024)
B = MatmulSchedule(mr=4, nr=16, kc=128, mc=64, nc=512)
C = MatmulSchedule(mr=4, nr=8, kc=128, mc=64, nc=512, threads=2)


def rec(op: OpSignature, schedule: MatmulSchedule, median: float, **kw: object) -> Record:
    return Record.create(op=op, hw=HW, schedule=schedule, status=kw.pop("status", "ok"),
                         median_s=median, runtimes_s=[median], **kw)


def test_median_of_repeats_beats_one_lucky_run():
    records = [rec(OP, A, m) for m in (1.0, 1.1, 0.2, 1.05, 1.2)]  # A: median 1.05
    records += [rec(OP, B, m) for m in (0.9, 0.95)]  # B: median 0.925
    records += [rec(OP, C, 0.01, status="wrong_result")]  # failures never win
    snapshot = best_of(records_to_table(records))
    assert snapshot.num_rows == 1
    row = snapshot.to_pylist()[0]
    assert row["schedule_id"] == B.schedule_id
    assert row["median_s"] == pytest.approx(0.925)
    assert row["n_measurements"] == 2
    assert row["op_text"] == OP.text
    assert row["schedule_family"] == "matmul"
    assert row["schedule_json"] == B.to_json()


def test_ties_break_by_schedule_id_and_result_is_order_independent():
    records = [rec(OP, A, 1.0), rec(OP, B, 1.0), rec(OP2, A, 2.0), rec(OP2, C, 3.0)]
    expected = min(A.schedule_id, B.schedule_id)
    digests = set()
    for seed in range(4):
        shuffled = records[:]
        random.Random(seed).shuffle(shuffled)
        snapshot = best_of(records_to_table(shuffled))
        assert snapshot.filter(pa.compute.equal(snapshot["op_id"], OP.op_id))[
            "schedule_id"].to_pylist() == [expected]
        digests.add(snapshot_digest(snapshot))
    assert len(digests) == 1


D = MatmulSchedule(mr=6, nr=16, kc=512, mc=72, nc=1024)


def test_a_schedule_timed_again_in_slow_phases_still_beats_one_timed_once_in_a_fast_one(
        tmp_path):
    # A fast job times A at 1.00 and B at 1.03; two later jobs, in a 25% slower phase of the
    # machine, time A again (and D, which links them) but not B. Raw medians would serve B.
    timed = [("fast", A, 1.00), ("fast", B, 1.03), ("fast", D, 1.10)]
    timed += [(job, s, t * 1.25) for job in ("slow1", "slow2")
              for s, t in ((A, 1.00), (D, 1.10), (C, 1.40))]
    store = Store(tmp_path)
    store.append([rec(OP, s, t, job_id=job) for job, s, t in timed])
    store.publish()
    entry = Index(tmp_path, HW.hw_id).lookup(OP)
    assert entry is not None
    assert entry.schedule == A
    assert entry.median_s == pytest.approx(1.25)  # the published latency stays the raw median
    assert entry.n_measurements == 3
    # The same measurements without the jobs that link them: raw medians rank B first.
    plain = [rec(OP, s, t) for _, s, t in timed]
    assert best_of(records_to_table(plain))["schedule_id"].to_pylist() == [B.schedule_id]


def test_job_phases_are_fitted_only_from_schedules_jobs_share():
    from tunecache.cache.phases import job_phases
    from tunecache.cache.publish import GROUP_KEYS

    records = [rec(OP, A, 1.0, job_id="j1"), rec(OP, D, 2.0, job_id="j1"),
               rec(OP, A, 1.5, job_id="j2"), rec(OP, D, 3.0, job_id="j2"),
               rec(OP, B, 0.9, job_id="j3"),  # a job of one schedule: no phase
               rec(OP2, A, 5.0, job_id="j1"), rec(OP2, A, 9.0)]  # another group; no job
    df = records_to_table(records).to_pandas()
    phases = dict(zip(zip(df["op_id"], df["job_id"].fillna("-"), df["median_s"],
                          strict=True),
                      job_phases(df, GROUP_KEYS), strict=True))
    ratio = np.exp(phases[(OP.op_id, "j2", 1.5)] - phases[(OP.op_id, "j1", 1.0)])
    assert ratio == pytest.approx(1.5)
    assert phases[(OP.op_id, "j1", 1.0)] == phases[(OP.op_id, "j1", 2.0)]
    assert phases[(OP.op_id, "j3", 0.9)] == 0.0
    assert phases[(OP2.op_id, "j1", 5.0)] == 0.0
    assert phases[(OP2.op_id, "-", 9.0)] == 0.0


def test_one_row_per_codegen_version_and_compiler():
    records = [rec(OP, A, 1.0, compiler="gcc"), rec(OP, B, 2.0, compiler="clang"),
               rec(OP, C, 0.5, compiler="gcc", codegen_version="0")]
    snapshot = best_of(records_to_table(records))
    rows = {(r["codegen_version"], r["compiler"]): r["schedule_id"] for r in snapshot.to_pylist()}
    assert rows == {(CODEGEN_VERSION, "gcc"): A.schedule_id,
                    (CODEGEN_VERSION, "clang"): B.schedule_id, ("0", "gcc"): C.schedule_id}


def test_malformed_winner_is_skipped_for_the_next_best():
    table = records_to_table([rec(OP, A, 1.0), rec(OP, B, 2.0)])
    col = table.schema.get_field_index("schedule_json")
    hacked = [json.dumps({"family": "matmul", "mr": "__import__('os')"}), B.to_json()]
    order = table["schedule_id"].to_pylist()
    table = table.set_column(col, "schedule_json",
                             pa.array(hacked if order[0] == A.schedule_id else hacked[::-1]))
    with pytest.warns(UserWarning, match="not publishing"):
        snapshot = best_of(table)
    assert snapshot["schedule_id"].to_pylist() == [B.schedule_id]


def test_publish_rollback_and_index(tmp_path):
    store = Store(tmp_path)
    store.append([rec(OP, A, 2.0, source="tiler", job_id="n1"), rec(OP2, A, 1.0)])
    first = store.publish()[0]
    assert first.changed
    assert first.entries == 2
    assert not store.publish()[0].changed  # same records: same snapshot, nothing written
    time.sleep(0.002)
    store.append([rec(OP, B, 1.0, source="model", job_id="n2")])
    second = store.publish()[0]
    assert second.changed
    assert second.snapshot > first.snapshot
    assert store.snapshots(HW.hw_id) == [first.snapshot, second.snapshot]

    index = Index(tmp_path, HW.hw_id)
    assert len(index) == 2
    assert index.snapshot == second.snapshot
    entry = index.lookup(OP)
    assert entry is not None
    assert entry.schedule == B
    assert entry.median_s == 1.0
    assert (entry.source, entry.job_id, entry.codegen_version) == ("model", "n2", CODEGEN_VERSION)
    assert entry.n_measurements == 1
    assert entry.host
    assert len(entry.record_id) == 32
    bmm = index.lookup(OP2)
    assert bmm is not None
    assert bmm.schedule == A
    assert index.lookup(matmul_op(1, 2, 3)) is None

    pointer = store.rollback(HW.hw_id)
    assert pointer.snapshot == first.snapshot
    rolled = Index(tmp_path, HW.hw_id).lookup(OP)
    assert rolled is not None
    assert rolled.schedule == A
    with pytest.raises(StoreError, match="no snapshot older"):
        store.rollback(HW.hw_id)
    store.rollback(HW.hw_id, to=second.snapshot)
    assert store.current(HW.hw_id).snapshot == second.snapshot  # type: ignore[union-attr]
    with pytest.raises(StoreError):
        store.rollback(HW.hw_id, to="snapshot-20990101T000000000000Z-0123456789abcdef.parquet")
    with pytest.raises(StoreError):
        store.rollback(HW.hw_id, to="../../records")


def test_index_ignores_what_it_cannot_honour(tmp_path):
    store = Store(tmp_path)
    store.append([rec(OP, A, 1.0, compiler="gcc"), rec(OP, B, 0.5, compiler="clang"),
                  rec(OP2, C, 0.1, codegen_version="999")])
    store.publish()
    assert Index(tmp_path, HW.hw_id).lookup(OP).schedule == B  # type: ignore[union-attr]
    gcc = Index(tmp_path, HW.hw_id, compiler="gcc")
    assert gcc.lookup(OP).schedule == A  # type: ignore[union-attr]
    assert gcc.lookup(OP2) is None  # measured with another codegen version
    assert Index(tmp_path, HW.hw_id, codegen_version="999").lookup(OP2) is not None
    assert len(Index(tmp_path, HW.hw_id, compiler="icc")) == 0
    assert len(Index(tmp_path, "other-hw")) == 0  # nothing published: empty, no warning


def test_index_skips_rows_from_a_newer_snapshot_version(tmp_path):
    store = Store(tmp_path)
    store.append([rec(OP, A, 1.0), rec(OP2, A, 1.0)])
    store.publish()
    current = store.current(HW.hw_id)
    assert current is not None
    path = tmp_path / "published" / HW.hw_id / current.snapshot
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    versions = pa.array([SNAPSHOT_VERSION, SNAPSHOT_VERSION + 1], pa.int16())
    pq.write_table(table.set_column(0, "snapshot_version", versions), path)
    store.rollback(HW.hw_id, to=current.snapshot)  # re-point: CURRENT pins the file's digest
    index = Index(tmp_path, HW.hw_id)
    assert len(index) == 1
    assert index.ignored == 1


def test_a_snapshot_is_built_once_per_process_and_still_checked_on_every_open(
        tmp_path, monkeypatch):
    """A model planned at many shapes opens the same index for each: the columns built
    from one snapshot's bytes are reused, a new publish is seen, and bytes damaged after
    the first open are still refused."""
    store = Store(tmp_path)
    store.append([rec(OP, A, 1.0)])
    store.publish()
    builds = []
    real = Index._build
    monkeypatch.setattr(Index, "_build", lambda self, table: (builds.append(1),
                                                              real(self, table))[1])
    assert Index(tmp_path, HW.hw_id).lookup(OP).schedule == A  # type: ignore[union-attr]
    built = len(builds)
    again = Index(tmp_path, HW.hw_id)
    assert len(builds) == built and again.lookup(OP).schedule == A  # type: ignore[union-attr]
    assert again.lookup(OP2) is None
    store.append([rec(OP2, B, 1.0)])
    store.publish()
    newer = Index(tmp_path, HW.hw_id)
    assert len(builds) == built + 1
    assert newer.lookup(OP2).schedule == B  # type: ignore[union-attr]
    current = store.current(HW.hw_id)
    assert current is not None
    snapshot = tmp_path / "published" / HW.hw_id / current.snapshot
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    with pytest.warns(SnapshotWarning, match="cannot read"):
        assert Index(tmp_path, HW.hw_id).lookup(OP) is None


def test_kept_columns_are_bounded_by_snapshots_and_entries():
    from tunecache.cache.index import _Built, _Snapshot

    def snapshot(entries: int) -> _Snapshot:
        return _Snapshot({str(i): i for i in range(entries)}, 0, None)  # type: ignore[arg-type]

    kept = _Built(size=2, entries=10)
    for name, entries in (("a", 4), ("b", 4), ("c", 4)):
        kept.put((name,), snapshot(entries))
    assert kept.get(("a",)) is None and kept.get(("b",)) and kept.get(("c",))
    kept.put(("huge",), snapshot(50))  # alone over the bound: kept
    assert kept.get(("huge",)) and kept.get(("b",)) is None and kept.get(("c",)) is None


def test_damaged_or_hostile_snapshots_give_an_empty_index(tmp_path):
    store = Store(tmp_path)
    store.append([rec(OP, A, 1.0)])
    store.publish()
    pointer_file = tmp_path / "published" / HW.hw_id / "CURRENT"
    snapshot = tmp_path / "published" / HW.hw_id / store.current(HW.hw_id).snapshot  # type: ignore[union-attr]
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    with pytest.warns(SnapshotWarning, match="cannot read"):
        assert Index(tmp_path, HW.hw_id).lookup(OP) is None
    assert not store.verify().ok
    pointer_file.write_text(json.dumps({"snapshot": "../../records/x.parquet", "digest": "",
                                        "entries": 1, "published_at": ""}))
    with pytest.warns(SnapshotWarning, match="not a snapshot name"):
        assert len(Index(tmp_path, HW.hw_id)) == 0
    pointer_file.write_text("{not json")
    with pytest.warns(SnapshotWarning, match="damaged snapshot pointer"):
        assert len(Index(tmp_path, HW.hw_id)) == 0
    with pytest.warns(UserWarning, match="damaged pointer"):
        store.publish()  # a new publish repairs it
    assert Index(tmp_path, HW.hw_id).lookup(OP) is not None


def test_packed_keys_serve_every_field_of_every_row(tmp_path):
    """Lookups read a row's schedule, measurement count and source from one packed int: for
    ops of varied counts, sources and schedules each field equals the snapshot's, also when
    the fields need more than 63 bits (Python ints, not numpy's)."""
    import copy

    import pyarrow.parquet as pq

    rng = random.Random(5)
    sources = ["tiler", "model", "explore", "refine", "manual", "exhaustive"]
    ops = [matmul_op(8 + i, 16, 32) for i in range(120)]
    records = [rec(op, rng.choice([A, B, C]), 1.0 + rng.random(), source=rng.choice(sources))
               for op in ops for _ in range(rng.randint(1, 9))]
    store = Store(tmp_path)
    store.append(records)
    store.publish()
    pointer = store.current(HW.hw_id)
    assert pointer is not None
    table = pq.read_table(tmp_path / "published" / HW.hw_id / pointer.snapshot).to_pylist()
    index = Index(tmp_path, HW.hw_id)
    wide = copy.copy(index._columns)
    wide.row_shift += 64  # rows above bit 63: the keys are built without numpy
    wide_index = copy.copy(index)
    wide_index._memo = {}
    wide_index._pos = dict(zip(index._pos, wide.keys(), strict=True))
    wide_index._columns = wide
    assert max(wide_index._pos.values()) >= 1 << 64
    for served in (index, wide_index):
        for row in table:
            entry = served.lookup(OpSignature.parse(row["op_text"]))
            assert entry is not None
            assert entry.schedule.schedule_id == row["schedule_id"]
            assert (entry.median_s, entry.n_measurements, entry.source) == \
                (row["median_s"], row["n_measurements"], row["source"])
            assert entry.record_id == row["record_id"]
    assert len({row["n_measurements"] for row in table}) >= 3  # counts of varied width
