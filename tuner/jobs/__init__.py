"""Nightly tuning jobs (:mod:`~tunecache.tuner.jobs.run`), spreading them over a Ray farm
(:mod:`~tunecache.tuner.jobs.farm`)."""

from tunecache.tuner.jobs.run import (
    JobOptions,
    JobProgress,
    JobSummary,
    OpSummary,
    SilentProgress,
    collect_workloads,
    measured_schedules,
    merge_workloads,
    model_workloads,
    run_job,
)

__all__ = [
    "JobOptions",
    "JobProgress",
    "JobSummary",
    "OpSummary",
    "SilentProgress",
    "collect_workloads",
    "measured_schedules",
    "merge_workloads",
    "model_workloads",
    "run_job",
]
