"""Shared helpers for benchmark scripts: machine description and BENCHMARKS.md sections."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def machine_summary() -> str:
    """One paragraph: CPU, spec, compiler, numpy/BLAS, and the command that ran."""
    from tunecache.compiler.build import find_compiler
    from tunecache.compiler.hardware import local_spec

    hw = local_spec()
    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(
            f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
            for i in threadpool_info() if i.get("user_api") == "blas"
        ) or "unknown BLAS"
    except Exception:  # pragma: no cover - informative only
        blas = "unknown BLAS"
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    return (
        f"Machine: {hw.cpu_model}, {hw.cores} cores, {hw.isa} "
        f"(L1d {hw.l1d_bytes >> 10} KiB, L2 {hw.l2_bytes >> 10} KiB, L3 {hw.l3_bytes >> 20} MiB), "
        f"`{hw.hw_id}`; {platform.system()} {platform.release()}; compiler "
        f"{find_compiler().short}; numpy {np.__version__} with {blas}; Python "
        f"{platform.python_version()}.\n"
        f"Command: `{command}`, run {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC."
    )


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=DOC.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_section(name: str, markdown: str, doc: Path = DOC) -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text,
                      flags=re.DOTALL)
    else:
        text = text.rstrip() + f"\n\n## {name}\n\n{block}\n"
    doc.write_text(text)


def median_ms(fn: Callable[[], object], repeat: int, gap_s: float = 0.0) -> float:
    """Median wall time of ``fn`` in milliseconds over ``repeat`` calls after one warm-up,
    each call after ``gap_s`` idle seconds (none by default)."""
    fn()
    samples = []
    for _ in range(repeat):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3
