"""Deploy-time compilation: an ONNX model against the cache, under a compile-time policy.

:func:`compile_model` loads the graph, looks every kernel op up in the published cache of
this hardware, lets the :class:`~tunecache.tuner.deploy.policy.Policy` decide on each miss (use a
guess, measure a few candidates now, or run numpy), records every miss in the wanted list
for the next nightly job, builds the kernels (through the artifact cache, in parallel) and
returns a :class:`CompiledModel` whose ``plan`` explains each decision and whose ``run``
executes the graph with the generated kernels.

A warm compile (every kernel cached and built) runs no C compiler: it regenerates the C
source from the validated schedule, finds the artifact by its hash and loads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunecache.cache.index import Index
from tunecache.cache.store import Store
from tunecache.cache.wanted import add_wanted
from tunecache.compiler import frontend
from tunecache.compiler.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.executor import Executor, Kernel, numpy_kernel
from tunecache.compiler.hardware import HardwareSpec, ensure_runnable, local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import load_kernel
from tunecache.compiler.schedule import Schedule
from tunecache.tuner.deploy.policy import Decision, Policy, PolicyConfig
from tunecache.tuner.measure import Runner, TimingConfig
from tunecache.tuner.measure.records import to_records
from tunecache.tuner.search import Ranker, TuneConfig, tune_op


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """The decision for one kernel node of the graph."""

    node: str
    fused: tuple[str, ...]
    op: OpSignature
    action: str
    source: str
    reason: str
    expected_s: float | None
    schedule: Schedule | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "fused": list(self.fused), "op": self.op.text,
            "op_id": self.op.op_id, "action": self.action, "source": self.source,
            "reason": self.reason, "expected_ms": None if self.expected_s is None
            else self.expected_s * 1e3,
            "schedule": self.schedule.to_dict() if self.schedule else None,
        }


@dataclass
class CompiledModel:
    """A graph with a kernel (or numpy fallback) per kernel node. Call :meth:`run`."""

    graph: frontend.Graph
    plan: list[PlanEntry]
    kernels: dict[str, Kernel]
    hw: HardwareSpec
    timings: dict[str, float] = field(default_factory=dict)
    _executor: Executor | None = field(default=None, init=False, repr=False)

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            self._executor = Executor(self.graph, dict(self.kernels))
        return self._executor

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model; returns its outputs by name."""
        return self.executor.run(inputs)

    def summary(self) -> dict[str, Any]:
        actions: dict[str, int] = {}
        for entry in self.plan:
            actions[entry.action] = actions.get(entry.action, 0) + 1
        return {"model": self.graph.name, "hw_id": self.hw.hw_id, "kernel_nodes": len(self.plan),
                "actions": actions, "timings_s": self.timings,
                "plan": [e.to_dict() for e in self.plan]}


def _index(store: Store, hw: HardwareSpec) -> Index | None:
    try:
        return Index(store.location, hw.hw_id)
    except Exception:  # a broken store must not break a deploy; it then just misses
        return None


