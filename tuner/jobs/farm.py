"""Spreading a tuning job over a Ray cluster of (possibly different) machines.

Each farm node joins the cluster with a custom resource named after its hardware,
``tunecache-hw:<hw_id>``, of capacity 1 (``tunecache farm worker``). Tuning one op is a Ray
task that asks for one unit of the target hardware's resource, so

* it runs only on a node whose ``hw_id`` matches the target, and
* at most one op — hence one measurement — runs per node at a time; the task compiles its
  candidates in parallel threads and measures them one by one in its own worker process.

Results go to a shared store root (a shared filesystem or an object store URI). Each task
appends every measurement as soon as it exists and skips schedules the store already has for
the op, so when a node dies mid-op and Ray retries the task on another node, nothing is lost
and no record is written twice.

Ray is an optional extra: ``pip install 'tunecache[farm]'``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.suites import Workload
from tunecache.tuner.jobs.run import JobOptions, JobProgress, JobSummary, OpSummary, SilentProgress

RESOURCE_PREFIX = "tunecache-hw:"
TASK_RETRIES = 3


class FarmError(TunecacheError):
    """The cluster cannot be reached or used."""


def hw_resource(hw_id: str) -> str:
    """The custom resource a node offers for its hardware (capacity 1)."""
    return RESOURCE_PREFIX + hw_id


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FarmError("the Ray farm needs Ray: pip install 'tunecache[farm]'") from None
    return ray


WORKER_ENV = {"RAY_worker_niceness": "0"}
"""Ray starts its workers niced; ours time kernels, and on a busy machine a niced process is
starved: measurements turn meaningless and jobs crawl. A value already set is kept."""


def worker_env() -> dict[str, str]:
    """The environment ``ray start`` runs in on a farm node (see :data:`WORKER_ENV`)."""
    return {**WORKER_ENV, **os.environ}


def worker_command(address: str, hw: HardwareSpec, *, block: bool = True,
                   num_cpus: int | None = None) -> list[str]:
    """The ``ray start`` command that joins this machine to the farm at ``address``."""
    beside = Path(sys.executable).parent / "ray"
    ray_bin = str(beside) if beside.exists() else shutil.which("ray")
    if ray_bin is None:
        raise FarmError("the `ray` command is not on PATH: pip install 'tunecache[farm]'")
    import json

    cmd = [ray_bin, "start", f"--address={address}",
           f"--resources={json.dumps({hw_resource(hw.hw_id): 1})}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if block:
        cmd.append("--block")
    return cmd


def join_farm(address: str, hw: HardwareSpec, *, block: bool = True) -> int:
    """Run ``ray start`` for this node; returns its exit status."""
    return subprocess.call(worker_command(address, hw, block=block), env=worker_env())


def _tune_remote(op_text: str, hw_json: str, root: str, options: dict[str, Any],
                 job_id: str) -> dict[str, Any]:
    """Body of the Ray task: tune one op on this node into the shared store."""
    from tunecache.cache.store import Store
    from tunecache.tuner.jobs.run import run_job

    hw = HardwareSpec.from_json(hw_json)
    op = OpSignature.parse(op_text)
    summary = run_job([Workload(op, 1, "farm")], hw, Store(root),
                      JobOptions(**options, job_id=job_id))
    item = summary.ops[0].to_dict()
    import socket

    item["host"] = socket.gethostname()
    return item


@dataclass(frozen=True, slots=True)
class FarmPlan:
    """Which hardware each op is tuned for."""

    hw: HardwareSpec
    workloads: tuple[Workload, ...]


def run_farm_job(
    address: str,
    plan: Sequence[FarmPlan],
    root: str,
    options: JobOptions,
    *,
    progress: JobProgress | None = None,
    timeout_s: float | None = None,
) -> list[JobSummary]:
    """Tune every planned op on a node of its hardware; one summary per hardware.

    Ops are submitted heaviest first; the per-job budget and per-op deadlines of a local job
    do not apply across the cluster (each op task uses ``options.trials``), but
    ``timeout_s`` bounds the whole run: ops not finished by then are reported as such.
    """
    ray = _ray()
    progress = progress or SilentProgress()
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # Ray raises several types for an unreachable cluster
            raise FarmError(f"cannot join the Ray cluster at {address}: {exc}") from None
    available = ray.cluster_resources()
    remote = ray.remote(_tune_remote)
    job_id = options.job_id or f"farm-{time.strftime('%Y%m%d-%H%M%S')}"
    task_options = {
        "budget_s": None, "trials": options.trials, "retune": options.retune,
        "refine": options.refine, "threads": options.threads, "baseline": options.baseline,
        "explore": options.explore,
    }
    summaries: list[JobSummary] = []
    pending: dict[Any, tuple[JobSummary, Workload]] = {}
    started = time.monotonic()
    for item in plan:
        summary = JobSummary(job_id, item.hw.hw_id, root)
        summaries.append(summary)
        resource = hw_resource(item.hw.hw_id)
        if available.get(resource, 0) < 1:
            summary.problems.append(
                f"no farm node offers {resource}: start one with "
                f"`tunecache farm worker --address {address}` on such a machine")
            continue
        for workload in sorted(item.workloads, key=lambda w: -w.weight):
            ref = remote.options(resources={resource: 1}, num_cpus=1,
                                 max_retries=TASK_RETRIES, retry_exceptions=False).remote(
                workload.op.text, item.hw.to_json(), root, task_options, job_id)
            pending[ref] = (summary, workload)
    while pending:
        remaining = None if timeout_s is None else timeout_s - (time.monotonic() - started)
        if remaining is not None and remaining <= 0:
            break
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
        for ref in ready:
            summary, workload = pending.pop(ref)
            try:
                data = ray.get(ref)
                item_summary = _from_dict(workload, data)
            except Exception as exc:  # the task failed on every retry
                item_summary = OpSummary(workload.op, workload.label, workload.count,
                                         "no_result", 0, 0.0, note=f"farm task failed: {exc}")
            summary.ops.append(item_summary)
            progress.op_finished(item_summary)
    for summary, workload in pending.values():
        summary.ops.append(OpSummary(workload.op, workload.label, workload.count, "interrupted",
                                     0, 0.0, note="not finished before the farm timeout"))
        summary.interrupted = True
    elapsed = time.monotonic() - started
    for summary in summaries:
        summary.seconds = elapsed
    return summaries


def _from_dict(workload: Workload, data: dict[str, Any]) -> OpSummary:
    note = data.get("note")
    host = data.get("host")
    if host:
        note = f"{note}; on {host}" if note else f"on {host}"
    return OpSummary(workload.op, workload.label, workload.count, data["status"],
                     int(data["trials"]), float(data["seconds"]), data.get("best_gflops"),
                     data.get("best_schedule"), data.get("baseline"),
                     data.get("baseline_gflops"), note)
