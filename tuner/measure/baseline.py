"""The baseline a kernel is compared with, chosen by its kind (``OpKind.baseline``):
``numpy`` (the kind's numpy reference on float32 inputs, timed in the runner's numpy worker at
the same thread count) or ``onnxruntime`` (a one-node model, when onnxruntime is installed)."""

from __future__ import annotations

from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.tuner.measure.runner import MeasureResult, Runner, TimingConfig


def measure_baseline(op: OpSignature, threads: int, runner: Runner) -> MeasureResult | None:
    """The baseline's measurement for ``op``, or None when the kind has none or its peer is
    not installed. ``result.source`` names the baseline."""
    name = op_kind(op.kind).baseline
    if name == "numpy":
        return runner.measure_numpy(op, threads)
    if name == "onnxruntime":
        return onnxruntime_baseline(op, threads, runner.timing)
    return None


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
