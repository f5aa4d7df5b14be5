"""Measurement: build and time candidate kernels safely, every outcome a value.

:mod:`~tunecache.tuner.measure.runner` drives isolated worker processes
(:mod:`~tunecache.tuner.measure.worker`); :mod:`~tunecache.tuner.measure.baseline` times what a
kernel is compared with (numpy, or onnxruntime via :mod:`~tunecache.tuner.measure.onnx_baseline`).
"""

from tunecache.tuner.measure.runner import (
    STATUSES,
    Candidate,
    MeasureResult,
    Progress,
    Runner,
    TimingConfig,
    WorkerCrashed,
    WorkerProcess,
    best,
    measure,
    noisy,
)

__all__ = [
    "STATUSES",
    "Candidate",
    "MeasureResult",
    "Progress",
    "Runner",
    "TimingConfig",
    "WorkerCrashed",
    "WorkerProcess",
    "best",
    "measure",
    "noisy",
]
