"""Synthetic but realistic records, for benchmarks and tests.

Op texts, ids, schedules and their JSON come from the real value types; latencies follow the
op's FLOPs with per-schedule efficiency and log-normal measurement noise; about one record in
ten is a failure.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.schema import SCHEMA, SCHEMA_VERSION

_FAILURES = ("compile_error", "runtime_error", "wrong_result", "timeout")


def synthetic_ops(n: int, seed: int = 0) -> list[OpSignature]:
    """``n`` distinct matmul / batch_matmul signatures with model-like shapes."""
    rng = np.random.default_rng(seed)
    sizes = [16 * k for k in range(1, 257)]
    ops: dict[str, OpSignature] = {}
    while len(ops) < n:
        m, nn, k = (int(rng.choice(sizes)) for _ in range(3))
        if rng.random() < 0.8:
            op = matmul_op(m, nn, k, trans_b=bool(rng.random() < 0.3),
                                    epilogue=("bias", "relu")[: int(rng.integers(0, 3))])
        else:
            op = batch_matmul_op(int(rng.integers(1, 65)), m, nn, k)
        ops.setdefault(op.text, op)
    return list(ops.values())


def synthetic_schedules(n: int = 64, seed: int = 0) -> list[MatmulSchedule]:
    """``n`` distinct matmul schedules over the usual knob ranges."""
    rng = np.random.default_rng(seed)
    found: dict[str, MatmulSchedule] = {}
    while len(found) < n:
        mr = int(rng.choice([4, 6, 8, 12, 14]))
        nr = int(rng.choice([16, 32]))
        schedule = MatmulSchedule(
            mr=mr, nr=nr, kc=int(rng.choice([128, 256, 384, 512])),
            mc=mr * int(rng.integers(4, 40)), nc=nr * int(rng.integers(8, 128)),
            pack_a=int(rng.integers(0, 2)), pack_b=1,
            loop_order=str(rng.choice(["jpi", "ipj"])), unroll=int(rng.choice([1, 2, 4, 8])),
            threads=int(rng.choice([1, 2])), parallel=str(rng.choice(["m", "n"])),
        )
        found.setdefault(schedule.schedule_id, schedule)
    return list(found.values())


def _hex_ids(n: int) -> pa.Array:
    text = os.urandom(16 * n).hex()
    return pa.array([text[i:i + 32] for i in range(0, 32 * n, 32)], pa.string())


def synthetic_records(
    n: int,
    hw: HardwareSpec,
    *,
    ops: list[OpSignature] | None = None,
    n_ops: int = 1000,
    schedules: list[MatmulSchedule] | None = None,
    repeats: int = 5,
    seed: int = 0,
    job_id: str = "synthetic",
) -> pa.Table:
    """A canonical records table of ``n`` measurements on ``hw``."""
    rng = np.random.default_rng(seed)
    ops = ops if ops is not None else synthetic_ops(n_ops, seed)
    schedules = schedules if schedules is not None else synthetic_schedules(seed=seed)
    op_i = rng.integers(0, len(ops), n)
    sc_i = rng.integers(0, len(schedules), n)
    failed = rng.random(n) < 0.1
    flops = np.array([op.flops for op in ops], dtype=np.float64)
    efficiency = rng.uniform(0.05, 0.9, len(schedules))
    base = flops[op_i] / (efficiency[sc_i] * 50e9)
    runs = base[:, None] * rng.lognormal(0.0, 0.05, (n, repeats))
    median = np.median(runs, axis=1)
    status = np.where(failed, np.array(_FAILURES)[rng.integers(0, 4, n)], "ok")
    median = np.where(failed, np.nan, median)

    op_idx = pa.array(op_i)
    sc_idx = pa.array(sc_i)
    dims = {name: [op.dims_dict.get(key) for op in ops]
            for key, name in (("B", "dim_batch"), ("M", "dim_m"), ("N", "dim_n"),
                              ("K", "dim_k"))}
    offsets = pa.array(np.arange(0, n * repeats + 1, repeats, dtype=np.int32))
    runtimes = pa.ListArray.from_arrays(offsets, pa.array(runs.ravel()))
    now = datetime.now(timezone.utc).timestamp()
    stamps = ((now - rng.uniform(0, 30 * 86400, n)) * 1e6).astype(np.int64)
    null_text = pa.nulls(n, pa.string())
    columns: dict[str, pa.Array] = {
        "record_id": _hex_ids(n),
        "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        "schema_version": pa.array(np.full(n, SCHEMA_VERSION, np.int16)),
        "hw_id": pa.array([hw.hw_id] * n, pa.string()),
        "hw_isa": pa.array([hw.isa] * n, pa.string()),
        "hw_cores": pa.array(np.full(n, hw.cores, np.int32)),
        "hw_cpu_model": pa.array([hw.cpu_model] * n, pa.string()),
        "hw_json": pa.array([hw.to_json()] * n, pa.string()),
        "op_kind": pa.array([op.kind for op in ops]).take(op_idx),
        "op_id": pa.array([op.op_id for op in ops]).take(op_idx),
        "op_text": pa.array([op.text for op in ops]).take(op_idx),
        **{name: pa.array(values, pa.int64()).take(op_idx) for name, values in dims.items()},
        "schedule_json": pa.array([s.to_json() for s in schedules]).take(sc_idx),
        "schedule_id": pa.array([s.schedule_id for s in schedules]).take(sc_idx),
        **{name: pa.array([s.knobs()[name] for s in schedules], SCHEMA.field(name).type)
           .take(sc_idx) for name in schedules[0].knobs()},
        "compiler": pa.array(["gcc-12.2.0"] * n, pa.string()),
        "flags": pa.array(["-O3 -std=gnu11"] * n, pa.string()),
        "codegen_version": pa.array([CODEGEN_VERSION] * n, pa.string()),
        "source_hash": null_text,
        "status": pa.array(status.tolist(), pa.string()),
        "error": pa.array([("synthetic failure" if f else None) for f in failed.tolist()],
                          pa.string()),
        "runtimes_s": runtimes,
        "median_s": pa.array(median, from_pandas=True),
        "min_s": pa.array(np.where(failed, np.nan, runs.min(axis=1)), from_pandas=True),
        "gflops": pa.array(flops[op_i] / median / 1e9, from_pandas=True),
        "compile_s": pa.array(rng.uniform(0.05, 0.5, n)),
        "job_id": pa.array([job_id] * n, pa.string()),
        "host": pa.array(["farm-node-01"] * n, pa.string()),
        "source": pa.array(np.array(["tiler", "model", "refine"])[rng.integers(0, 3, n)]
                           .tolist(), pa.string()),
        "predicted": pa.array(rng.uniform(0, 1, n)),
        "model_version": null_text,
    }
    # Columns this generator does not model (e.g. conv2d dims for matmul rows) are null.
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