def compile_model(
    path: str | Path,
    *,
    store: Store | str | None = None,
    policy: str | PolicyConfig = "balanced",
    expected_calls: int = 1000,
    deadline_s: float | None = None,
    hw: HardwareSpec | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    model: Ranker | None = None,
    clock: Callable[[], float] = time.monotonic,
    record_wanted: bool = True,
    use_model: bool = True,
) -> CompiledModel:
    """Compile the ONNX model at ``path`` against ``store``'s cache (see the module doc)."""
    t0 = time.perf_counter()
    hw = hw or local_spec()
    store = store if isinstance(store, Store) else Store(store)
    config = policy if isinstance(policy, PolicyConfig) else PolicyConfig(
        name=policy, expected_calls=expected_calls, deadline_s=deadline_s)
    graph = frontend.load_graph(path, input_shapes)
    t_load = time.perf_counter()
    index = _index(store, hw)
    if model is None and use_model and config.name in ("balanced", "tune"):
        model = _current_model(store, hw)
    decider = Policy(config, hw, model=model, clock=clock)
    plan: list[PlanEntry] = []
    misses: dict[OpSignature, int] = {}
    decisions: dict[OpSignature, Decision] = {}
    runner: Runner | None = None
    try:
        for node in graph.kernel_nodes:
            op = node.op
            decision = decisions.get(op)
            if decision is None:
                entry = index.lookup(op) if index is not None else None
                hit_note = (f": measured {entry.median_s * 1e3:.3f} ms "
                            f"({entry.n_measurements} measurement(s), {entry.source})"
                            if entry is not None else "")
                decision = decider.decide(op, entry.schedule if entry else None,
                                          entry.median_s if entry else None, hit_note)
                if decision.action == "measure":
                    runner = runner or Runner(hw, TimingConfig(min_time_s=0.05, min_repeats=5))
                    decision = _measure_now(op, hw, store, runner, decision, config, model)
                decisions[op] = decision
            if decision.action != "cache":
                misses[op] = misses.get(op, 0) + 1
            plan.append(PlanEntry(node.name, node.nodes, op, decision.action, decision.source,
                                  decision.reason, decision.expected_s, decision.schedule))
    finally:
        if runner is not None:
            runner.close()
    t_decide = time.perf_counter()
    if record_wanted and misses:
        add_wanted(store.location, hw.hw_id,
                   [(op, count, graph.name or Path(path).name) for op, count in misses.items()])
    kernels = _build_kernels(plan, hw)
    t_build = time.perf_counter()
    compiled = CompiledModel(graph, plan, kernels, hw)
    compiled.timings = {"load_s": t_load - t0, "decide_s": t_decide - t_load,
                        "build_s": t_build - t_decide, "total_s": t_build - t0}
    return compiled


def _current_model(store: Store, hw: HardwareSpec) -> Ranker | None:
    """The store's current cost model for ``hw``; None if absent or unusable (never fatal)."""
    from tunecache.costmodel import registry

    try:
        model: Ranker | None = registry.load_current(store.location, hw)
    except Exception:  # a damaged model must not break a deploy; the tiler ranks instead
        return None
    return model


def _measure_now(op: OpSignature, hw: HardwareSpec, store: Store, runner: Runner,
                 decision: Decision, config: PolicyConfig, model: Ranker | None) -> Decision:
    job_id = f"compile-{time.strftime('%Y%m%d-%H%M%S')}"

    def sink(result: Any) -> None:
        store.append(to_records([result], hw, job_id=job_id))

    result = tune_op(op, hw, runner, config=TuneConfig(trials=config.trials, refine=False),
                     model=model, sink=sink)
    best = result.best
    if best is None or best.schedule is None:
        return Decision("guess", decision.schedule, "tiler",
                        decision.reason + "; every measured candidate failed, using the guess",
                        decision.expected_s, decision.tuning_cost_s)
    return Decision("measure", best.schedule, "measured",
                    decision.reason + f"; best measured {(best.median_s or 0.0) * 1e3:.3f} ms "
                    f"of {result.trials}", best.median_s, decision.tuning_cost_s)


def _build_kernels(plan: Sequence[PlanEntry], hw: HardwareSpec) -> dict[str, Kernel]:
    """Generate and build (in parallel, through the artifact cache) every planned kernel."""
    ensure_runnable(hw)
    wanted: dict[tuple[OpSignature, Schedule], list[str]] = {}
    kernels: dict[str, Kernel] = {}
    for entry in plan:
        if entry.schedule is None:
            kernels[entry.node] = numpy_kernel(entry.op)
        else:
            wanted.setdefault((entry.op, entry.schedule), []).append(entry.node)
    keys = list(wanted)

    def one(key: tuple[OpSignature, Schedule]) -> Kernel:
        op, schedule = key
        return load_kernel(op, build(generate(op, schedule, hw)))

    with ThreadPoolExecutor(max(1, min(4, len(keys)))) as pool:
        built = list(pool.map(one, keys))
    for key, kernel in zip(keys, built, strict=True):
        for node in wanted[key]:
            kernels[node] = kernel
    return kernels
