"""A loaded graph compiled into one native program: an arena, a plan, one call per run.

:class:`NativeProgram` turns a :class:`~tunecache.compiler.graph.Graph` and its loaded
kernels into

* a **static arena**: every intermediate tensor written by a kernel gets an offset, planned
  from lifetimes (:mod:`tunecache.compiler.native.arena`), so a run allocates nothing;
* **views**: Reshape, Flatten, Squeeze, Unsqueeze, Identity and Dropout cost nothing, their
  output is their input's bytes;
* **joins**: a Concat whose inputs are contiguous byte ranges of its output costs nothing
  when its inputs' producers can write straight into their slices of it, or when its inputs
  already lie back to back (:mod:`tunecache.compiler.native.joins`); the planned tensors
  share the output's arena slot, which lives as long as any of them;
* **native segments**: runs of consecutive kernel calls, each executed by one call into the
  backend's plan runner (:class:`~tunecache.compiler.backends.PlanRunner`; the CPU's is
  :mod:`tunecache.compiler.backends.cpu.runner`) with constant weights packed into the
  kernels' layouts once, here;
* **bridges**: an op with no generated code yet runs in numpy between two segments, reading
  arena views and handing its result to the next segment by pointer. Their count and share
  of the steps are reported (:attr:`NativeProgram.numpy_steps`).

Shapes come from one traced run of the reference executor on example inputs (the graph's
shapes are static), so the plan is exact. Outputs are fresh arrays on every run.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from tunecache.compiler import onnx_ops
from tunecache.compiler.backends import PlanRunner, host_backend
from tunecache.compiler.buffers import ALIGN, address_of, aligned_copy, aligned_empty
from tunecache.compiler.elements import argument_dtypes, output_dtype
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.executor import check_inputs, numpy_kernel
from tunecache.compiler.graph import FLOAT32, VIEW_OPS, Graph, KernelNode, ModelError, OnnxNode
from tunecache.compiler.memo import IdentityMemo
from tunecache.compiler.native.arena import Lifetime, plan_arena
from tunecache.compiler.native.copies import copies_of
from tunecache.compiler.native.joins import Join, Placement, join_of, place_joins
from tunecache.compiler.native.profile import ProgramProfile, StepInfo

_ARENA = 0


class PlanMismatch(ModelError):
    """A run produced a tensor whose shape differs from the traced one (an op whose output
    shape depends on the data); the program cannot run these inputs, the executor can."""


def single_threaded_blas() -> AbstractContextManager[Any]:
    """numpy's BLAS on one thread while a program runs its numpy steps. Our kernels'
    workers spin a while after each kernel; an OpenBLAS call beside them with threads of
    its own fights them for the cores (torchvision's LRASPP at two threads: 24-32 ms a run
    with BLAS's two threads, 10-12.5 ms with one), and at one thread the user asked for
    one."""
    return _blas_controller().limit(limits=1, user_api="blas")


@cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a tensor's bytes are: a region (0 = the arena) and a byte offset in it."""

    region: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class _NativeCall:
    entry: int
    """Function pointer of the kernel entry."""
    inputs: tuple[str, ...]
    """Tensor names in argument order (a packed weight is named ``packed:<node>``)."""
    output: str
    step: StepInfo
    """What a profile calls it."""


@dataclass(frozen=True, slots=True)
class _Segment:
    steps: np.ndarray
    refs: np.ndarray
    first_step: int
    infos: tuple[StepInfo, ...]
    args: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    """The plan runner's arguments (step count, then the addresses of the steps, the
    references, the entry table and the base table), computed once."""


@dataclass(frozen=True, slots=True)
class _DirectOutput:
    """A graph output of a direct program: its slot (region and bytes), and where in the
    slot its value lies."""

    name: str
    region: int
    slot_bytes: int
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


@dataclass(frozen=True, slots=True)
class _Bridge:
    """A step run in Python: a numpy op, or a kernel node without a native kernel."""

    run: Any
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    label: str
    step: StepInfo


class NativeProgram:
    """A graph run by native code; build once with :meth:`build`, call :meth:`run` often."""

    graph: Graph
    arena_bytes: int
    """Peak bytes of the planned arena (intermediates written by kernels)."""
    unplanned_bytes: int
    """What those intermediates would take without reuse."""
    native_steps: int
    numpy_steps: int
    """Steps run in Python: ops with no generated code yet (views and vanished joins are
    free and not counted)."""
    joined_steps: int
    """Join steps (Concat) that vanished: their inputs were written in place."""
    segments: int
    """Native calls per run (one per run of consecutive kernel steps)."""
    threads: int
    """Threads the runner's own copies may use."""
    _shapes: dict[str, tuple[tuple[int, ...], np.dtype]]
    _constants: dict[str, np.ndarray]
    _layouts: dict[str, Hashable]
    _alias: dict[str, str]
    _arena: np.ndarray
    _outputs: dict[int, int]
    """Per-run output buffers: region -> bytes (see :meth:`_place`)."""
    _buffers: dict[int, np.ndarray]
    _where: dict[str, _Where]
    _bases: list[int]
    _dynamic: dict[str, int]
    _runner: PlanRunner
    _entries: np.ndarray
    _base_array: np.ndarray
    _schedule: list[_Segment | _Bridge]
    _direct: tuple[_Segment, tuple[tuple[str, int | None, tuple[int, ...]], ...],
                   tuple[_DirectOutput, ...]] | None
    """A program of one native segment whose outputs all have slots of their own: the
    segment, (name, region or None, shape) per graph input, and the outputs, for
    :meth:`_run_direct`."""

    # -- building -------------------------------------------------------------------------

    @classmethod
    def build(cls, graph: Graph, kernels: Mapping[str, Any],
              example_inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
              packed_layouts: Mapping[str, Hashable] | None = None,
              threads: int = 1, runner: PlanRunner | None = None) -> NativeProgram:
        """Plan ``graph`` with ``kernels`` (kernel node name -> loaded kernel; nodes without
        one, or whose kernel is not native, run their numpy reference) using shapes traced
        from one reference run on ``example_inputs``. ``packed_layouts`` names, per kernel
        node, the layout its pre-packed weights take (``OpKind.packed_weights_layout``):
        a constant already packed in that layout, by this program or another one alive (the
        same model planned at another shape), is not packed again. ``threads`` bounds the
        runner's own parallel work (large copies), as each kernel's schedule bounds its.
        ``runner`` is the backend's plan runner (default: this machine's backend's)."""
        self = cls.__new__(cls)
        self._runner = runner or host_backend().plan_runner()
        self.graph = graph
        self.threads = threads
        self._layouts = dict(packed_layouts or {})
        self._shapes = {}
        checked = self._check(example_inputs)
        self._shapes = _static_shapes(graph, checked) or _trace(graph, kernels, checked)
        self._constants = {}
        self._alias = {}
        for step in graph.steps:
            if isinstance(step, OnnxNode) and self._is_view(step):
                self._alias[step.outputs[0]] = self._root(step.inputs[0])
        placement = self._place_joins()
        self.joined_steps = len(placement.vanished)
        items = self._classify(graph, kernels, placement.vanished)
        self._place(items, placement)
        self._assemble(items)
        return self

    def _classify(self, graph: Graph, kernels: Mapping[str, Any], vanished: frozenset[str]
                  ) -> list[_NativeCall | _Bridge]:
        items: list[_NativeCall | _Bridge] = []
        for step in graph.steps:
            if isinstance(step, OnnxNode) and step.outputs and \
                    (step.outputs[0] in self._alias or step.outputs[0] in vanished):
                continue  # a view, or a join whose inputs were written in place
            if isinstance(step, KernelNode):
                call = self._native_call(step, kernels.get(step.name))
                if call is not None:
                    items.append(call)
                    continue
            else:
                moves = self._copy_calls(step)
                if moves:
                    items += moves
                    continue
            items.append(self._bridge(step, kernels))
        return items

    def _copy_calls(self, step: OnnxNode) -> list[_NativeCall]:
        """A data-movement step as strided copies run by the runner
        (:mod:`~tunecache.compiler.native.copies`); empty when it is not one."""
        copies = copies_of(step, self._shapes, self.graph.constants)
        if not copies:
            return []
        entry, calls = self._runner.copy_entry, []
        for i, copy in enumerate(copies):
            params = f"copy:{step.name}:{i}"
            self._constants[params] = copy.params(FLOAT32.itemsize, self.threads)
            calls.append(_NativeCall(entry, (copy.source, params), copy.output,
                                     StepInfo(step.name, step.op_type, "copy")))
        return calls

    def _place_joins(self) -> Placement:
        """The joins that vanish, and where their inputs then live
        (:func:`~tunecache.compiler.native.joins.place_joins`)."""
        joins: list[Join] = []
        written: set[str] = set()
        for step in self.graph.steps:
            outputs = (step.output,) if isinstance(step, KernelNode) else step.outputs
            if any(o in self._alias for o in outputs):
                continue  # a view: its output is another tensor's bytes
            written.update(o for o in outputs if o)
            join = join_of(step, self._shapes) if isinstance(step, OnnxNode) else None
            if join is not None:
                joins.append(replace(join, inputs=tuple(self._root(n) for n in join.inputs)))
        graph_inputs = {i.name for i in self.graph.inputs}
        placeable = {n for n in written if n not in graph_inputs
                     and n not in self.graph.constants and self._shapes[n][1] == FLOAT32}
        return place_joins(joins, placeable)

    def _root(self, name: str) -> str:
        while name in self._alias:
            name = self._alias[name]
        return name

    def _is_view(self, node: OnnxNode) -> bool:
        if node.op_type not in VIEW_OPS or not node.inputs or not node.outputs[0]:
            return False
        if any(o for o in node.outputs[1:]):  # Dropout's mask is wanted
            return False
        source, target = node.inputs[0], node.outputs[0]
        if source in self.graph.constants or source not in self._shapes:
            return False
        (src_shape, src_dtype), (dst_shape, dst_dtype) = self._shapes[source], self._shapes[target]
        return src_dtype == dst_dtype == FLOAT32 and \
            int(np.prod(src_shape)) == int(np.prod(dst_shape))

    def _native_call(self, node: KernelNode, kernel: Any) -> _NativeCall | None:
        entry = getattr(kernel, "entry_address", None)
        if entry is None:  # a numpy reference, or a kernel that runs outside this process
            return None
        shapes = [a.shape for a in node.op.arguments() if a.role == "input"]
        dtypes = argument_dtypes(node.op)
        if any(name not in self.graph.constants and name in self._shapes
               and self._shapes[name][1] != dtype
               for name, dtype in zip(node.inputs, dtypes, strict=True)):
            return None  # the bridge converts what the kernel reads in another type
        names = list(node.inputs)
        for i, (name, shape) in enumerate(zip(node.inputs, shapes, strict=True)):
            if name in self.graph.constants:
                prepared = aligned_copy(
                    np.asarray(self.graph.constants[name], dtype=dtypes[i]).reshape(shape))
                names[i] = f"const:{node.name}:{i}"
                self._constants[names[i]] = prepared
        if len(names) > 1 and kernel.prepacks_weights and names[1].startswith("const:"):
            bound = _bind_shared(kernel, self.graph.constants[node.inputs[1]],
                                 self._constants.pop(names[1]), self._layouts.get(node.name))
            names[1] = f"packed:{node.name}"
            self._constants[names[1]] = bound.packed
            entry = bound.entry_address
        if entry is None or len(names) + 1 > self._runner.max_args:
            return None
        return _NativeCall(entry, tuple(names), node.output,
                           StepInfo(node.name, node.op.kind, "kernel"))

    def _bridge(self, step: KernelNode | OnnxNode, kernels: Mapping[str, Any]) -> _Bridge:
        if isinstance(step, KernelNode):
            return _Bridge(_kernel_function(step, kernels.get(step.name)), step.inputs,
                           (step.output,), f"kernel node {step.name!r} ({step.op.text})",
                           StepInfo(step.name, step.op.kind, "numpy"))
        return _Bridge(_onnx_function(step, self.graph.opset), step.inputs, step.outputs,
                       f"node {step.name!r} ({step.op_type})",
                       StepInfo(step.name, step.op_type,
                                onnx_ops.engine(step.op_type, self.graph.opset, step.attrs,
                                                step.outputs) or "numpy"))

    # -- memory ---------------------------------------------------------------------------

    def _place(self, items: list[_NativeCall | _Bridge], placement: Placement) -> None:
        """Arena offsets for every tensor a native call writes and every tensor a join
        placed (inside its host, whose slot lives as long as any of them); regions for the
        rest."""
        outputs = {self._root(o.name) for o in self.graph.outputs}
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for index, item in enumerate(items):
            for name in item.inputs:
                if name:
                    last[self._root(name)] = index
            for name in _written(item):
                first.setdefault(name, index)
        for alias, root in self._alias.items():
            if alias in outputs or root in outputs:
                outputs.add(root)
        groups: dict[str, set[str]] = {}
        for name in {i.output for i in items if isinstance(i, _NativeCall)} | set(placement.slots):
            host = placement.slots[name][0] if name in placement.slots else name
            groups.setdefault(host, {host}).add(name)
        lifetimes = []
        self._bases: list[int] = [0]
        self._outputs, self._buffers = {}, {}
        region_of: dict[str, int] = {}
        for host, names in groups.items():
            shape, dtype = self._shapes[host]
            size = int(np.prod(shape)) * dtype.itemsize
            if names & outputs:
                # A graph output's slot is the array the run returns: a fresh buffer each
                # run, written by its producers in place (no copy out of the arena).
                region_of[host] = len(self._bases)
                self._outputs[len(self._bases)] = size
                self._bases.append(0)
                continue
            start = min((first[n] for n in names if n in first), default=0)
            end = max(start, *(last.get(n, start) for n in names))
            lifetimes.append(Lifetime(host, size, start, end))
        plan = plan_arena(lifetimes)
        self.arena_bytes, self.unplanned_bytes = plan.peak_bytes, plan.total_bytes
        self._arena = aligned_empty(plan.peak_bytes, np.uint8, zero=True)
        self._bases[_ARENA] = address_of(self._arena)
        self._where: dict[str, _Where] = {}
        for host, names in groups.items():
            for name in names:
                inside = placement.slots[name][1] if name in placement.slots else 0
                self._where[name] = _Where(region_of[host], inside) if host in region_of \
                    else _Where(_ARENA, plan.offsets[host] + inside)
        self._dynamic: dict[str, int] = {}
        for name, array in self._constants.items():
            self._where[name] = _Where(len(self._bases))
            self._bases.append(address_of(array))

    def _region_for(self, name: str) -> _Where:
        """Where a tensor a native call reads lives: arena, constant, or a per-run region
        (a graph input, or a result of a bridge) whose pointer is set before each run."""
        root = self._root(name)
        if root in self._where:
            return self._where[root]
        if root in self.graph.constants:  # a constant reached through a view
            self._constants[root] = aligned_copy(np.asarray(self.graph.constants[root]))
            self._where[root] = _Where(len(self._bases))
            self._bases.append(address_of(self._constants[root]))
            return self._where[root]
        self._where[root] = _Where(len(self._bases))
        self._dynamic[root] = len(self._bases)
        self._bases.append(0)
        return self._where[root]

    def arena_range(self, name: str) -> tuple[int, int] | None:
        """Byte range ``[start, end)`` of tensor ``name`` in the buffer planned for it (the
        arena, or for a graph output's slot the run's output buffer), or None when it lives
        elsewhere (a graph input, a constant, a numpy step's own result)."""
        where = self._where.get(self._root(name))
        if where is None or not self._planned(where):
            return None
        shape, dtype = self._shapes[name]
        return where.offset, where.offset + int(np.prod(shape)) * dtype.itemsize

    def _planned(self, where: _Where) -> bool:
        return where.region == _ARENA or where.region in self._outputs

    def _view(self, name: str) -> np.ndarray:
        """A planned tensor as a numpy array of its traced shape (valid during its
        lifetime, or for an output's slot until the next run)."""
        shape, dtype = self._shapes[name]
        where = self._where[self._root(name)]
        buffer = self._arena if where.region == _ARENA else self._buffers[where.region]
        count = int(np.prod(shape))
        return buffer[where.offset:where.offset + count * dtype.itemsize].view(
            dtype).reshape(shape)

    # -- the plan -------------------------------------------------------------------------

    def _assemble(self, items: list[_NativeCall | _Bridge]) -> None:
        entries: list[int] = []
        schedule: list[_Segment | _Bridge] = []
        pending: list[_NativeCall] = []
        for index, item in enumerate(items):
            if isinstance(item, _NativeCall):
                pending.append(item)
                continue
            if pending:
                schedule.append(self._segment(pending, entries, index - len(pending)))
                pending = []
            schedule.append(item)
        if pending:
            schedule.append(self._segment(pending, entries, len(items) - len(pending)))
        # Pointer tables the runner reads: plain 64-bit words, kept alive by the program.
        self._entries = np.array(entries or [0], dtype=np.uint64)
        self._base_array = np.array(self._bases, dtype=np.uint64)
        tables = (address_of(self._entries), address_of(self._base_array))
        schedule = [replace(item, args=(len(item.steps), address_of(item.steps),
                                        address_of(item.refs), *tables))
                    if isinstance(item, _Segment) else item for item in schedule]
        self._schedule = schedule
        self._direct = self._direct_plan()
        self.native_steps = sum(isinstance(i, _NativeCall) for i in items)
        self.numpy_steps = len(items) - self.native_steps
        self.segments = sum(isinstance(s, _Segment) for s in schedule)

    def _direct_plan(self) -> tuple[_Segment, tuple[tuple[str, int | None, tuple[int, ...]],
                                                     ...], tuple[_DirectOutput, ...]] | None:
        if len(self._schedule) != 1 or not isinstance(self._schedule[0], _Segment):
            return None
        regions = [self._where.get(self._root(o.name)) for o in self.graph.outputs]
        slots = [w.region for w in regions if w is not None and w.region in self._outputs]
        if len(slots) != len(regions) or len(set(slots)) != len(slots):
            return None  # an output that is an input, a constant, or another output's bytes
        inputs = tuple((i.name, self._dynamic.get(i.name), self._shapes[i.name][0])
                       for i in self.graph.inputs)
        if any(self._shapes[name][1] != FLOAT32 for name, _, _ in inputs):
            return None
        outputs = tuple(_DirectOutput(o.name, w.region, self._outputs[w.region], w.offset,
                                      *self._shapes[o.name])
                        for o, w in zip(self.graph.outputs, regions, strict=True) if w)
        return self._schedule[0], inputs, outputs

    def _segment(self, calls: list[_NativeCall], entries: list[int], first: int) -> _Segment:
        steps = np.zeros(len(calls), dtype=self._runner.step_dtype)
        refs: list[tuple[int, int]] = []
        for i, call in enumerate(calls):
            if call.entry not in entries:
                entries.append(call.entry)
            places = [self._region_for(n) for n in (*call.inputs, call.output)]
            steps[i] = (entries.index(call.entry), len(places), len(refs))
            refs.extend((w.region, w.offset) for w in places)
        return _Segment(steps, np.array(refs, dtype=self._runner.ref_dtype), first,
                        tuple(call.step for call in calls))

    # -- running --------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
            ) -> dict[str, np.ndarray]:
        """Run the model; ``{output name: array}`` in the model's output order (fresh
        arrays). Inputs are checked as :meth:`Executor.run` checks them."""
        if self._direct is not None and isinstance(inputs, dict):
            outputs = self._run_direct(inputs)
            if outputs is not None:
                return outputs
        return self._run(inputs, None)

    def _run_direct(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """:meth:`run` of a one-segment program on inputs that need no conversion: a few
        checks and one native call. Python's work between runs costs more than its count
        of operations suggests, as the kernels leave the interpreter's data out of cache
        (MobileNet-v2 at one thread: 0.17 ms per run on the general path, 0.06 ms here,
        beside 7 ms of kernels). Outputs are made with ``np.empty`` and ``np.ndarray`` and
        addresses read from ``__array_interface__``: a run's time outside the native call
        went from 150-250 to 52-79 us with MobileNet-v2 (1.4-1.5% of its latency, change 79).
        None when the inputs need :meth:`_run` (which also reports what is wrong with
        them)."""
        assert self._direct is not None
        segment, specs, outputs = self._direct
        if len(inputs) != len(specs):
            return None
        for name, region, shape in specs:
            array = inputs.get(name)
            if type(array) is not np.ndarray or array.dtype != FLOAT32 \
                    or array.shape != shape or not array.flags.c_contiguous:
                return None
            if region is not None:
                self._base_array[region] = address_of(array)
        # As few numpy calls as can be: the kernels leave numpy's code and data out of
        # cache, so each costs tens of microseconds here (change 79).
        fresh = []
        for out in outputs:
            raw, start = self._new_slot(out.region, out.slot_bytes)
            fresh.append(np.ndarray(out.shape, out.dtype, raw, start + out.offset))
        failed = self._runner.run(*segment.args)
        if failed:
            raise self._workspace_error(segment, failed)
        return {out.name: array for out, array in zip(outputs, fresh, strict=True)}

    def _fresh_outputs(self) -> None:
        """A new buffer for every graph output's slot: a run's outputs are its own."""
        for region, size in self._outputs.items():
            raw, start = self._new_slot(region, size)
            self._buffers[region] = raw[start:start + size]

    def _new_slot(self, region: int, size: int) -> tuple[np.ndarray, int]:
        """A fresh buffer for output slot ``region`` of ``size`` bytes, which native calls
        now write: the raw array and the offset in it of the slot's aligned start."""
        raw = np.empty(size + ALIGN, np.uint8)
        address = address_of(raw)
        start = -address % ALIGN
        self._base_array[region] = address + start
        return raw, start

    def profile(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
                runs: int = 10) -> ProgramProfile:
        """Run ``runs`` times (after one unrecorded run) timing every step where it runs,
        native steps inside the C runner: each step's median seconds, and the median
        whole run (whose excess over the steps is the time spent in Python between
        them)."""
        steps = [info for item in self._schedule
                 for info in (item.infos if isinstance(item, _Segment) else (item.step,))]
        samples = np.zeros((runs, len(steps)))
        walls = []
        self._run(inputs, np.zeros(len(steps)))
        for i in range(runs):
            start = time.perf_counter()
            self._run(inputs, samples[i])
            walls.append(time.perf_counter() - start)
        return ProgramProfile.of(steps, samples, walls)

    def _run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
             seconds: np.ndarray | None) -> dict[str, np.ndarray]:
        """:meth:`run`; with ``seconds`` (one float64 per step), each step's wall seconds
        are added to its entry."""
        values: dict[str, Any] = {}
        for name, array in self._check(inputs).items():
            self._publish(name, array, values)
        self._fresh_outputs()
        with single_threaded_blas() if self.numpy_steps else nullcontext():
            self._steps(values, seconds)
        handed: set[int] = set()
        return {o.name: self._result(o.name, values, handed) for o in self.graph.outputs}

    def _steps(self, values: dict[str, Any], seconds: np.ndarray | None) -> None:
        index = 0
        for item in self._schedule:
            if isinstance(item, _Segment):
                self._run_segment(item, None if seconds is None else seconds[index:])
                index += len(item.infos)
                continue
            start = time.perf_counter()
            self._run_bridge(item, values)
            if seconds is not None:
                seconds[index] += time.perf_counter() - start
            index += 1

    def __call__(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
                 ) -> dict[str, np.ndarray]:
        return self.run(inputs)

    def _check(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
               ) -> dict[str, np.ndarray]:
        checked = check_inputs(self.graph.name, self.graph.inputs, inputs)
        for name, array in checked.items():
            if self._shapes and array.shape != self._shapes[name][0]:
                raise ModelError(f"input {name!r} has shape {list(array.shape)}; this program "
                                 f"was planned for {list(self._shapes[name][0])}")
        return checked

    def _publish(self, name: str, value: Any, values: dict[str, Any]) -> None:
        """Keep a value computed outside the arena; native calls read it by pointer."""
        region = self._dynamic.get(name)
        if region is not None:
            value = np.ascontiguousarray(value, dtype=self._shapes[name][1])
            self._base_array[region] = address_of(value)
        values[name] = value

    def _run_segment(self, segment: _Segment, seconds: np.ndarray | None) -> None:
        failed = self._runner.run(*segment.args) if seconds is None else \
            self._runner.run_timed(*segment.args, address_of(seconds))
        if failed:
            raise self._workspace_error(segment, failed)

    def _workspace_error(self, segment: _Segment, failed: int) -> ModelError:
        return ModelError(f"step {segment.first_step + failed - 1} of {self.graph.name!r} "
                          "could not allocate its kernel's workspace")

    def _value(self, name: str, values: dict[str, Any]) -> Any:
        if name in values:
            return values[name]
        if name in self.graph.constants:
            return self.graph.constants[name]
        root = self._root(name)
        if root in values:
            return np.reshape(values[root], self._shapes[name][0])
        return self._view(name)

    def _run_bridge(self, bridge: _Bridge, values: dict[str, Any]) -> None:
        args = [self._value(n, values) if n else None for n in bridge.inputs]
        try:
            results = bridge.run(*args)
        except TunecacheError:
            raise
        except Exception as exc:
            raise ModelError(f"{bridge.label} failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(results, np.ndarray):
            results = [results]
        for name, result in zip(bridge.outputs, results, strict=False):
            if not name:
                continue
            if np.shape(result) != self._shapes[name][0]:
                raise PlanMismatch(f"{bridge.label} produced {name!r} of shape "
                                   f"{list(np.shape(result))}; the plan has "
                                   f"{list(self._shapes[name][0])}")
            where = self._where.get(name)
            if where is not None and self._planned(where):
                self._view(name)[...] = result  # a join placed it: its slice of the join
                continue
            if isinstance(result, np.ndarray) and np.may_share_memory(result, self._arena):
                result = result.copy()  # the arena slot may be reused before its last read
            self._publish(name, result, values)

    def _result(self, name: str, values: dict[str, Any], handed: set[int]) -> np.ndarray:
        """Output ``name``: its run's buffer as it is (the first output handed that buffer),
        else a copy."""
        where = self._where.get(self._root(name))
        if name not in values and where is not None and where.region in self._outputs \
                and where.region not in handed:
            handed.add(where.region)
            return self._view(name)
        value = self._value(name, values)
        array = np.asarray(value)
        shape = self._shapes[name][0]
        return np.array(array.reshape(shape), copy=True)


def _written(item: _NativeCall | _Bridge) -> tuple[str, ...]:
    return (item.output,) if isinstance(item, _NativeCall) else tuple(o for o in item.outputs if o)


def _kernel_function(node: KernelNode, kernel: Any) -> Any:
    """A kernel node as a function of its input values (any shape with the right element
    count), returning its output in the node's ONNX shape."""
    fn = kernel if kernel is not None else numpy_kernel(node.op)
    shapes = [a.shape for a in node.op.arguments() if a.role == "input"]
    dtypes = argument_dtypes(node.op)

    def run(*values: np.ndarray) -> np.ndarray:
        args = [np.ascontiguousarray(np.reshape(v, s), dtype=t)
                for v, s, t in zip(values, shapes, dtypes, strict=True)]
        return np.reshape(fn(*args), node.output_shape)
    return run


def _onnx_function(node: OnnxNode, opset: int) -> Any:
    fn = onnx_ops.node_function(node.op_type, node.inputs, node.outputs, node.attrs, opset)

    def run(*values: Any) -> Sequence[Any]:
        return fn(list(values))
    return run


_PACKED: IdentityMemo[np.ndarray] = IdentityMemo()
"""Packed weights by (original constant, packed layout), while that constant lives:
programs of one model at several shapes share them."""


def _bind_shared(kernel: Any, original: np.ndarray, weights: np.ndarray,
                 layout: Hashable | None) -> Any:
    """``kernel`` bound to ``weights`` (``original`` laid out as the kernel reads it), reusing
    the packed copy of ``original`` in ``layout`` when one exists."""
    if layout is None:
        return kernel.bind_weights(weights)
    packed = _PACKED.get((original,), layout, lambda: kernel.bind_weights(weights).packed)
    return kernel.bind_packed(packed)


def _static_shapes(graph: Graph, inputs: Mapping[str, np.ndarray]
                   ) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """Shape and dtype of every tensor from what the loader inferred, or None when some
    step's output is not among them (then a traced run tells)."""
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = dict(graph.tensors)
    if not shapes:
        return None
    shapes.update((n, (tuple(a.shape), a.dtype)) for n, a in graph.constants.items())
    shapes.update((n, (tuple(a.shape), a.dtype)) for n, a in inputs.items())
    for step in graph.steps:
        if isinstance(step, KernelNode):
            shapes[step.output] = (tuple(step.output_shape), output_dtype(step.op))
        elif any(o and o not in shapes for o in step.outputs):
            return None
    return shapes


def _trace(graph: Graph, kernels: Mapping[str, Any], inputs: Mapping[str, np.ndarray]
           ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every tensor, from one run of the steps on ``inputs``."""
    values: dict[str, Any] = {**graph.constants, **inputs}
    for step in graph.steps:
        if isinstance(step, KernelNode):
            run = _kernel_function(step, kernels.get(step.name))
            values[step.output] = run(*(values[n] for n in step.inputs))
            continue
        results = _onnx_function(step, graph.opset)(
            *(values[n] if n else None for n in step.inputs))
        for name, result in zip(step.outputs, results, strict=False):
            if name:
                values[name] = result
    return {name: (tuple(np.shape(v)), np.asarray(v).dtype) for name, v in values.items()}
