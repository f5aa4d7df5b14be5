"""`tunecache hw` and `tunecache bench-op` as a user runs them: real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tunecache.compiler.hardware import local_spec


def tunecache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunecache.tuner.cli", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


def test_hw_json_matches_detection() -> None:
    out = tunecache("hw", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["hw_id"] == local_spec().hw_id
    text = tunecache("hw")
    assert local_spec().hw_id in text.stdout and "L2" in text.stdout


def test_hw_honours_pinned_spec(tmp_path: Path) -> None:
    from dataclasses import replace

    pinned = replace(local_spec(), cores=64, cpu_model="Pinned CPU")
    spec = tmp_path / "spec.json"
    spec.write_text(pinned.to_json())
    for out in (tunecache("hw", "--json", "--hardware", str(spec)),
                tunecache("hw", "--json", env={"TUNECACHE_HARDWARE": str(spec)})):
        assert json.loads(out.stdout)["hw_id"] == pinned.hw_id


def test_bench_op_json_reports_kernel_and_numpy() -> None:
    out = tunecache("bench-op", "matmul(M=64,N=96,K=80,layout=tn,epilogue=bias+relu)",
                    "--min-time", "0.05", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kernel"]["status"] == "ok" and report["kernel"]["gflops"] > 0
    assert report["numpy"]["status"] == "ok"
    assert report["ratio_to_numpy"] > 0
    assert report["op"].startswith("matmul(M=64,N=96,K=80")


def test_bench_op_with_schedule_and_threads(tmp_path: Path) -> None:
    hw = local_spec()
    schedule = {"mr": 4, "nr": 2 * hw.lanes, "kc": 32, "mc": 8, "nc": 4 * hw.lanes,
                "loop_order": "ipj"}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(schedule))
    threads = str(min(2, hw.cores))
    out = tunecache("bench-op", "batch_matmul(B=3,M=20,N=30,K=10,shared=b)",
                    "--schedule", f"@{path}", "--threads", threads, "--no-baseline",
                    "--min-time", "0.02")
    assert out.returncode == 0, out.stderr
    assert "GFLOP/s" in out.stdout and "numpy" not in out.stdout.split("schedule")[-1]
    assert f'"threads": {threads}' in out.stdout


def test_user_errors_are_one_line_without_traceback() -> None:
    cases = [
        (("bench-op", "matmul(M=1,N=2)"), "missing dim(s) K"),
        (("bench-op", "matmul(M=8,N=8,K=8)", "--schedule", '{"mr": 99, "nr": 999, "kc": 1, '
          '"mc": 1, "nc": 1}'), "illegal schedule"),
        (("bench-op", "matmul(M=8,N=8,K=8)", "--schedule", "{oops"), "not valid JSON"),
        (("bench-op", "matmul(M=8,N=8,K=8)", "--schedule", "@/nonexistent.json"), "cannot read"),
        (("hw", "--hardware", "/nonexistent/spec.json"), "cannot read hardware spec"),
    ]
    for args, fragment in cases:
        out = tunecache(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert fragment in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


def test_candidates_command(tmp_path: Path) -> None:
    out = tunecache("candidates", "matmul(M=128,N=768,K=768)", "--k", "5", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [c["rank"] for c in report["candidates"]] == list(range(5))
    assert report["hw_id"] == local_spec().hw_id
    estimates = [c["estimated_ms"] for c in report["candidates"]]
    assert estimates == sorted(estimates)
    # Another machine's spec, from JSON: AVX2 vector width.
    from dataclasses import replace

    spec = tmp_path / "avx2.json"
    spec.write_text(replace(local_spec(), isa="avx2", vector_bits=256, cores=8).to_json())
    other = json.loads(tunecache("candidates", "matmul(M=512,N=512,K=512)", "--hardware",
                                 str(spec), "--json").stdout)
    assert all(c["schedule"]["nr"] % 8 == 0 and c["schedule"]["threads"] == 8
               for c in other["candidates"])
    text = tunecache("candidates", "matmul(M=64,N=64,K=64)", "--k", "3")
    assert "rank" in text.stdout and len(text.stdout.strip().splitlines()) == 5


def test_candidates_for_an_op_no_schedule_of_this_machine_runs(tmp_path: Path) -> None:
    """An 8-channel blocked conv on AVX-512 (16 lanes): one error line naming the layout the
    machine takes, not an empty table (nor, in a compile, an index error)."""
    from dataclasses import replace

    spec = tmp_path / "avx512.json"
    spec.write_text(replace(local_spec(), isa="avx512", vector_bits=512, cores=2).to_json())
    out = tunecache("candidates", "conv2d(N=1,C=16,H=8,W=8,F=16,R=3,S=3,pad_t=1,pad_l=1,"
                    "pad_b=1,pad_r=1,layout=nchw8c,out_layout=nchw8c)", "--hardware", str(spec))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: no legal schedule") and "nchw16c" in out.stderr
