"""The CPU backend's kernel handles: a built shared object loaded with ctypes, called on
numpy arrays with every argument checked first.

A wrong dtype, shape or memory layout raises :class:`KernelArgumentError` naming the argument,
what was given and what the kernel needs; nothing reaches the C code unchecked.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunecache.compiler.backends import Timer
from tunecache.compiler.backends.cpu.build import open_verified
from tunecache.compiler.backends.cpu.runner import time_rotating_function
from tunecache.compiler.backends.cpu.threads import configure_openmp
from tunecache.compiler.backends.cpu.tiles import request_tile_state
from tunecache.compiler.buffers import aligned_copy, aligned_empty
from tunecache.compiler.errors import KernelArgumentError
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_argument, checked_call, weight_copies


@dataclass
class Kernel:
    """A loaded kernel for one op signature. Call it as ``kernel(A, B, ..., out=None)``."""

    op: OpSignature
    path: Path
    _lib: ctypes.CDLL = field(init=False, repr=False)

    def __post_init__(self) -> None:
        configure_openmp()  # before the first kernel brings libgomp in
        # Only bytes that match the artifact's build record are loaded (their constructors
        # run at load time): see tunecache.compiler.backends.cpu.build.open_verified.
        with open_verified(self.path) as loadable:
            self._lib = ctypes.CDLL(loadable)
        if hasattr(self._lib, "tc_needs_tiles"):
            request_tile_state()  # before its first tile instruction, or it dies of SIGILL
        self._entry = self._lib.tc_kernel
        self._entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._entry.restype = ctypes.c_int
        self._timer = self._lib.tc_time
        self._timer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_long]
        self._timer.restype = ctypes.c_double
        self._args = self.op.arguments()
        self._inputs = [a for a in self._args if a.role == "input"]
        self._dtype = np.dtype(np.float32)  # the ABI counts packed weights in floats

    def _pointers(self, inputs: tuple[np.ndarray, ...], out: np.ndarray | None,
                  weights: int | None = None) -> tuple[ctypes.Array[ctypes.c_void_p], np.ndarray]:
        """Check the arguments and lay out their pointers; with ``weights`` (the address of
        pre-packed weights), ``inputs`` omit the weights and that address takes their place."""
        out = checked_call(self.op, inputs, out, weights_bound=weights is not None)
        addresses = [a.ctypes.data for a in inputs]
        if weights is not None:
            addresses.insert(1, weights)
        pointers = (ctypes.c_void_p * len(self._args))(*addresses, out.ctypes.data)
        return pointers, out

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Run the kernel; returns ``out`` (allocated if not given)."""
        pointers, result = self._pointers(inputs, out)
        if self._entry(pointers) != 0:
            raise MemoryError(f"kernel for {self.op.text} could not allocate its workspace")
        return result

    def time(self, *inputs: np.ndarray, out: np.ndarray, iters: int) -> float:
        """Seconds for ``iters`` back-to-back calls, timed inside the shared object."""
        pointers, _ = self._pointers(inputs, out)
        return float(self._timer(pointers, iters))

    def rotating_timer(self, inputs: tuple[np.ndarray, ...], out: np.ndarray, span_bytes: int,
                       bound: Any = None) -> tuple[Timer, int]:
        """:func:`rotating_timer` of this kernel."""
        return rotating_timer(self, inputs, out, span_bytes, bound)

    @property
    def entry_address(self) -> int | None:
        """The address of ``tc_kernel``, a native plan's step entry."""
        return ctypes.cast(self._entry, ctypes.c_void_p).value

    @property
    def prepacks_weights(self) -> bool:
        """Whether the kernel can take its weights (second input) packed once: conv2d
        ``direct`` or ``gemm`` with ``pack_w=1``; matmuls with ``pack_b=1`` whose B every
        batch item shares. See :meth:`bind_weights`."""
        return hasattr(self._lib, "tc_pack_weights")

    def bind_weights(self, weights: np.ndarray) -> WeightBoundKernel:
        """Pack constant weights (conv2d W, matmul B) once into the kernel's layout.

        Returns a callable taking the other inputs (``X[, bias][, add]`` or ``A[, bias]``)
        that runs the kernel on the packed copy, skipping the repacking every ``tc_kernel``
        call does.
        """
        if not self.prepacks_weights:
            raise KernelArgumentError(
                f"the kernel for {self.op.text} reads its weights in place and has no "
                "pre-packed entry (conv2d direct or gemm with pack_w=1, and matmuls with "
                "pack_b=1 and a shared B, have one)")
        spec = self._inputs[1]
        check_argument(self.op, spec.name, weights, spec.shape, dtype=spec.dtype)
        packed = aligned_empty(self._packed_floats(), self._dtype)
        pack = self._lib.tc_pack_weights
        pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        pack.restype = None
        pack(weights.ctypes.data, packed.ctypes.data)
        return self._bound(packed)

    def bind_packed(self, packed: np.ndarray) -> WeightBoundKernel:
        """Run on weights another kernel of the same packed layout already packed
        (``WeightBoundKernel.packed``; see ``OpKind.packed_weights_layout``): nothing is
        packed again."""
        if not self.prepacks_weights or packed.dtype != self._dtype or \
                packed.size != self._packed_floats() or not packed.flags.c_contiguous:
            raise KernelArgumentError(
                f"the kernel for {self.op.text} cannot run on {packed.size} packed floats "
                f"({packed.dtype}); it packs its weights into {self._packed_floats()}")
        return self._bound(packed)

    def _packed_floats(self) -> int:
        size_fn = self._lib.tc_packed_weights_floats
        size_fn.restype = ctypes.c_long
        return int(size_fn())

    def _bound(self, packed: np.ndarray) -> WeightBoundKernel:
        entry = self._lib.tc_kernel_packed
        entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        entry.restype = ctypes.c_int
        timer = self._lib.tc_time_packed
        timer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_long]
        timer.restype = ctypes.c_double
        return WeightBoundKernel(self, packed, entry, timer)


