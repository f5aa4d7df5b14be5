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
    from tunecache.compiler.backends import backend_for
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
        f"{backend_for(hw).toolchain().split(';')[0]}; numpy {np.__version__} with {blas}; Python "
        f"{platform.python_version()}.\n"
        f"Command: `{command}`, run {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC."
    )


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=DOC.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def script_name() -> str:
    """The running benchmark script's file name without ``.py``: its section's key."""
    main = getattr(sys.modules.get("__main__"), "__file__", None) or sys.argv[0]
    return Path(main).stem


def write_section(markdown: str, variant: str | None = None, doc: Path = DOC,
                  script: str | None = None) -> None:
    """Rewrite the running script's block in its own section of docs/BENCHMARKS.md.

    The section is ``## <script>`` (:func:`script_name` unless ``script`` is given). The text
    goes between ``<!-- KEY:begin -->`` and ``<!-- KEY:end -->``, where KEY is the script name,
    or ``<script>/<variant>`` for one of several blocks of that section (one per machine or
    ISA level, say). A variant that starts with the script's name loses that prefix
    (``matmul_vs_blas_avx2`` is the ``avx2`` block of ``matmul_vs_blas``); one equal to it is
    the script's plain block. A rerun replaces its block; a new block goes at the end of the
    script's section, and a new section at the end of the file.
    """
    script = script or script_name()
    if variant is not None:
        variant = variant.removeprefix(script).lstrip("_")
    key = f"{script}/{variant}" if variant else script
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text,
                      flags=re.DOTALL)
    else:
        heading = re.search(rf"^## {re.escape(script)}[ \t]*$", text, flags=re.MULTILINE)
        if heading is None:
            text = text.rstrip() + f"\n\n## {script}\n\n{block}\n"
        else:
            following = re.search(r"^## ", text[heading.end():], flags=re.MULTILINE)
            stop = heading.end() + following.start() if following else len(text)
            text = text[:stop].rstrip() + f"\n\n{block}\n" + (
                "\n" + text[stop:] if following else "")
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
