"""Kernels as generic code sees them: compiled and loaded through the backend protocol, fed
deterministic inputs, and checked against a float64 numpy reference.

The kernel handles themselves (argument checks, calling, timing) are the backend's
(:class:`~tunecache.compiler.backends.KernelHandle`); ``Kernel`` and ``WeightBoundKernel``
here name those protocol types.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tunecache.compiler.backends import (
    Artifact,
    BoundKernel,
    KernelHandle,
    backend_for,
    host_backend,
)
from tunecache.compiler.buffers import aligned_empty, as_aligned
from tunecache.compiler.codegen import KernelSource, generate
from tunecache.compiler.elements import decoded, from_bfloat16, storage_dtype, to_bfloat16
from tunecache.compiler.errors import KernelArgumentError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature, TensorArg
from tunecache.compiler.schedule import Schedule

Kernel = KernelHandle
WeightBoundKernel = BoundKernel

MAX_WEIGHT_COPIES = 64
"""Most copies of one kernel's weights :func:`rotating_timer` rotates through."""


def weight_copies(span_bytes: int, unit_bytes: int) -> int:
    """How many copies of ``unit_bytes`` of weights span ``span_bytes`` (at least one, at
    most :data:`MAX_WEIGHT_COPIES`)."""
    return max(1, min(MAX_WEIGHT_COPIES, -(-span_bytes // max(1, unit_bytes))))


def check_argument(op: OpSignature, name: str, array: object, shape: tuple[int, ...],
                   writable: bool = False, dtype: str = "float32") -> None:
    """KernelArgumentError unless ``array`` is a C-contiguous, aligned numpy array of
    ``dtype`` and ``shape`` (and writable, for an output), naming what is wrong."""
    want = storage_dtype(dtype)
    if not isinstance(array, np.ndarray):
        raise KernelArgumentError(
            f"{op.kind} argument {name} must be a numpy array, got {type(array).__name__}")
    if array.dtype != want:
        raise KernelArgumentError(
            f"{op.kind} argument {name} has dtype {array.dtype}; the kernel needs "
            f"{want} (convert with .astype(np.{want}))")
    if array.shape != shape:
        raise KernelArgumentError(
            f"{op.kind} argument {name} has shape {array.shape}; {op.text} needs {shape}")
    if not array.flags.c_contiguous:
        raise KernelArgumentError(
            f"{op.kind} argument {name} is not C-contiguous (strides {array.strides}); "
            "pass np.ascontiguousarray(...)")
    if not array.flags.aligned:
        raise KernelArgumentError(f"{op.kind} argument {name} is not aligned to its dtype")
    if writable and not array.flags.writeable:
        raise KernelArgumentError(f"{op.kind} output {name} is read-only")


def checked_call(op: OpSignature, inputs: tuple[np.ndarray, ...], out: np.ndarray | None,
                 weights_bound: bool = False) -> np.ndarray:
    """Check a kernel call's ``inputs`` (without the weights, where ``weights_bound``) and
    ``out`` (allocated when None, else checked and kept apart from the inputs); the output.
    Every backend's handles check their calls with it: nothing unchecked reaches a device."""
    args = op.arguments()
    specs = [a for a in args if a.role == "input"]
    output = next(a for a in args if a.role == "output")
    if weights_bound:
        specs = [specs[0], *specs[2:]]
    if len(inputs) != len(specs):
        names = ", ".join(a.name for a in specs)
        bound = " with bound weights" if weights_bound else ""
        raise KernelArgumentError(
            f"{op.text}{bound} takes {len(specs)} input(s) ({names}), got {len(inputs)}")
    for spec, array in zip(specs, inputs, strict=True):
        check_argument(op, spec.name, array, spec.shape, dtype=spec.dtype)
    if out is None:
        return np.empty(output.shape, dtype=storage_dtype(output.dtype))
    check_argument(op, output.name, out, output.shape, writable=True, dtype=output.dtype)
    for spec, array in zip(specs, inputs, strict=True):
        if np.may_share_memory(out, array):
            raise KernelArgumentError(
                f"output {output.name} overlaps input {spec.name}; the kernel needs a "
                "separate output buffer")
    return out


def load_kernel(op: OpSignature, artifact: Artifact | Path,
                hw: HardwareSpec | None = None) -> KernelHandle:
    """Load a built artifact as a callable kernel for ``op`` through the backend of ``hw``
    (default: this machine's); BuildError, before any of its code runs, if its bytes do
    not match the digest recorded when it was built."""
    path = artifact.path if isinstance(artifact, Artifact) else Path(artifact)
    backend = host_backend() if hw is None else backend_for(hw)
    return backend.load(op, path)


def compile_kernel(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> KernelHandle:
    """Validate, generate, build (through the artifact cache) and load in one step."""
    backend = backend_for(hw)
    backend.ensure_runnable(hw)
    source: KernelSource = generate(op, schedule, hw)
    return backend.load(op, backend.build(source).path)


def random_inputs(op: OpSignature, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Float32 inputs of the right shapes, deterministic for a seed: standard normal, unless
    the kind draws its own (``OpKind.random_inputs``); each starts on a cache line."""
    rng = np.random.default_rng(seed)
    draw = op_kind(op.kind).random_inputs
    # Cache-line aligned, as a compiled model's arena and packed weights are.
    if draw is not None:
        return tuple(as_aligned(x) for x in draw(op, rng))
    return tuple(_random(arg, rng) for arg in op.arguments() if arg.role == "input")


def _random(arg: TensorArg, rng: np.random.Generator) -> np.ndarray:
    """Standard normal floats (bfloat16 ones rounded to the nearest), or integers over the
    element type's whole range."""
    out = aligned_empty(arg.shape, storage_dtype(arg.dtype))
    if arg.dtype == "bfloat16":
        out[...] = to_bfloat16(rng.standard_normal(arg.shape, dtype=np.float32))
    elif out.dtype.kind == "f":
        rng.standard_normal(out=out, dtype=np.float32)
    else:
        info = np.iinfo(out.dtype)
        out[...] = rng.integers(max(info.min, -(1 << 15)), min(info.max, 1 << 15) + 1,
                                size=arg.shape, dtype=np.int64)
    return out


def values(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """``inputs`` as the float64 numbers they hold (bfloat16 bit patterns decoded)."""
    return tuple(x.astype(np.float64) for x in decoded(op, inputs))


def reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The op computed by numpy in float64 (its kind's reference): the ground truth kernels
    are checked against."""
    return op_kind(op.kind).reference(op, values(op, inputs))


def tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """(rtol, atol) for comparing a float32 kernel with the float64 reference.

    The absolute part grows with the reduction length: float32 rounding error of a K-term
    dot product is bounded by about K·eps·Σ|a·b|.
    """
    kind = op_kind(op.kind)
    if kind.tolerance is not None:
        return kind.tolerance(op, inputs)
    out = op.arguments()[-1].dtype
    if out == "uint8":
        return 0.0, 1.0  # a requantized activation: a float32 rounding tie apart at most
    if out != "bfloat16" and np.dtype(out).kind in "iu":
        return 0.0, 0.0  # integer accumulation is exact
    k = kind.reduction_length(op)
    inputs = decoded(op, inputs)
    scale = float(np.abs(inputs[0]).max()) * float(np.abs(inputs[1]).max()) if len(inputs) > 1 \
        else float(np.abs(inputs[0]).max()) ** 2
    return 1e-4, 1e-6 * k * scale + 1e-6


def check_result(op: OpSignature, inputs: tuple[np.ndarray, ...], result: np.ndarray,
                 expected: np.ndarray) -> str | None:
    """None if ``result`` matches ``expected``; else a one-line description of the mismatch."""
    rtol, atol = tolerance(op, inputs)
    if op.arguments()[-1].dtype == "bfloat16":
        # a bfloat16 output: rounded to nearest, within half of its 2**-7 relative spacing
        result, rtol = from_bfloat16(result), rtol + 2.0 ** -8
    if not np.all(np.isfinite(result)):
        bad = int(np.count_nonzero(~np.isfinite(result)))
        return f"{bad} of {result.size} outputs are not finite (unwritten or corrupted)"
    err = np.abs(result.astype(np.float64) - expected)
    limit = atol + rtol * np.abs(expected)
    if np.all(err <= limit):
        return None
    worst = np.unravel_index(int(np.argmax(err - limit)), err.shape)
    return (
        f"{int(np.count_nonzero(err > limit))} of {result.size} outputs wrong; worst at "
        f"{tuple(int(i) for i in worst)}: got {float(result[worst]):.6g}, expected "
        f"{float(expected[worst]):.6g} (atol {atol:.2g}, rtol {rtol:.0e})"
    )
