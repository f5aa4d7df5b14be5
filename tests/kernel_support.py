"""Shared checks of generated kernels for the codegen tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tunecache.compiler.backends.cpu.build import build, find_compiler
from tunecache.compiler.codegen import KernelSource, generate
from tunecache.compiler.hardware import HardwareSpec, cpu_isa
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import Kernel, check_result, load_kernel, reference
from tunecache.compiler.schedule import ScheduleData


def assembly(kernel: KernelSource, tmp_path: Path) -> str:
    """The assembly the system compiler makes of ``kernel`` with its own flags."""
    src = tmp_path / "kernel.c"
    src.write_text(kernel.code)
    flags = [f for f in kernel.flags if f != "-shared"]
    return subprocess.run([find_compiler().path, *flags, "-S", "-o", "-", str(src)],
                          capture_output=True, text=True, check=True).stdout


def bound_weights_problem(kernel: Kernel, inputs: tuple[np.ndarray, ...],
                          expected: np.ndarray) -> str | None:
    """Weights packed once, then two calls: must be bit-identical to packing every call."""
    bound = kernel.bind_weights(inputs[1])
    for _ in range(2):
        packed = np.full_like(expected, np.nan)
        bound(inputs[0], *inputs[2:], out=packed)
        if not np.array_equal(packed, expected):
            return "pre-packed weights give a different result"
    return None


_kernels: dict[tuple[str, str, str], Kernel] = {}

FULL = os.environ.get("TUNECACHE_TEST_FULL") == "1"
LOWER_ISA_SHARE = 6
"""On ISA levels below the machine's, one variant in this many is built and run."""

C = TypeVar("C", bound=tuple[Any, ...])


def examples(full: int) -> int:
    """Hypothesis examples for a test that builds a kernel per example: ``full`` with
    ``TUNECACHE_TEST_FULL=1``, half of it otherwise."""
    return full if FULL else max(1, full // 2)


def sampled(cases: Sequence[C], hw_at: int = 2) -> list[C]:
    """Every case on the machine's own ISA level; on lower levels (the same emitters with a
    narrower vocabulary) one in six, spread over the list, unless ``TUNECACHE_TEST_FULL=1``.
    Cases are tuples with their hardware spec at position ``hw_at``."""
    if FULL:
        return list(cases)
    own = [c[hw_at].isa == cpu_isa() for c in cases]
    lower = [i for i, mine in enumerate(own) if not mine][::LOWER_ISA_SHARE]
    keep = set(lower)
    return [c for i, c in enumerate(cases) if own[i] or i in keep]


def cached_kernel(op: OpSignature, s: ScheduleData, hw: HardwareSpec) -> Kernel:
    """Generate, build and load once per (op, schedule, ISA) for the whole test session."""
    key = (op.text, s.to_json(), hw.isa)
    if key not in _kernels:
        _kernels[key] = load_kernel(op, build(generate(op, s, hw)))
    return _kernels[key]


def build_all(cases: Sequence[tuple[OpSignature, ScheduleData, HardwareSpec]]) -> None:
    """Build many kernels two at a time (the compiler runs in its own processes)."""
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: cached_kernel(*c), cases))


def poisoned_run_problem(kernel: Kernel | Callable[..., np.ndarray], op: OpSignature,
                inputs: tuple[np.ndarray, ...], offset: int = 0) -> str | None:
    """Run ``kernel`` into a NaN-poisoned output (``offset`` floats into its buffer, to
    misalign it), compare with the float64 reference, then run again into a fresh poisoned
    buffer: None, or what went wrong."""
    shape = op.arguments()[-1].shape
    outs = []
    for _ in range(2):
        buffer = np.full(int(np.prod(shape)) + offset, np.nan, dtype=np.float32)
        outs.append(buffer[offset:].reshape(shape))
        kernel(*inputs, out=outs[-1])
        if len(outs) == 1:
            problem = check_result(op, inputs, outs[0], reference(op, inputs))
            if problem:
                return problem
    return None if np.array_equal(outs[0], outs[1]) else "second call differs from the first"


def planted_object(tmp_path: Path, marker: Path) -> Path:
    """A valid shared object whose constructor creates ``marker`` when it is loaded."""
    source = tmp_path / "planted.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'    FILE *f = fopen("{marker}", "w");\n'
        "    if (f) fclose(f);\n"
        "}\n"
        "int tc_kernel(void **args) { (void)args; return 0; }\n"
    )
    out = tmp_path / "planted.so"
    subprocess.run([find_compiler().path, "-shared", "-fPIC", str(source), "-o", str(out)],
                   check=True, capture_output=True)
    return out
