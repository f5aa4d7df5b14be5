"""Deploy-time compilation: an ONNX model against the cache, under a compile-time policy.

:func:`compile_model` loads the graph, looks every kernel op up in the published cache of
this hardware, lets the :class:`~tunecache.tuner.deploy.policy.Policy` decide on each miss (use a
guess, measure a few candidates now, or run numpy), records every miss in the wanted list
for the next nightly job, builds the kernels (through the artifact cache, in parallel) and
returns a :class:`CompiledModel` whose ``plan`` explains each decision and whose ``run``
executes the graph with the generated kernels. A model with dynamic input dimensions compiles
once and plans each new input shape on its first run, the same way (docs/ONNX.md, "Dynamic
shapes").

A warm compile (every kernel cached and built) runs no C compiler: it regenerates the C
source from the validated schedule, finds the artifact by its hash and loads it.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from tunecache.cache.errors import StoreWarning
from tunecache.cache.nearest import CacheView, Served, serving_view
from tunecache.cache.store import Store
from tunecache.cache.wanted import add_wanted
from tunecache.compiler import frontend, onnx_ops
from tunecache.compiler.backends import backend_for
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import BuildError, TunecacheError
from tunecache.compiler.executor import Executor, Kernel, check_inputs, numpy_kernel
from tunecache.compiler.graph import VIEW_OPS, Graph, ModelError, TensorInfo
from tunecache.compiler.hardware import HardwareSpec, local_spec, machine_cpus
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.native import NativeProgram, PlanMismatch
from tunecache.compiler.native.profile import ProgramProfile
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.passes import plan_graph
from tunecache.compiler.precision import (
    PRECISIONS,
    PrecisionPlan,
    apply_precision,
    int8_kernels_pay,
)
from tunecache.compiler.schedule import Schedule, default_schedule, in_model, problems
from tunecache.costmodel.analytic import estimate
from tunecache.tuner.deploy.policy import Decision, Policy, PolicyConfig
from tunecache.tuner.measure import Runner, TimingConfig
from tunecache.tuner.measure.records import to_records
from tunecache.tuner.search import Ranker, TuneConfig, tune_op
from tunecache.tuner.search.refit import Nearest

if TYPE_CHECKING:
    from tunecache.tuner.deploy.package import SavedPackage


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
    served_from: Mapping[str, object] | None = None
    """Where a cached schedule came from (:meth:`Served.provenance`): exact or nearest
    hardware, its distance and store; None for schedules the cache did not offer."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "fused": list(self.fused), "op": self.op.text,
            "op_id": self.op.op_id, "action": self.action, "source": self.source,
            "reason": self.reason, "expected_ms": None if self.expected_s is None
            else self.expected_s * 1e3,
            "schedule": self.schedule.to_dict() if self.schedule else None,
            "served_from": dict(self.served_from) if self.served_from else None,
        }


DEFAULT_MAX_SHAPES = 16
"""How many input shapes a model with dynamic dimensions keeps planned besides its
compile-time one (least recently run dropped first)."""

ShapeKey = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ShapeStats:
    """One planned input shape: the shapes by input, its compile seconds, runs so far."""

    inputs: Mapping[str, tuple[int, ...]]
    compile_s: float
    runs: int
    kernel_nodes: int

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": {k: list(v) for k, v in self.inputs.items()},
                "compile_s": self.compile_s, "runs": self.runs, "kernel_nodes": self.kernel_nodes}


