"""Real processes: concurrent appenders + publisher + compactor + reader, and SIGKILLed writers."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from tunecache.cache.index import Index
from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.datasets.records import Record

HW = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=4, l1d_bytes=32768,
                  l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="Test CPU")
OPS = [matmul_op(64, 64 * i, 64) for i in range(1, 6)]
OPS.append(batch_matmul_op(2, 32, 32, 32))
SCHEDULES = [MatmulSchedule(mr=4, nr=16, kc=64 * k, mc=64, nc=512) for k in range(1, 4)]
APPENDERS, BATCHES, PER_BATCH = 3, 12, 30


def record_id(worker: int, batch: int, i: int) -> str:
    return f"{worker:04d}{batch:04d}{i:04d}".ljust(32, "0")


def appender(root: str, worker: int) -> None:
    store = Store(root)
    rng = random.Random(worker)
    for batch in range(BATCHES):
        records = [
            Record.create(op=OPS[(batch + i) % len(OPS)], hw=HW,
                          schedule=SCHEDULES[i % len(SCHEDULES)], status="ok",
                          runtimes_s=[rng.uniform(1e-3, 2e-3)],
                          record_id=record_id(worker, batch, i))
            for i in range(PER_BATCH)
        ]
        store.append(records)
        time.sleep(rng.uniform(0, 0.02))


def looper(root: str, what: str, stop: mp.synchronize.Event, out: mp.Queue) -> None:
    store = Store(root)
    counts = []
    warnings.simplefilter("error")  # a damaged (partial) fragment must never be visible
    while not stop.is_set():
        if what == "publish":
            store.publish()
        elif what == "compact":
            store.compact()
        else:
            table = store.scan(columns=["record_id"])
            assert table.num_rows == len(set(table.column("record_id").to_pylist()))
            counts.append(table.num_rows)
        time.sleep(0.01)
    out.put((what, counts))


@pytest.mark.timeout(180)
def test_appenders_publisher_compactor_and_reader_at_once(tmp_path):
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    out: mp.Queue = ctx.Queue()
    root = str(tmp_path)
    helpers = [ctx.Process(target=looper, args=(root, what, stop, out))
               for what in ("publish", "compact", "read")]
    workers = [ctx.Process(target=appender, args=(root, w)) for w in range(APPENDERS)]
    for process in helpers + workers:
        process.start()
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    stop.set()
    results = dict(out.get(timeout=60) for _ in helpers)
    for process in helpers:
        process.join(60)
        assert process.exitcode == 0, "a publisher, compactor or reader failed"

    counts = results["read"]
    assert counts == sorted(counts), "a reader saw records disappear"
    store = Store(root)
    ids = store.scan(columns=["record_id"]).column("record_id").to_pylist()
    expected = {record_id(w, b, i) for w in range(APPENDERS) for b in range(BATCHES)
                for i in range(PER_BATCH)}
    assert len(ids) == len(expected)
    assert set(ids) == expected
    store.compact()
    report = store.verify()
    assert report.ok
    assert report.rows == len(expected)
    assert report.duplicate_rows == 0
    store.publish()
    index = Index(root, HW.hw_id)
    assert len(index) == len(OPS)


_KILL_CHILD = textwrap.dedent("""
    import os, sys, time
    import pyarrow as pa
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.datasets.synthetic import synthetic_records
    hw = HardwareSpec.from_json(sys.argv[3])
    store = Store(sys.argv[1])
    table = synthetic_records(int(sys.argv[4]), hw, n_ops=200)
    print("ready", flush=True)
    while True:
        ids = pa.array([os.urandom(16).hex() for _ in range(table.num_rows)])
        table = table.set_column(0, "record_id", ids)
        paths = store.append(table)
        if sys.argv[2] == "publish":
            store.publish()
        print("committed", table.num_rows, *paths, flush=True)
""")


def _run_and_kill(root: str, mode: str, rows: int, delay: float) -> list[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _KILL_CHILD, root, mode, HW.to_json(), str(rows)],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    committed = []
    for line in child.stdout.read().splitlines():
        if line.startswith("committed"):
            committed.extend(line.split()[2:])
    return committed


@pytest.mark.timeout(120)
def test_sigkilled_appender_leaves_nothing_partial_and_loses_nothing(tmp_path):
    root = str(tmp_path)
    committed: list[str] = []
    rng = random.Random(7)
    for _ in range(3):
        committed += _run_and_kill(root, "append", 20_000, rng.uniform(0.2, 0.8))
    store = Store(root)
    visible = {f.path for f in store.fragments()}
    assert set(committed) <= visible
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = store.scan(columns=["record_id"])
    footer_rows = sum(p["rows"] for p in store.stats()["partitions"])
    assert table.num_rows == footer_rows >= 20_000 * len(committed) // 2
    report = store.verify()
    assert report.ok
    assert not report.damaged
    assert not report.stray_files


@pytest.mark.timeout(120)
def test_sigkilled_publisher_leaves_a_readable_current_snapshot(tmp_path):
    root = str(tmp_path)
    rng = random.Random(3)
    for _ in range(3):
        _run_and_kill(root, "publish", 5_000, rng.uniform(0.3, 1.2))
    store = Store(root)
    hw_id = HW.hw_id
    if store.current(hw_id) is None:  # killed before the first publish finished
        store.publish()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index = Index(root, hw_id)
    assert len(index) > 0
    report = store.verify()
    assert report.ok, report.problems
