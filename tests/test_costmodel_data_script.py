"""``benchmarks/costmodel_data.py --ops FILE``: the ops a re-measurement job reads from a file
(run as a real process, listing only: nothing is measured)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "costmodel_data.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120)


def test_listed_ops_are_read_once_each_in_file_order(tmp_path: Path) -> None:
    first = matmul_op(3, 14, 266, trans_b=True, epilogue="relu")
    second = conv2d_op(1, 16, 14, 14, 32, 3, 3, pads=1, epilogue="bias")
    ops = tmp_path / "ops.txt"
    ops.write_text(f"# records of an old protocol\n{first.text}\n\n"
                   f"{second.text}  # a conv\n{first.text}\n")
    done = _run("--root", str(tmp_path / "store"), "--ops", str(ops), "--list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines] == [first.text, second.text]
    assert all(line.startswith("listed ") for line in lines)
    assert not (tmp_path / "store").exists()


def test_a_line_that_is_not_an_op_is_named_before_anything_runs(tmp_path: Path) -> None:
    ops = tmp_path / "ops.txt"
    ops.write_text(f"{matmul_op(8, 8, 8).text}\nmatmul(M=1)\n")
    done = _run("--root", str(tmp_path / "store"), "--ops", str(ops))
    assert done.returncode != 0
    assert done.stderr.startswith(f"error: {ops}:2: not an op text")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "store").exists()
    missing = _run("--root", str(tmp_path / "store"), "--ops", str(tmp_path / "none.txt"))
    assert missing.returncode != 0 and missing.stderr.startswith("error: --ops ")