@dataclass(frozen=True)
class WeightBoundKernel:
    """A kernel with its weights packed once; call it without them (``k(X[, bias][, add])``
    for conv2d, ``k(A[, bias])`` for matmuls)."""

    kernel: Kernel
    packed: np.ndarray = field(repr=False)
    entry: Any = field(repr=False)
    timer: Any = field(repr=False)

    @property
    def op(self) -> OpSignature:
        return self.kernel.op

    @property
    def entry_address(self) -> int | None:
        """The address of ``tc_kernel_packed``, a native plan's step entry."""
        return ctypes.cast(self.entry, ctypes.c_void_p).value

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Run on ``inputs`` without the weights (they were bound); returns ``out``."""
        pointers, result = self.kernel._pointers(inputs, out, weights=self.packed.ctypes.data)
        if self.entry(pointers) != 0:
            raise MemoryError(f"kernel for {self.op.text} could not allocate its workspace")
        return result

    def time(self, *inputs: np.ndarray, out: np.ndarray, iters: int) -> float:
        """Seconds for ``iters`` back-to-back calls (weights not repacked), timed in C."""
        pointers, _ = self.kernel._pointers(inputs, out, weights=self.packed.ctypes.data)
        return float(self.timer(pointers, iters))


def rotating_timer(kernel: Kernel, inputs: tuple[np.ndarray, ...], out: np.ndarray,
                   span_bytes: int, bound: WeightBoundKernel | None = None
                   ) -> tuple[Timer, int]:
    """A timer ``run(n) -> seconds for n calls`` of ``kernel`` on ``inputs`` (all of them,
    the weights second) with the weights in as many copies as it takes to exceed
    ``span_bytes`` (at most :data:`MAX_WEIGHT_COPIES`), call i reading copy i mod copies;
    and that number of copies. With ``bound`` (the weights packed once, the first copy)
    the copies are packed, else the kernel reads copies of the weights in place. With
    ``span_bytes`` beyond the caches every call meets its weights in memory, as a model
    whose weights outgrow the caches calls it."""
    weights, rest = inputs[1], (inputs[0], *inputs[2:])
    first = bound
    unit = first.packed.nbytes if first is not None else weights.nbytes
    copies = weight_copies(span_bytes, unit)
    if first is not None:
        held: list[Any] = [first, *(kernel.bind_weights(weights) for _ in range(copies - 1))]
        vectors = [kernel._pointers(rest, out, weights=b.packed.ctypes.data)[0] for b in held]
        entry = first.entry
    else:
        held = [weights, *(aligned_copy(weights) for _ in range(copies - 1))]
        vectors = [kernel._pointers((rest[0], w, *rest[1:]), out)[0] for w in held]
        entry = kernel._entry
    nargs = len(vectors[0])
    table = (ctypes.c_void_p * (nargs * copies))(*(p for v in vectors for p in v))
    address = ctypes.cast(entry, ctypes.c_void_p).value
    timer = time_rotating_function()

    alive = (held, rest, out)  # every array ``table`` points into

    def run(iters: int) -> float:
        assert alive
        return float(timer(address, table, nargs, len(held), iters))
    return run, copies




def load_kernel(op: OpSignature, path: Path) -> Kernel:
    """Load a built shared object as a callable kernel for ``op``; BuildError, before any of
    its code runs, if its bytes do not match the digest recorded when it was built."""
    return Kernel(op, Path(path))
