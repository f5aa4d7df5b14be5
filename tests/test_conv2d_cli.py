"""`tunecache bench-op` on a conv2d op, and conv2d measurements in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, default_conv2d_schedule
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.records import Record, records_to_table

OP = "conv2d(N=1,C=16,H=10,W=12,F=24,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,epilogue=bias+relu)"


def tunecache(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def test_bench_op_conv2d_json(tmp_path: Path) -> None:
    out = tunecache("bench-op", OP, "--min-time", "0.02", "--json", "--root", str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["op"] == OpSignature.parse(OP).text
    assert report["kernel"]["status"] == "ok" and report["kernel"]["gflops"] > 0
    assert report["schedule"]["family"] == "conv2d"
    assert report["numpy"] is None and report["ratio_to_numpy"] is None
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        assert report["onnxruntime"] is None
    else:
        assert report["onnxruntime"]["status"] == "ok" and report["ratio_to_onnxruntime"] > 0
    assert report["recorded_in"]


def test_bench_op_conv2d_with_schedule_and_threads() -> None:
    s = Conv2dSchedule(oc_block=6, ow_block=2 * local_spec().lanes, ic_block=8, algorithm="gemm",
                       pack_w=0)
    out = tunecache("bench-op", OP, "--schedule", s.to_json(), "--threads", "2",
                    "--min-time", "0.02", "--no-baseline", "--no-record")
    if local_spec().cores < 2:
        pytest.skip("needs two cores")
    assert out.returncode == 0, out.stderr
    assert "GFLOP/s" in out.stdout and "onnxruntime" not in out.stdout
    bad = tunecache("bench-op", OP, "--schedule", s.replace(oh_block=2).to_json(), "--no-record")
    assert bad.returncode == 2 and "oh_block must be 1 for algorithm=gemm" in bad.stderr


def test_conv2d_records_fill_conv_columns() -> None:
    op = conv2d_op(2, 8, 9, 7, 16, 3, 1, stride=(2, 1), pads=(1, 0, 1, 0), groups=2,
                            epilogue="bias")
    hw = local_spec()
    s = default_conv2d_schedule(op, hw)
    rec = Record.create(op=op, hw=hw, status="ok", schedule=s, runtimes_s=[1e-3, 2e-3])
    row = records_to_table([rec]).to_pylist()[0]
    assert (row["dim_batch"], row["dim_c"], row["dim_h"], row["dim_w"], row["dim_f"]) == (
        2, 8, 9, 7, 16)
    assert (row["dim_r"], row["dim_s"], row["stride_h"], row["stride_w"]) == (3, 1, 2, 1)
    assert (row["pad_t"], row["pad_l"], row["pad_b"], row["pad_r"]) == (1, 0, 1, 0)
    assert (row["dil_h"], row["dil_w"], row["groups"]) == (1, 1, 2)
    assert row["dim_m"] is None and row["dim_n"] is None and row["dim_k"] is None
    assert row["oc_block"] == s.oc_block and row["algorithm"] == "direct"
    assert row["threads"] == s.threads and row["mr"] is None
    mm = Record.create(op=matmul_op(3, 4, 5), hw=hw, status="invalid")
    mrow = records_to_table([mm]).to_pylist()[0]
    assert (mrow["dim_m"], mrow["dim_n"], mrow["dim_k"]) == (3, 4, 5) and mrow["dim_c"] is None
