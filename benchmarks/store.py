"""Store benchmark: append throughput, publish of 1M records, index open/memory, lookups.

Run: ``.venv/bin/python benchmarks/store.py`` (``--quick`` for a smoke run). Prints the
figures and rewrites the ``store`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import platform
import random
import re
import resource
import tempfile
import time
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

from tunecache.cache.index import Index, forget_built
from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.datasets.records import Record
from tunecache.datasets.synthetic import synthetic_ops, synthetic_records, synthetic_schedules

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def _peak_rss() -> int:
    # VmHWM, unlike ru_maxrss, is not inherited across exec from the parent process.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _publish_child(root: str, out: mp.Queue) -> None:
    before = _peak_rss()
    start = time.perf_counter()
    result = Store(root).publish()
    elapsed = time.perf_counter() - start
    out.put((elapsed, before, _peak_rss(), result[0].entries))


def bench_append_and_publish(hw: HardwareSpec, n: int, batch: int) -> dict[str, float]:
    table = synthetic_records(n, hw, n_ops=10_000)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as root:
        store = Store(root)
        start = time.perf_counter()
        for offset in range(0, n, batch):
            store.append(table.slice(offset, batch))
        figures["append_table_rps"] = n / (time.perf_counter() - start)
        del table
        gc.collect()
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()
        child = ctx.Process(target=_publish_child, args=(root, out))
        child.start()
        elapsed, base, peak, entries = out.get()
        child.join()
        figures.update(publish_s=elapsed, publish_peak_rss=peak, publish_base_rss=base,
                       publish_entries=entries)
    ops = synthetic_ops(200, seed=1)
    schedules = synthetic_schedules(16, seed=1)
    rng = random.Random(0)
    records = [Record.create(op=rng.choice(ops), hw=hw, schedule=rng.choice(schedules),
                             status="ok", runtimes_s=[1e-3, 1.1e-3, 0.9e-3], host="bench")
               for _ in range(50_000)]
    with tempfile.TemporaryDirectory() as root:
        store = Store(root)
        start = time.perf_counter()
        for offset in range(0, len(records), 5_000):
            store.append(records[offset:offset + 5_000])
        figures["append_records_rps"] = len(records) / (time.perf_counter() - start)
    return figures


def bench_index(hw: HardwareSpec, entries: int, lookups: int) -> dict[str, float]:
    ops = synthetic_ops(entries, seed=entries)
    table = synthetic_records(8 * entries, hw, ops=ops, seed=entries)
    with tempfile.TemporaryDirectory() as root:
        store = Store(root)
        store.append(table)
        del table
        results = store.publish()
        opens, reopens = [], []
        for _ in range(5):
            forget_built()  # an open that builds the columns, as a new process does
            start = time.perf_counter()
            index = Index(root, hw.hw_id)
            opens.append(time.perf_counter() - start)
            del index
            start = time.perf_counter()
            index = Index(root, hw.hw_id)  # the same snapshot again: read, checked, not built
            reopens.append(time.perf_counter() - start)
            del index
        forget_built()
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        index = Index(root, hw.hw_id)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        served = [op for op in ops if op in index]
        clock = time.perf_counter_ns
        cold = []
        for op in served:  # first lookup of each op: the entry is built from the arrays
            t0 = clock()
            index.lookup(op)
            cold.append(clock() - t0)
        cold.sort()
        index = Index(root, hw.hw_id)
        rng = random.Random(1)
        sample = [rng.choice(served) for _ in range(lookups)]
        for op in sample[:1000]:
            index.lookup(op)
        timings = []
        lookup = index.lookup
        for op in sample:
            t0 = clock()
            lookup(op)
            timings.append(clock() - t0)
        timings.sort()
        return {
            "entries": len(index),
            "published": results[0].entries,
            "open_s": sorted(opens)[len(opens) // 2],
            "reopen_s": sorted(reopens)[len(reopens) // 2],
            "bytes_per_entry": held / max(1, len(index)),
            "lookup_p50_us": timings[len(timings) // 2] / 1000,
            "lookup_p99_us": timings[int(len(timings) * 0.99)] / 1000,
            "cold_p50_us": cold[len(cold) // 2] / 1000,
            "cold_p99_us": cold[int(len(cold) * 0.99)] / 1000,
        }


def _status(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, do not edit docs")
    args = parser.parse_args()
    n = 50_000 if args.quick else 1_000_000
    hw = local_spec()
    store_fig = bench_append_and_publish(hw, n, batch=min(n, 100_000))
    sizes = (1_000, 5_000) if args.quick else (10_000, 100_000)
    index_figs = {size: bench_index(hw, size, 200_000) for size in sizes}

    mib = 1 << 20
    small, large = index_figs[sizes[0]], index_figs[sizes[1]]
    lines = [
        f"Machine: {hw.cpu_model}, {hw.cores} cores ({hw.hw_id}), Python "
        f"{platform.python_version()}, {platform.system()}; local disk store.",
        f"Command: `.venv/bin/python benchmarks/store.py`; "
        f"date: {datetime.now(timezone.utc):%Y-%m-%d}.",
        "",
        "| measurement | result | target |",
        "| --- | --- | --- |",
        f"| append, {n:,} records as Arrow batches of 100k | "
        f"{store_fig['append_table_rps']:,.0f} records/s | ≥ 200,000 records/s "
        f"({_status(store_fig['append_table_rps'] >= 200_000)}) |",
        f"| append, 50k `Record` objects in batches of 5k | "
        f"{store_fig['append_records_rps']:,.0f} records/s | (no target) |",
        f"| publish {n:,} records ({store_fig['publish_entries']:,.0f} ops) | "
        f"{store_fig['publish_s']:.2f} s | ≤ 10 s ({_status(store_fig['publish_s'] <= 10)}) |",
        f"| publish peak RSS (whole process; {store_fig['publish_base_rss'] / mib:,.0f} MiB "
        f"after imports) | {store_fig['publish_peak_rss'] / mib:,.0f} MiB | ≤ 2 GiB "
        f"({_status(store_fig['publish_peak_rss'] <= 2 << 30)}) |",
    ]
    for size, fig in ((sizes[0], small), (sizes[1], large)):
        lines += [
            f"| index open, {fig['entries']:,.0f} entries | {fig['open_s'] * 1000:.1f} ms | "
            + (f"≤ 100 ms ({_status(fig['open_s'] <= 0.1)})" if size == sizes[0] else "-")
            + " |",
            f"| index re-open of the same snapshot, {fig['entries']:,.0f} entries | "
            f"{fig['reopen_s'] * 1000:.1f} ms | (no target) |",
            f"| index memory, {fig['entries']:,.0f} entries | "
            f"{fig['bytes_per_entry']:.0f} bytes/entry | ≤ 500 "
            f"({_status(fig['bytes_per_entry'] <= 500)}) |",
            f"| lookup p50 / p99, {fig['entries']:,.0f} entries | "
            f"{fig['lookup_p50_us']:.2f} / {fig['lookup_p99_us']:.2f} µs | p99 ≤ 5 µs "
            f"({_status(fig['lookup_p99_us'] <= 5)}) |",
            f"| first lookup of each op p50 / p99, {fig['entries']:,.0f} entries | "
            f"{fig['cold_p50_us']:.2f} / {fig['cold_p99_us']:.2f} µs | (p99 ≤ 5 µs: "
            f"{_status(fig['cold_p99_us'] <= 5)}) |",
        ]
    lines += [
        "",
        "An open builds the index's columns (the process's kept columns are dropped first); a "
        "re-open of the same snapshot reads and checks its bytes and takes the columns built "
        "before. "
        "Index memory is what `tracemalloc` sees held by an open `Index` (numpy arrays, the "
        "op-text dict and its keys), right after opening; looked-up entries are then kept "
        "(at most 4,096). Lookups are timed one by one with `perf_counter_ns` (timer overhead "
        "included): 200,000 random hits (a deploy looks the same ops up again and again), and "
        "separately the first lookup of every op, which builds its entry.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.quick:
        return
    doc = DOC.read_text()
    pattern = re.compile(r"(<!-- store:begin -->\n).*?(\n<!-- store:end -->)", re.DOTALL)
    if not pattern.search(doc):
        raise SystemExit(f"no store markers in {DOC}")
    DOC.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc))
    print(f"\nupdated {DOC}")


if __name__ == "__main__":
    main()