@dataclass
class CompiledModel:
    """A graph with a kernel (or numpy fallback) per kernel node. Call :meth:`run`.

    ``graph``, ``plan`` and ``kernels`` are the input shape planned at compile time. A model
    with dynamic input dimensions (``info.dynamic``) runs at any shape its declared
    dimensions allow: each other shape is planned on its first run by ``specialise`` (the
    same load, policy, wanted-list recording and kernel build as the compile) and kept, up
    to ``max_shapes`` of them, the least recently run dropped first. When no shape was known
    at compile time, ``graph`` is the interface only (no steps) and ``plan`` is empty.
    """

    graph: Graph
    plan: list[PlanEntry]
    kernels: dict[str, Kernel]
    hw: HardwareSpec
    timings: dict[str, float] = field(default_factory=dict)
    info: frontend.ModelInfo | None = None
    specialise: Callable[[Mapping[str, tuple[int, ...]], Mapping[str, Schedule]],
                         CompiledModel] | None = field(default=None, repr=False)
    max_shapes: int = DEFAULT_MAX_SHAPES
    evicted: int = field(default=0, init=False)
    native: bool = True
    """Run through one native program (arena + plan + C runner); off: the reference
    executor, node by node in Python."""
    threads: int | None = None
    """The compile's thread bound (None: ``hw.cores``): kernels' schedules keep to it, and
    so do the native program's own copies."""
    precision: PrecisionPlan = field(default_factory=lambda: PrecisionPlan("fp32", "fp32", 0))
    """What the precision policy did (:mod:`tunecache.compiler.precision`)."""
    accuracy: dict[str, Any] | None = None
    """With a precision below fp32: the outputs' error against the float32 graph on the
    compile's sample input (seeded random), per output and worst."""
    blocked_layouts: bool = True
    """Whether activations stay channel-blocked between the kernels that take them."""
    source: frontend.ModelSource | None = field(default=None, repr=False)
    """The model it was compiled from (what a package of it carries)."""
    _executor: Executor | None = field(default=None, init=False, repr=False)
    _program: NativeProgram | None = field(default=None, init=False, repr=False)
    _run_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _shapes: OrderedDict[ShapeKey, CompiledModel] = field(
        default_factory=OrderedDict, init=False, repr=False)
    _runs: dict[ShapeKey, int] = field(default_factory=dict, init=False, repr=False)
    # Planning a new shape happens under the lock: concurrent first runs plan it once.
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _key: ShapeKey | None = field(default=None, init=False, repr=False)

    @property
    def executor(self) -> Executor:
        """The reference executor: the graph walked in Python, node by node."""
        if self._executor is None:
            self._executor = Executor(self.graph, dict(self.kernels))
        return self._executor

    @property
    def program(self) -> NativeProgram | None:
        """The native program runs use (built on the first run, traced on its inputs), or
        None before that or when ``native`` is off."""
        return self._program

    def _execute(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
                 ) -> dict[str, np.ndarray]:
        if not self.native:
            return self.executor.run(inputs)
        # One arena per program: runs of one compiled model take turns.
        with self._run_lock:
            if self._program is None:
                self._program = NativeProgram.build(self.graph, self.kernels, inputs,
                                                    self._packed_layouts(),
                                                    min(self.hw.cores, machine_cpus(),
                                                        self.threads or self.hw.cores),
                                                    backend_for(self.hw).plan_runner())
            try:
                return self._program.run(inputs)
            except PlanMismatch:  # a data-dependent shape: the executor handles any
                return self.executor.run(inputs)

    def save(self, path: str | Path) -> SavedPackage:
        """Save this model (its compile-time input shape) with its kernels and runtime, for
        :func:`~tunecache.tuner.deploy.package.load_compiled` on a machine with no compiler."""
        from tunecache.tuner.deploy.package import save_compiled

        return save_compiled(self, path)

    def _packed_layouts(self) -> dict[str, Hashable]:
        """Per kernel node with a schedule, the layout of its pre-packed weights, where its
        kind names one (shapes of one model then share packed weights)."""
        out: dict[str, Hashable] = {}
        for entry in self.plan:
            layout = op_kind(entry.op.kind).packed_weights_layout
            if layout is not None and entry.schedule is not None:
                out[entry.node] = layout(entry.op, entry.schedule)
        return out

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model; returns its outputs by name. A new shape of a dynamic model is
        planned first (see the class doc; :meth:`shape_stats` tells what it cost)."""
        if self.specialise is None or self.info is None:
            with self._lock:
                key = self._own_key()
                self._runs[key] = self._runs.get(key, 0) + 1
            return self._execute(inputs)
        planned, given = self._planned_for(inputs, count=True)
        return planned._execute(given)

    def _planned_for(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
                     count: bool) -> tuple[CompiledModel,
                                           Mapping[str, np.ndarray] | Sequence[np.ndarray]]:
        """The model planned for the shapes of ``inputs`` (planned now if new) and the
        inputs, checked by name when the model is dynamic."""
        if self.specialise is None or self.info is None:
            return self, inputs
        given = check_inputs(self.info.name, self.info.inputs, inputs, self.info.dim_names)
        key = tuple(tuple(given[i.name].shape) for i in self.info.inputs)
        return self._for_key(key, count=count), given

    def profile(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
                runs: int = 10) -> ProgramProfile:
        """Run on ``inputs`` once, then ``runs`` more times timing each step of the native
        program inside the runner (:meth:`NativeProgram.profile`): where a run's time
        goes, per node, op and kind of step."""
        self.run(inputs)
        target, given = self._planned_for(inputs, count=False)
        with target._run_lock:
            if target._program is None:
                raise TunecacheError("a profile times the native program; this model runs "
                                     "through the reference executor (native=False)")
            return target._program.profile(given, runs)

    def prepare(self, shapes: Mapping[str, Sequence[int]]) -> CompiledModel:
        """Plan and build input ``shapes`` now rather than on their first run; returns the
        model planned for them. Inputs left out take the sizes their dimension names imply
        (``attention_mask [batch, sequence]`` from ``input_ids``)."""
        info = self.info
        if info is None:
            return self
        for name, shape in shapes.items():
            _check_shape(info, name, tuple(int(d) for d in shape))
        complete = info.complete(shapes)
        if complete is None:
            open_inputs = [i.name for i in info.inputs if i.name not in shapes
                           and any(d < 0 for d in i.shape)]
            raise ModelError(
                "the shapes of " + ", ".join(f"{n!r} {info.describe(n)}" for n in open_inputs)
                + " are not determined by the given ones; give them too")
        if self.specialise is None:
            return self
        return self._for_key(tuple(complete[i.name] for i in info.inputs), count=False)

    def shape_stats(self) -> list[ShapeStats]:
        """The planned shapes, the compile-time one first, then least recently run first."""
        with self._lock:
            out = []
            own = self._own_key()
            names = [i.name for i in self.graph.inputs]
            if all(d >= 0 for shape in own for d in shape):
                out.append(ShapeStats(dict(zip(names, own, strict=True)),
                                      self.timings.get("total_s", 0.0), self._runs.get(own, 0),
                                      len(self.plan)))
            for key, compiled in self._shapes.items():
                out.append(ShapeStats(dict(zip(names, key, strict=True)),
                                      compiled.timings.get("total_s", 0.0),
                                      self._runs.get(key, 0), len(compiled.plan)))
            return out

    def summary(self) -> dict[str, Any]:
        actions: dict[str, int] = {}
        for entry in self.plan:
            actions[entry.action] = actions.get(entry.action, 0) + 1
        served: dict[str, int] = {}
        for entry in self.plan:
            where = entry.served_from
            key = f"{where['kind']} ({where['store']})" if where else entry.source
            served[key] = served.get(key, 0) + 1
        out = {"model": self.graph.name, "hw_id": self.hw.hw_id, "kernel_nodes": len(self.plan),
               "actions": actions, "served": served, "timings_s": self.timings,
               "plan": [e.to_dict() for e in self.plan],
               "outside_kernels": self.outside_kernels(),
               "int8_kernels": int8_kernels_pay(self.hw),
               "precision": self.precision.to_dict()}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        if self.info is not None:
            out["dynamic"] = self.info.dynamic
            out["inputs"] = {i.name: self.info.describe(i.name) for i in self.info.inputs}
            out["shapes"] = [s.to_dict() for s in self.shape_stats()]
        return out

    def outside_kernels(self) -> list[dict[str, str]]:
        """The nodes of the compile-time plan that run outside generated kernels (views
        aside), each with what runs it (``onnx_ops.ENGINES``) and why it is no kernel. A
        data-movement node (Transpose, Concat, Slice, …) may still run as the runner's
        strided copy; ``run --profile`` times each step where it runs."""
        opset = self.graph.opset
        return [{"node": s.name, "op": s.op_type,
                 "engine": onnx_ops.engine(s.op_type, opset, s.attrs, s.outputs) or "numpy",
                 "note": s.note}
                for s in self.graph.onnx_nodes if s.op_type not in VIEW_OPS]

    def _own_key(self) -> ShapeKey:
        if self._key is None:
            self._key = tuple(tuple(i.shape) for i in self.graph.inputs)
        return self._key

    def _for_key(self, key: ShapeKey, count: bool) -> CompiledModel:
        assert self.specialise is not None and self.info is not None
        with self._lock:
            if count:
                self._runs[key] = self._runs.get(key, 0) + 1
            if key == self._own_key():
                return self
            planned = self._shapes.get(key)
            if planned is not None:
                self._shapes.move_to_end(key)
                return planned
            names = [i.name for i in self.info.inputs]
            planned = self.specialise(dict(zip(names, key, strict=True)), self._siblings(key))
            self._shapes[key] = planned
            while len(self._shapes) > self.max_shapes:
                dropped, _ = self._shapes.popitem(last=False)
                self._runs.pop(dropped, None)
                self.evicted += 1
            return planned

    def _siblings(self, key: ShapeKey) -> dict[str, Schedule]:
        """Per kernel node, its schedule at the planned shape nearest ``key`` (the most
        elements alike): what a new shape's guesses may share packed weights with."""
        planned = [(own, self) for own in [self._own_key()] if self.plan]
        planned += list(self._shapes.items())
        if not planned:
            return {}

        def distance(other: ShapeKey) -> float:
            return sum(abs(math.log(max(1, math.prod(a)) / max(1, math.prod(b))))
                       for a, b in zip(key, other, strict=True))
        _, nearest = min(planned, key=lambda item: distance(item[0]))
        return {e.node: e.schedule for e in nearest.plan if e.schedule is not None}


