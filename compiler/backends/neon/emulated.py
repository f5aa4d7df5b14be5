"""Kernel handles for aarch64 kernels that run outside this process: each call writes the
arguments to files, runs the harness program on the emulator (qemu-user) and reads the
output back. Correct, and slow: for checking kernels built for a machine that is not here,
never for timing it (an emulator's seconds say nothing of the machine's)."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tunecache.compiler.backends import BoundKernel, Timer
from tunecache.compiler.backends.cpu.build import open_verified
from tunecache.compiler.backends.neon.toolchain import emulator, harness
from tunecache.compiler.errors import BuildError, KernelArgumentError
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import checked_call

TIMEOUT_S = 300.0


@dataclass(frozen=True)
class EmulatedKernel:
    """A kernel for ``op`` built into the aarch64 shared object at ``path``, run under
    emulation; call it as ``kernel(A, B, ..., out=None)``."""

    op: OpSignature
    path: Path

    @property
    def entry_address(self) -> int | None:
        return None  # not in this process: a compiled model calls it step by step

    @property
    def prepacks_weights(self) -> bool:
        return False

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Run the kernel; returns ``out`` (allocated if not given)."""
        out = checked_call(self.op, inputs, out)
        self._run(inputs, out, iters=0)
        return out

    def time(self, *inputs: np.ndarray, out: np.ndarray, iters: int) -> float:
        """Seconds of ``iters`` calls on the emulator (not the target machine's)."""
        out = checked_call(self.op, inputs, out)
        return self._run(inputs, out, iters=max(1, iters))

    def bind_weights(self, weights: np.ndarray) -> BoundKernel:
        raise KernelArgumentError(f"the kernel for {self.op.text} runs under emulation and "
                                  "reads its weights in place")

    def bind_packed(self, packed: np.ndarray) -> BoundKernel:
        return self.bind_weights(packed)

    def rotating_timer(self, inputs: tuple[np.ndarray, ...], out: np.ndarray, span_bytes: int,
                       bound: BoundKernel | None = None) -> tuple[Timer, int]:
        """One copy of the weights: an emulator has no caches worth rotating past."""
        return (lambda n: self.time(*inputs, out=out, iters=n)), 1

    def _run(self, inputs: tuple[np.ndarray, ...], out: np.ndarray, iters: int) -> float:
        arrays = (*inputs, out)
        with tempfile.TemporaryDirectory(prefix="tunecache-neon-") as folder:
            files = [Path(folder) / f"arg{i}.bin" for i in range(len(arrays))]
            for file, array in zip(files, arrays, strict=True):
                file.write_bytes(array.tobytes())
            command = [str(len(arrays) - 1), str(len(arrays))]
            for file, array in zip(files, arrays, strict=True):
                command += [str(file), str(array.nbytes)]
            seconds = self._execute(command, iters)
            out[...] = np.frombuffer(files[-1].read_bytes(), dtype=out.dtype).reshape(out.shape)
        return seconds

    def _execute(self, arguments: list[str], iters: int) -> float:
        # Both programs are checked against their build records before the emulator runs them.
        with open_verified(harness()) as program, open_verified(self.path) as library:
            try:
                done = subprocess.run([*emulator(), program, library, str(iters), *arguments],
                                      capture_output=True, text=True, timeout=TIMEOUT_S,
                                      check=False)
            except subprocess.TimeoutExpired:
                raise BuildError(f"the kernel for {self.op.text} ran past {TIMEOUT_S:.0f} s "
                                 "under emulation") from None
        if done.returncode == 5:
            raise MemoryError(f"kernel for {self.op.text} could not allocate its workspace")
        if done.returncode != 0:
            raise BuildError(f"the emulated kernel for {self.op.text} failed (exit "
                             f"{done.returncode}): {done.stderr.strip()[:2000]}")
        return float(done.stdout.strip() or 0.0)
