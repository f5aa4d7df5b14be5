"""The Ray farm on a real local multi-node cluster (loopback), including a node that dies."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tunecache.compiler.kinds.matmul import matmul_op

ray = pytest.importorskip("ray", reason="the farm extra (ray) is not installed")
from ray.cluster_utils import Cluster  # noqa: E402

from tunecache.cache.store import Store  # noqa: E402
from tunecache.compiler.hardware import local_spec  # noqa: E402
from tunecache.datasets.suites import Workload  # noqa: E402
from tunecache.tuner.jobs import JobOptions  # noqa: E402
from tunecache.tuner.jobs.farm import (  # noqa: E402
    FarmPlan,
    hw_resource,
    run_farm_job,
    worker_env,
)

HW = local_spec()
OPS = [matmul_op(16 + 8 * i, 32, 24, epilogue="bias") for i in range(4)]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch):
    # The nodes start as `tunecache farm worker` starts them: workers not niced.
    for name, value in worker_env().items():
        monkeypatch.setenv(name, value)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [c.add_node(num_cpus=1, resources={hw_resource(HW.hw_id): 1}) for _ in range(2)]
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def test_farm_tunes_on_matching_nodes_and_survives_a_dead_node(cluster, tmp_path: Path) -> None:
    c, nodes = cluster
    other = replace(HW, cores=HW.cores + 64)  # a hardware no node has
    plan = [FarmPlan(HW, tuple(Workload(op, 1, "t") for op in OPS)),
            FarmPlan(other, (Workload(OPS[0], 1, "x"),))]

    killed_at: list[float] = []

    def kill_one_node() -> None:
        store = Store(tmp_path)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(store.fragments()) < 2:
            time.sleep(0.05)
        c.remove_node(nodes[0], allow_graceful=False)
        killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill_one_node)
    killer.start()
    summaries = run_farm_job(c.address, plan, str(tmp_path),
                             JobOptions(trials=3, refine=False, baseline=False, job_id="farm"),
                             timeout_s=600)
    finished_at = time.monotonic()
    killer.join()
    assert killed_at and killed_at[0] < finished_at, "the node should die mid-job"
    ours, missing = summaries
    assert sorted(o.op.text for o in ours.ops) == sorted(op.text for op in OPS)
    assert all(o.status in ("tuned", "skipped") for o in ours.ops), [o.note for o in ours.ops]
    assert missing.ops == [] and "no farm node offers" in missing.problems[0]
    frame = Store(tmp_path).load()
    assert frame["record_id"].is_unique
    tried = frame[frame["source"] != "confirm"]  # the finalists' repeats aside
    assert not tried[["op_text", "schedule_id"]].duplicated().any()
    assert frame.groupby("op_text")["schedule_id"].nunique().to_dict() == {op.text: 3 for op in OPS}
    assert set(frame["hw_id"]) == {HW.hw_id}