def _check_shape(info: frontend.ModelInfo, name: str, shape: tuple[int, ...]) -> None:
    declared = next((i for i in info.inputs if i.name == name), None)
    if declared is None:
        raise ModelError(f"{name!r} is not an input of {info.name!r}; its inputs: "
                         + ", ".join(f"{i.name} {info.describe(i.name)}"
                                     for i in info.inputs))
    if len(shape) != len(declared.shape) or any(
            d >= 0 and d != s for d, s in zip(declared.shape, shape, strict=False)) or any(
            s < 1 for s in shape):
        raise ModelError(f"input {name!r} has shape {list(shape)}; the model expects "
                         f"{info.describe(name)}")


def _toolchain(hw: HardwareSpec) -> str | None:
    """The identity of the toolchain kernels for ``hw`` will be built with (None: there is
    none)."""
    try:
        return backend_for(hw).toolchain()
    except BuildError:
        return None


def _cache_view(store: Store, hw: HardwareSpec) -> CacheView | None:
    """The published caches a compile on ``hw`` serves from: the store's, then the shipped
    seed's, exact hardware first, then the nearest tuned hardware (for this codegen version
    and compiler family).

    The store is never fatal: when it cannot be read (unreachable, damaged, unreadable)
    this warns with the cause, and its ops are misses that the policy decides (a guess, or
    numpy under cache-only).
    """
    try:
        return serving_view(store.location, hw, compiler=_toolchain(hw))
    except Exception as exc:  # whatever the store does, the deploy goes on
        warnings.warn(f"cache of {store.root} unavailable ({type(exc).__name__}: {exc}); "
                      "every op is decided as a cache miss", StoreWarning, stacklevel=3)
        return None


