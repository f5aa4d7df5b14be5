"""The measurement worker: a separate process that loads kernels, checks them and times them.

Run as ``python -m tunecache.tuner.measure.worker``. It reads one JSON request per line on stdin
and answers one JSON line per request on the protocol pipe (the original stdout; anything a
kernel prints goes to stderr instead). A kernel that crashes or hangs takes down only this
process; the parent (:mod:`tunecache.tuner.measure.runner`) notices, records the outcome and
starts another.

Requests:

* ``{"kind": "kernel", "id": .., "op": text, "path": .so, "timing": {...}, "seed": n}``
* ``{"kind": "numpy", "id": .., "op": text, "threads": n, "timing": {...}, "seed": n}``
* ``{"kind": "race", "id": .., "entries": [{"op": text, "path": .so, ...}, ...],
  "timing": {...}, "seed": n}``: the kernels timed taking turns repeat by repeat
  (:func:`race_calls`), unchecked; ``runtimes_s`` holds one list per entry.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunecache.compiler.backends import BoundKernel, KernelHandle, backend_named
from tunecache.compiler.buffers import aligned_empty
from tunecache.compiler.elements import BFLOAT16_NAN, storage_dtype
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import (
    check_result,
    random_inputs,
    reference,
    weight_copies,
)


class _Inputs:
    """Inputs and float64 references, cached per (op, seed) for a batch of candidates."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], tuple[tuple[np.ndarray, ...], np.ndarray | None]] = {}

    def get(self, op: OpSignature, seed: int, with_reference: bool) -> tuple[
            tuple[np.ndarray, ...], np.ndarray | None]:
        key = (op.text, seed)
        if key not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[key] = (random_inputs(op, seed), None)
        inputs, ref = self._cache[key]
        if with_reference and ref is None:
            ref = reference(op, inputs)
            self._cache[key] = (inputs, ref)
        return inputs, ref


def time_calls(run: Callable[[int], float], timing: dict[str, Any]) -> list[float]:
    """Per-call seconds of each repeat: ``run(n)`` returns the seconds for ``n`` calls.

    One untimed warm-up, then repeats of ``number`` calls each (``number`` chosen so a repeat
    lasts about ``repeat_s``) until at least ``min_repeats`` repeats and ``min_time_s`` in
    total, or ``max_repeats``.
    """
    run(1)
    first = max(run(1), 1e-9)
    number = max(1, int(timing["repeat_s"] / first))
    samples: list[float] = []
    total = 0.0
    while len(samples) < timing["max_repeats"]:
        seconds = run(number)
        samples.append(seconds / number)
        total += seconds
        if len(samples) >= timing["min_repeats"] and total >= timing["min_time_s"]:
            break
    return samples


@dataclass(frozen=True)
class _Timed:
    """A loaded kernel ready to time: ``timer(n)`` returns the seconds of ``n`` calls."""

    timer: Callable[[int], float]
    prepacked: bool
    copies: int


def _kernel_timer(req: dict[str, Any], inputs_cache: _Inputs) -> _Timed | dict[str, Any]:
    """Load, run once (checked against the reference unless ``check`` is false) and wrap
    the kernel of ``req`` in a timer; or the failure's answer."""
    op = OpSignature.parse(req["op"])
    kernel = backend_named(req["backend"]).load(op, req["path"])
    check = bool(req.get("check", True))
    inputs, ref = inputs_cache.get(op, int(req.get("seed", 0)), with_reference=check)
    result = op.arguments()[-1]
    out = aligned_empty(result.shape, storage_dtype(result.dtype))
    # An output the kernel leaves unwritten shows: NaN (a bfloat16 one's bits), or the most
    # negative integer.
    out[...] = (np.nan if out.dtype.kind == "f" else BFLOAT16_NAN if result.dtype == "bfloat16"
                else np.iinfo(out.dtype).min)
    run: KernelHandle | BoundKernel = kernel
    bound: BoundKernel | None = None
    args = inputs
    constant = bool(req.get("prepacked"))  # the kind's weights are a model's constants
    prepacked = constant and kernel.prepacks_weights
    if prepacked:
        # Time what a deployed model runs: constant weights packed once, outside the loop.
        run = bound = kernel.bind_weights(inputs[1])
        args = (inputs[0], *inputs[2:])
    run(*args, out=out)
    if check:
        assert ref is not None
        problem = check_result(op, inputs, out, ref)
        if problem is not None:
            return {"status": "wrong_result", "error": problem}
    span = int(req.get("cold_bytes", 0))
    if constant and span > 0:
        # Constant weights as a model meets them: streamed from memory, not left in cache
        # by the call before (packed once, or read in place, alike).
        timer, copies = kernel.rotating_timer(inputs, out, span, bound)
        return _Timed(timer, prepacked, copies)

    def warm(n: int) -> float:
        return run.time(*args, out=out, iters=n)
    return _Timed(warm, prepacked, 0)


