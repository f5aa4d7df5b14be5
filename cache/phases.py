"""How fast the machine ran during each tuning job, from the schedules jobs measured in common.

A shared machine has slow and fast phases that outlast a job: on the AVX2 Zen 3 VM, a
job's every measurement of the same kernels read 25% slower than a job of the day
before. Ranking schedules by the median of their raw medians then favours a schedule
measured once in a fast phase over a better one measured again in slow ones (BERT's and
GPT-2's FFN down-projection served a 13x8 tile measured once at 3.67 ms over the 4x24 tile
the same job timed at 3.55 ms, because two later, slower jobs timed the 4x24 again).

Every job measures the incumbent it starts from (and often more schedules that earlier
jobs measured), so jobs of one op and hardware are linked by schedules measured in both.
The model, per group (hardware, op, codegen version, compiler), in log seconds::

    log t(record) = speed(schedule) + phase(job) + noise

is fitted by alternating medians over the linking schedules only (each measured by two
jobs or more), Tukey's median polish on a sparse table, and each group's phases are
centred on their median. A job that shares no schedule with another keeps phase 0: one job
alone cannot tell its machine's phase from its schedules' speed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

ROUNDS = 8
"""Alternations of the median polish; the phases settle within a few on real stores."""


def job_phases(df: pd.DataFrame, group_keys: Sequence[str]) -> np.ndarray:
    """Per row of ``df``, the log-scale phase of the job that measured it (0: unknown).

    ``df`` has the ``group_keys`` columns, ``schedule_id``, ``job_id`` and a positive
    ``median_s``. A record without a job, or of a job that shares fewer than two schedules
    with other jobs of its group, is not linked and keeps phase 0.
    """
    phase = np.zeros(len(df))
    if len(df) == 0:
        return phase
    group = df.groupby(list(group_keys), observed=True, sort=False,
                       dropna=False).ngroup().to_numpy()
    frame = pd.DataFrame({
        "group": group,
        "schedule": df["schedule_id"].astype(str).to_numpy(),
        "job": df["job_id"].astype(object).to_numpy(),
        "log_t": np.log(df["median_s"].to_numpy(dtype=np.float64)),
    })
    links = _linking(frame[frame["job"].notna()].astype({"job": str}))
    if links.empty:
        return phase
    fitted = _polish(links)
    keys = pd.MultiIndex.from_frame(frame[["group", "job"]])
    found = fitted.reindex(keys).to_numpy()
    return np.where(np.isnan(found), 0.0, found)


def _linking(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that tie jobs together: schedules measured by two jobs or more, in jobs
    that measured two such schedules or more (a job of one schedule tells its phase and
    that schedule's speed apart no better than a single measurement does)."""
    while not frame.empty:
        jobs = frame.groupby(["group", "schedule"])["job"].transform("nunique")
        schedules = frame.groupby(["group", "job"])["schedule"].transform("nunique")
        kept = (jobs.to_numpy() >= 2) & (schedules.to_numpy() >= 2)
        if kept.all():
            break
        frame = frame[kept]
    return frame


def _polish(links: pd.DataFrame) -> pd.Series:
    """Each (group, job)'s phase fitted on the linking rows (median polish)."""
    by_schedule = [links["group"], links["schedule"]]
    by_job = [links["group"], links["job"]]
    phase = pd.Series(0.0, index=links.index)
    fitted = pd.Series(dtype=np.float64)
    for _ in range(ROUNDS):
        speed = (links["log_t"] - phase).groupby(by_schedule).transform("median")
        fitted = (links["log_t"] - speed).groupby(by_job).median()
        fitted -= fitted.groupby(level=0).transform("median")
        phase = pd.Series(fitted.reindex(pd.MultiIndex.from_arrays(by_job)).to_numpy(),
                          index=links.index)
    return fitted