def _offer(served: Served | None, view: CacheView) -> tuple[Schedule | None, float | None,
                                                          str, Nearest | None]:
    """The exact hit (schedule, seconds, note) or the nearest hardware's offer."""
    if served is None:
        return None, None, "", None
    entry = served.entry
    if served.exact:
        where = "" if served.store == "store" else f", {served.store}"
        return (entry.schedule, entry.median_s,
                f": measured {entry.median_s * 1e3:.3f} ms ({entry.n_measurements} "
                f"measurement(s), {entry.source}{where})", None)
    return None, None, "", Nearest.from_served(served, view)


def _record_wanted(store: Store, hw: HardwareSpec,
                   items: Sequence[tuple[OpSignature, int, str | None]]) -> None:
    """Append missed ops to the wanted list, best-effort: a store that cannot take them
    (read-only, full, unreachable) costs a warning naming the cause, not the deploy."""
    try:
        add_wanted(store.location, hw.hw_id, items)
    except Exception as exc:  # the wanted list is advisory
        warnings.warn(f"could not record {len(items)} missed op(s) in the wanted list of "
                      f"{store.root}: {_cause(exc)}", StoreWarning, stacklevel=3)


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def compile_model(
    path: str | Path | frontend.ModelSource,
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
    max_shapes: int = DEFAULT_MAX_SHAPES,
    threads: int | None = None,
    blocked_layouts: bool = True,
    precision: str = "fp32",
) -> CompiledModel:
    """Compile the ONNX model at ``path`` (or read by :func:`frontend.read_model`) against
    ``store``'s cache (see the module doc).

    The input shape is planned now when it is known: every input static, or its dynamic
    dimensions given by ``input_shapes`` (directly or through dimension names). A model with
    dynamic dimensions is otherwise only checked now, and each shape is planned on its
    first run (:class:`CompiledModel`); ``max_shapes`` bounds how many it keeps. With
    ``threads``, no kernel uses more threads than that (schedules with more are re-fitted).
    ``blocked_layouts`` keeps activations channel-blocked between the kernels that take them
    (:mod:`tunecache.compiler.layout_plan`); off, every kernel reads and writes NCHW.
    ``precision`` (:data:`~tunecache.compiler.precision.PRECISIONS`) lets products with
    constant weights run in bf16 where the hardware has bf16 dot products; the compiled
    model then reports what changed (``precision``) and what it cost (``accuracy``).
    """
    if precision not in PRECISIONS:
        raise ModelError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    t0 = time.perf_counter()
    hw = hw or local_spec()
    store = store if isinstance(store, Store) else Store(store)
    config = policy if isinstance(policy, PolicyConfig) else PolicyConfig(
        name=policy, expected_calls=expected_calls, deadline_s=deadline_s)
    source = path if isinstance(path, frontend.ModelSource) else frontend.read_model(path)
    label = source.name if isinstance(path, frontend.ModelSource) else Path(path).name
    info = frontend.inspect_model(source, input_shapes, check=False)
    shapes = info.complete(input_shapes or {})
    if shapes is None:
        info = frontend.inspect_model(source, input_shapes)  # refuse what cannot run, now
    if model is None and use_model and config.name in ("balanced", "tune"):
        from tunecache.costmodel.registry import usable_model

        model = usable_model(store.location, hw)

    def specialise(concrete: Mapping[str, tuple[int, ...]],
                   siblings: Mapping[str, Schedule] | None = None,
                   accuracy: bool = False) -> CompiledModel:
        return _compile_shape(label, source, concrete, store=store, config=config, hw=hw,
                              model=model, clock=clock, record_wanted=record_wanted,
                              threads=threads, blocked_layouts=blocked_layouts,
                              siblings=siblings, precision=precision, accuracy=accuracy)

    if shapes is None:
        interface = Graph(info.name, info.opset, info.inputs, info.outputs,
                          MappingProxyType({}), ())
        compiled = CompiledModel(interface, [], {}, hw, blocked_layouts=blocked_layouts,
                                 source=source)
        compiled.timings = {"load_s": time.perf_counter() - t0}
    else:
        compiled = specialise(shapes, accuracy=True)
    compiled.timings["total_s"] = time.perf_counter() - t0
    compiled.info = info
    compiled.specialise = specialise if info.dynamic else None
    compiled.max_shapes = max_shapes
    return compiled


