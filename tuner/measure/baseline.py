"""The baseline a kernel is compared with, chosen by its kind (``OpKind.baseline``):
``numpy`` (the kind's numpy reference on float32 inputs, timed in the runner's numpy worker at
the same thread count) or ``onnxruntime`` (a one-node model, when onnxruntime is installed).

A baseline is timed like a kernel: when its median repeat is more than the runner's noise
tolerance slower than its fastest, it is timed again (up to ``noise_retries`` times) and the
quietest attempt kept. One still that noisy is not a figure to divide by:
:func:`baseline_is_noisy` says so, and the job summary shows no ratio for it."""

from __future__ import annotations

from collections.abc import Callable

from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.tuner.measure.runner import MeasureResult, Runner, TimingConfig, noisy


def measure_baseline(op: OpSignature, threads: int, runner: Runner) -> MeasureResult | None:
    """The baseline's measurement for ``op``, or None when the kind has none or its peer is
    not installed. ``result.source`` names the baseline."""
    name = op_kind(op.kind).baseline
    if name == "numpy":
        return _quietest(lambda: runner.measure_numpy(op, threads), runner.timing)
    if name == "onnxruntime":
        return _quietest(lambda: onnxruntime_baseline(op, threads, runner.timing),
                         runner.timing)
    return None


def baseline_is_noisy(result: MeasureResult, timing: TimingConfig) -> bool:
    """Whether an ``ok`` baseline's repeats spread beyond ``timing.noise_tolerance``."""
    return result.ok and noisy(result.runtimes_s, timing.noise_tolerance)


def _quietest(measure: Callable[[], MeasureResult | None],
              timing: TimingConfig) -> MeasureResult | None:
    """``measure()``, repeated while noisy (up to ``timing.noise_retries`` more times); the
    attempt with the lowest median. A failed retime keeps what was measured."""
    result = measure()
    for _ in range(timing.noise_retries):
        if result is None or not baseline_is_noisy(result, timing):
            break
        again = measure()
        if again is None or not again.ok:
            break
        if (again.median_s or float("inf")) < (result.median_s or float("inf")):
            result = again
    return result


def onnxruntime_baseline(op: OpSignature, threads: int,
                         timing: TimingConfig) -> MeasureResult | None:
    """onnxruntime on a one-node model of ``op``, or None when onnx/onnxruntime are not
    installed. Epilogue steps other than ``bias`` are left out of the model: the figure is for
    the operator itself."""
    try:
        from tunecache.tuner.measure.onnx_baseline import time_onnxruntime_conv
    except ImportError:
        return None
    samples = time_onnxruntime_conv(op, threads, timing.request(), seed=timing.seed)
    return MeasureResult(op=op, schedule=None, status="ok", runtimes_s=tuple(samples),
                         source="onnxruntime")
