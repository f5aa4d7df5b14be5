"""benchmarks/export_sweep.py: bad arguments get one error line; with torch and
transformers installed, a family exports, compiles and matches onnxruntime."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "export_sweep.py"
HAVE_EXPORTERS = all(importlib.util.find_spec(p) is not None
                     for p in ("torch", "transformers", "onnxruntime"))


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "bart"], "error: unknown family 'bart'; choose from bert, "),
    (["--exporters", "onnxscript"], "error: --exporters takes torchscript and/or dynamo"),
])
def test_bad_arguments_get_one_error_line(args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--no-write"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(message)


@pytest.mark.skipif(not HAVE_EXPORTERS, reason="needs torch, transformers and onnxruntime")
def test_a_family_exports_compiles_and_matches() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "bert", "--exporters",
                           "torchscript", "--no-write"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| bert |")]
    assert len(rows) == 1 and "| match |" in rows[0]
    assert "1 of 1 exports match onnxruntime, 0 wrong" in proc.stdout