def _measure_kernel(req: dict[str, Any], inputs_cache: _Inputs) -> dict[str, Any]:
    timed = _kernel_timer(req, inputs_cache)
    if not isinstance(timed, _Timed):
        return timed
    samples = time_calls(timed.timer, req["timing"])
    return {"status": "ok", "runtimes_s": samples, "prepacked": timed.prepacked,
            "weight_copies": timed.copies}


def race_calls(timers: Sequence[Callable[[int], float]],
               timing: dict[str, Any]) -> list[list[float]]:
    """Per-call seconds of each timer's repeats, the timers taking turns repeat by repeat
    (each round starting one timer later), so that every round meets the machine in the
    same state for all of them: a slow phase of a shared machine lands on the same rounds
    of every timer instead of on one timer's whole measurement.

    Each timer gets one untimed warm-up and ``number`` calls per repeat sized to last about
    ``repeat_s``; rounds go on until ``min_repeats`` rounds and ``min_time_s`` per timer on
    average, or ``max_repeats`` rounds.
    """
    numbers = []
    for run in timers:
        run(1)
        numbers.append(max(1, int(timing["repeat_s"] / max(run(1), 1e-9))))
    samples: list[list[float]] = [[] for _ in timers]
    total = 0.0
    for round_ in range(int(timing["max_repeats"])):
        for k in range(len(timers)):
            i = (round_ + k) % len(timers)
            seconds = timers[i](numbers[i])
            samples[i].append(seconds / numbers[i])
            total += seconds
        if round_ + 1 >= timing["min_repeats"] and total >= timing["min_time_s"] * len(timers):
            break
    return samples


def _race_kernels(req: dict[str, Any], inputs_cache: _Inputs) -> dict[str, Any]:
    """Time the kernels of ``req["entries"]`` (kernel requests without id or timing)
    against each other, repeat by repeat (:func:`race_calls`); a failure of any one of
    them is the answer."""
    timed = []
    for entry in req["entries"]:
        one = _kernel_timer({**entry, "seed": req.get("seed", 0), "check": False},
                            inputs_cache)
        if not isinstance(one, _Timed):
            return one
        timed.append(one)
    samples = race_calls([t.timer for t in timed], req["timing"])
    return {"status": "ok", "runtimes_s": samples,
            "prepacked": [t.prepacked for t in timed],
            "weight_copies": [t.copies for t in timed]}


def _numpy_runner(op: OpSignature, inputs: tuple[np.ndarray, ...],
                  span_bytes: int = 0) -> Callable[[int], float]:
    """Times the kind's numpy reference on the float32 inputs (the ``numpy`` baseline);
    with ``span_bytes``, on copies of the weights (second input) rotated past that many
    bytes, as kernels with constant weights are timed (``rotating_timer``)."""
    kind = op_kind(op.kind)
    if kind.baseline != "numpy":
        raise ValueError(f"numpy is not the {op.kind} baseline ({kind.baseline} is)")
    reference = kind.reference
    rotated = [inputs]
    if span_bytes > 0:  # only ops with constant weights (a second input) are asked to
        weights = inputs[1]
        rotated += [(inputs[0], weights.copy(), *inputs[2:])
                    for _ in range(weight_copies(span_bytes, weights.nbytes) - 1)]
    copies = len(rotated)

    def run(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            reference(op, rotated[i % copies])
        return time.perf_counter() - start

    return run


def _measure_numpy(req: dict[str, Any], inputs_cache: _Inputs) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    op = OpSignature.parse(req["op"])
    inputs, _ = inputs_cache.get(op, int(req.get("seed", 0)), with_reference=False)
    span = int(req.get("cold_bytes", 0))
    with threadpool_limits(limits=int(req["threads"]), user_api="blas"):
        samples = time_calls(_numpy_runner(op, inputs, span), req["timing"])
    return {"status": "ok", "runtimes_s": samples}


def serve(stdin: Any, proto: Any) -> None:
    """Answer requests until stdin closes."""
    inputs_cache = _Inputs()
    handlers = {"kernel": _measure_kernel, "numpy": _measure_numpy, "race": _race_kernels}
    for line in stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        proto.write(json.dumps({"id": req["id"], "event": "started"}) + "\n")
        proto.flush()
        try:
            answer = handlers[req["kind"]](req, inputs_cache)
        except Exception as exc:  # a failure of this candidate is data, not a worker crash
            answer = {"status": "runtime_error", "error": f"{type(exc).__name__}: {exc}"}
        answer.update(id=req["id"], event="done")
        proto.write(json.dumps(answer) + "\n")
        proto.flush()


def main() -> None:
    # Keep the protocol on a private copy of stdout; kernels' stray output goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    proto.write(json.dumps({"event": "ready", "pid": os.getpid()}) + "\n")
    proto.flush()
    serve(sys.stdin, proto)


if __name__ == "__main__":
    main()