def _compile_shape(label: str, source: frontend.ModelSource,
                   input_shapes: Mapping[str, Sequence[int]], *, store: Store,
                   config: PolicyConfig, hw: HardwareSpec, model: Ranker | None,
                   clock: Callable[[], float], record_wanted: bool,
                   threads: int | None = None, blocked_layouts: bool = True,
                   siblings: Mapping[str, Schedule] | None = None,
                   precision: str = "fp32", accuracy: bool = False) -> CompiledModel:
    """Plan and build one concrete input shape: plan layouts, look every kernel op up,
    decide each miss, record the misses as wanted, build the kernels; with ``accuracy`` and
    a precision below fp32, measure its error (the compile's shape only: a shape planned on
    its first run does not pay a numpy run of the model). ``siblings``: per
    node, its schedule at another planned shape of the same model (see
    :func:`_sharing_packed`)."""
    t0 = time.perf_counter()
    full, graph, lowered = plan_model(source, input_shapes, hw, blocked_layouts, precision)
    t_load = time.perf_counter()
    view = _cache_view(store, hw)
    # A run bounded to fewer threads ranks its guesses for them: a top-1 ranked for every
    # core and re-fitted could keep knobs the estimate cannot tell apart at that count.
    bound = threads if threads is not None and threads < hw.cores else None
    decider = Policy(config, hw, model=model, clock=clock, threads=bound)
    plan: list[PlanEntry] = []
    misses: dict[OpSignature, int] = {}
    decisions: dict[OpSignature, Decision] = {}
    served_from: dict[OpSignature, Mapping[str, object] | None] = {}
    runner: Runner | None = None
    try:
        for node in graph.kernel_nodes:
            op = node.op
            decision = decisions.get(op)
            if decision is None:
                served = view.lookup(op) if view is not None else None
                hit, hit_s, hit_note, nearest = _offer(served, view) if view is not None \
                    else (None, None, "", None)
                decision = decider.decide(op, hit, hit_s, hit_note, nearest)
                used = decision.source in ("cache", "nearest")
                served_from[op] = served.provenance() if served is not None and used else None
                if decision.action == "measure":
                    runner = runner or Runner(hw, TimingConfig(min_time_s=0.05, min_repeats=5))
                    decision = _measure_now(op, hw, store, runner, decision, config, model)
                sibling = (siblings or {}).get(node.name)
                if sibling is not None and decision.action == "guess":
                    decision = _sharing_packed(op, decision, sibling, hw)
                decisions[op] = _as_in_model(op, _within_threads(op, decision, hw, threads))
                decision = decisions[op]
            if decision.action != "cache":
                misses[op] = misses.get(op, 0) + 1
            plan.append(PlanEntry(node.name, node.nodes, op, decision.action, decision.source,
                                  decision.reason, decision.expected_s, decision.schedule,
                                  served_from.get(op)))
    finally:
        if runner is not None:
            runner.close()
    t_decide = time.perf_counter()
    if record_wanted and misses:
        _record_wanted(store, hw, [(op, count, graph.name or label)
                                   for op, count in misses.items()])
    kernels = _build_kernels(plan, hw)
    t_build = time.perf_counter()
    compiled = CompiledModel(graph, plan, kernels, hw, threads=threads, precision=lowered,
                             blocked_layouts=blocked_layouts, source=source)
    if accuracy and lowered.nodes:
        compiled.accuracy = precision_error(compiled, full)
    compiled.timings = {"load_s": t_load - t0, "decide_s": t_decide - t_load,
                        "build_s": t_build - t_decide, "total_s": time.perf_counter() - t0}
    return compiled


def plan_model(source: frontend.ModelSource, input_shapes: Mapping[str, Sequence[int]],
               hw: HardwareSpec, blocked_layouts: bool, precision: str
               ) -> tuple[Graph, Graph, PrecisionPlan]:
    """The model's graph at ``input_shapes`` with its layouts planned, before and after the
    precision policy, and what that policy did. Statically quantized products are int8
    kernels where they pay on ``hw`` (:func:`~tunecache.compiler.precision.int8_kernels_pay`)."""
    loaded = frontend.load_graph(source, input_shapes, int8_kernels=int8_kernels_pay(hw))
    full = plan_graph(loaded, hw, blocked_layouts=blocked_layouts, precision=precision)
    graph, lowered = apply_precision(full, hw, precision)
    return full, graph, lowered


def precision_error(compiled: CompiledModel, reference: Graph, seed: int = 0
                    ) -> dict[str, Any]:
    """Each output's error, ``compiled`` against the float32 ``reference`` graph run by the
    numpy executor, on seeded random inputs: the largest absolute error and that relative
    to the output's largest magnitude."""
    inputs = sample_inputs(compiled.graph.inputs, seed)
    ours = compiled.run(inputs)
    theirs = Executor(reference).run(inputs)
    outputs = {}
    for name, value in ours.items():
        ref = np.asarray(theirs[name], dtype=np.float64)
        diff = np.abs(np.asarray(value, dtype=np.float64) - ref)
        worst = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        outputs[name] = {"max_abs": worst, "max_rel_to_range": worst / scale if scale else 0.0}
    return {"against": "fp32", "input": f"random (seed {seed})", "outputs": outputs,
            "max_rel_to_range": max((o["max_rel_to_range"] for o in outputs.values()),
                                    default=0.0)}


def sample_inputs(infos: Sequence[TensorInfo], seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs for ``infos``: standard normal floats, integers 0 or 1 (token ids,
    masks)."""
    rng = np.random.default_rng(seed)
    out = {}
    for info in infos:
        if np.issubdtype(info.dtype, np.floating):
            out[info.name] = rng.standard_normal(info.shape).astype(info.dtype)
        else:
            out[info.name] = rng.integers(0, 2, size=info.shape).astype(info.dtype)
    return out


SHARE_PACKED_TOLERANCE = 0.05
"""How much slower (by the analytic estimate) a guess may be to reuse the weights another
planned shape of the model already packed: re-packing BERT-base's 12 FFN weights costs
about 36 ms and 113 MB per shape, more than the estimate can tell apart."""


def _sharing_packed(op: OpSignature, decision: Decision, sibling: Schedule,
                    hw: HardwareSpec) -> Decision:
    """The guess, or ``sibling`` (the node's schedule at another shape) when the guess
    would pack the weights into a layout the sibling did not, and the sibling is legal
    here and estimated within :data:`SHARE_PACKED_TOLERANCE` of the guess."""
    layout = op_kind(op.kind).packed_weights_layout
    guess = decision.schedule
    if layout is None or guess is None or type(sibling) is not type(guess) or \
            layout(op, sibling) == layout(op, guess) or problems(op, sibling, hw):
        return decision
    guess_s, sibling_s = estimate(op, guess, hw).seconds, estimate(op, sibling, hw).seconds
    if sibling_s > guess_s * (1 + SHARE_PACKED_TOLERANCE):
        return decision
    return replace(decision, schedule=sibling, expected_s=sibling_s,
                   reason=f"{decision.reason}; shares the weights another planned shape "
                          f"packed (estimate {sibling_s / guess_s:.2f}x the tiler's top-1)")


def _within_threads(op: OpSignature, decision: Decision, hw: HardwareSpec,
                    threads: int | None) -> Decision:
    """The decision with its schedule using at most ``threads`` threads: the same knobs with
    fewer threads when that is legal, else the kind's default schedule for ``threads``."""
    schedule = decision.schedule
    if threads is None or schedule is None or schedule.threads <= threads:
        return decision
    bounded = schedule.replace(threads=threads)
    if problems(op, bounded, hw):
        bounded = default_schedule(op, hw, threads)
    return replace(decision, schedule=bounded,
                   reason=f"{decision.reason}; threads {schedule.threads} -> {threads}")


def _as_in_model(op: OpSignature, decision: Decision) -> Decision:
    """The decision with its schedule as the kind runs it inside a model
    (:func:`~tunecache.compiler.schedule.in_model`)."""
    schedule = decision.schedule
    if schedule is None:
        return decision
    placed = in_model(op, schedule)
    if placed == schedule:
        return decision
    return replace(decision, schedule=placed,
                   reason=f"{decision.reason}; as it runs in a model: {placed}")


def _measure_now(op: OpSignature, hw: HardwareSpec, store: Store, runner: Runner,
                 decision: Decision, config: PolicyConfig, model: Ranker | None) -> Decision:
    job_id = f"compile-{time.strftime('%Y%m%d-%H%M%S')}"

    def sink(result: Any) -> None:
        try:
            store.append(to_records([result], hw, job_id=job_id))
        except Exception as exc:  # the measurement still serves this compile
            warnings.warn(f"could not record a measurement of {op.text} in {store.root}: "
                          f"{_cause(exc)}", StoreWarning, stacklevel=2)

    offered = [decision.schedule] if decision.schedule is not None else []
    # No finalists' rounds: the policy priced this miss at its trials, and the compile is
    # waiting; the nightly job times its finalists again.
    result = tune_op(op, hw, runner,
                     config=TuneConfig(trials=config.trials, refine=False, confirm=0),
                     model=model, sink=sink, first=offered)
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
    backend = backend_for(hw)
    backend.ensure_runnable(hw)
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
        return backend.load(op, backend.build(generate(op, schedule, hw)).path)

    with ThreadPoolExecutor(max(1, min(4, len(keys)))) as pool:
        built = list(pool.map(one, keys))
    for key, kernel in zip(keys, built, strict=True):
        for node in wanted[key]:
            kernels[node] = kernel
    return kernels
