"""Read ONNX models into a :class:`~tunecache.compiler.graph.Graph`.

:func:`load_graph` reads a model (a path, with external data resolved relative to the model's
folder, or a loaded ``onnx.ModelProto``), fixes dynamic input dimensions from
``input_shapes``, infers every tensor's shape with ONNX shape inference (``data_prop`` on),
folds constant subgraphs (``Constant`` nodes, ``Shape`` of static shapes and everything
computed only from constants), drops inference no-ops and repeated computations, and hands
the nodes left to the lowering walk (:func:`tunecache.compiler.lowering.driver.lower_nodes`),
which turns the patterns registered in :mod:`tunecache.compiler.lowering` (``Conv``,
``MatMul`` and ``Gemm`` with their foldable neighbours among them) into
:class:`~tunecache.compiler.graph.KernelNode` s; every other node becomes an
:class:`~tunecache.compiler.graph.OnnxNode`, run by the executor with numpy. Nothing here
branches on an op family.

Ops are checked after folding: a shape computation folds whatever its ops (those the executor
lacks are evaluated with ONNX's reference implementation), and a node left that the executor
cannot run is an error here, at load time, naming the node and op type. :func:`inspect_model`
reads a model whose inputs keep dynamic dimensions: its interface, and the same check,
sparing the nodes that compute from input shapes only. See docs/ONNX.md for the op set,
opset handling, fusion rules and dynamic shapes. The graph passes that follow a load (layout
planning, kernel-pair fusion) are :func:`tunecache.compiler.passes.plan_graph`.

Needs the ``onnx`` package (a dependency of tunecache); it is imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tunecache.compiler import onnx_ops
from tunecache.compiler.graph import (
    FLOAT32,
    Graph,
    ModelError,
    QuantizedConstant,
    Step,
    TensorInfo,
)
from tunecache.compiler.lowering.driver import lower_nodes
from tunecache.compiler.model_source import (
    ModelSource,
    model_bytes,
    read_model,
    read_model_bytes,
)
from tunecache.compiler.model_source import import_onnx as _import_onnx
from tunecache.compiler.model_source import source_of as _source
from tunecache.compiler.onnx_nodes import (
    NONDETERMINISTIC,
    ReadNode,
    attr_value,
    checker_context,
    constant_branch,
    conv_problem,
    deduplicate,
    definition_problem,
    elide,
    live,
    pairwise_sums,
    schema_problem,
    type_problem,
    with_scope,
)
from tunecache.compiler.rewrites import RewriteTensors, leftover_problem, rewrite_nodes

if TYPE_CHECKING:
    import onnx

    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.ops import OpSignature

__all__ = [
    "MIN_OPSET", "ModelInfo", "ModelSource", "inspect_model", "kernel_ops", "load_graph",
    "model_bytes", "read_model", "read_model_bytes", "supported_ops",
]

# Opsets 7 and 8 differ from 9 only in ops we do not run or in ways the implementations
# already accept (BatchNormalization's `spatial`); before 7, Add/Mul used legacy broadcasting.
MIN_OPSET = 7
# Initializers up to this many elements (and every integer one) go to shape inference with
# their values, so that data propagation sees Reshape targets, Slice bounds, etc.; larger
# ones go as typed inputs, which keeps inference from copying the weights.
_INFERENCE_VALUE_LIMIT = 1024


def supported_ops() -> tuple[str, ...]:
    """The ONNX op types (default domain) a model may use, sorted."""
    return tuple(sorted(onnx_ops.OPS))


# -- loading -------------------------------------------------------------------------------


_ONNX_FLOAT = 1
"""``TensorProto.FLOAT``."""
_SHARED_FLOATS = 1024
"""Float initializers this large leave an owned source's proto once read (weights, not the
small constants folding and shape inference look at)."""


@dataclass(frozen=True)
class ModelInfo:
    """A model's interface: inputs and outputs as declared (``-1`` for a dynamic dimension)
    and, per input, each dimension's symbolic name (``""`` for a static one, ``"?"`` for an
    unnamed dynamic one)."""

    name: str
    opset: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    dim_names: Mapping[str, tuple[str, ...]]

    @property
    def dynamic(self) -> bool:
        """Whether any input dimension is dynamic."""
        return any(d < 0 for i in self.inputs for d in i.shape)

    def describe(self, name: str) -> str:
        """An input's shape with its dynamic dimensions named: ``[batch, sequence, 32]``."""
        info = next(i for i in self.inputs if i.name == name)
        labels = self.dim_names.get(name, ())
        return "[" + ", ".join(str(d) if d >= 0 else (labels[k] if k < len(labels) else "?")
                               for k, d in enumerate(info.shape)) + "]"

    def complete(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]] | None:
        """Every input's shape from ``shapes`` plus what its dimension names imply.

        An input not in ``shapes`` gets its static dimensions and, for each named dynamic one,
        the size the same name has in a given input (``attention_mask [batch, sequence]``
        from ``input_ids``). None if some dimension stays unknown.
        """
        sizes: dict[str, int] = {}
        for info in self.inputs:
            given = shapes.get(info.name)
            for k, label in enumerate(self.dim_names.get(info.name, ())):
                if given is not None and label not in ("", "?") and k < len(given):
                    sizes.setdefault(label, int(given[k]))
        out: dict[str, tuple[int, ...]] = {}
        for info in self.inputs:
            given = shapes.get(info.name)
            if given is not None:
                out[info.name] = tuple(int(d) for d in given)
                continue
            labels = self.dim_names.get(info.name, ())
            dims = [d if d >= 0 else sizes.get(labels[k] if k < len(labels) else "?", -1)
                    for k, d in enumerate(info.shape)]
            if any(d < 0 for d in dims):
                return None
            out[info.name] = tuple(dims)
        return out


def load_graph(path_or_model: str | Path | onnx.ModelProto | ModelSource,
               input_shapes: Mapping[str, Sequence[int]] | None = None, *,
               int8_kernels: bool = True) -> Graph:
    """Read an ONNX model into a :class:`Graph`.

    ``path_or_model`` is a file (external data is read relative to its folder), a loaded
    ``ModelProto`` (its external data must already be loaded) or a :class:`ModelSource`.
    ``input_shapes`` fixes input dimensions the model leaves dynamic (and must agree with the
    static ones); every input dimension must be known in the end. Constant subgraphs (shape
    computations included) are folded before ops are checked, so an op the executor cannot
    run is an error only if it survives folding. Raises :class:`ModelError` for an unreadable
    or malformed model, such an op, or bad ``input_shapes``. ``int8_kernels`` off, statically
    quantized products become float32 kernels on the dequantized weights
    (:func:`tunecache.compiler.precision.int8_kernels_pay` decides it for a machine).
    """
    source = _source(path_or_model)
    return _Loader(_import_onnx(), source, input_shapes, symbolic=False,
                   int8_kernels=int8_kernels).load()


def inspect_model(path_or_model: str | Path | onnx.ModelProto | ModelSource,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, *,
                  check: bool = True) -> ModelInfo:
    """Describe a model's interface, its inputs' dimensions possibly dynamic.

    With ``check`` (the default), the model is also checked: what is constant without the
    dynamic sizes is folded, then every node the executor cannot run is refused
    (``ModelError`` naming node and op) except those computing only from input shapes and
    constants, which fold away once the shapes are known (see :func:`load_graph`). Without
    it only the declared inputs and outputs are read (no weights, no shape inference).
    ``input_shapes`` is checked against the declared shapes; the result keeps the model's
    declared inputs (dynamic dimensions stay ``-1``).
    """
    source = _source(path_or_model)
    loader = _Loader(_import_onnx(), source, input_shapes, symbolic=True)
    return loader.inspect() if check else loader.interface()


def kernel_ops(path: str | Path | onnx.ModelProto,
               input_shapes: Mapping[str, Sequence[int]] | None = None,
               hw: HardwareSpec | None = None,
               precision: str = "fp32") -> list[tuple[OpSignature, int, str]]:
    """The distinct kernel ops of a model: ``(op, count, label)`` in first-use order.

    ``label`` names the kernel nodes using the op (the first few, then how many more).
    With ``hw``, the ops a model compiled for ``hw`` at ``precision`` runs (int8 products
    where they pay there, ``int8_kernels_pay``): the graph passes
    run first (:func:`tunecache.compiler.passes.plan_graph`: activations' layouts planned,
    reorders included, then kernel pairs fused; then the precision policy,
    :func:`tunecache.compiler.precision.apply_precision`).
    """
    from tunecache.compiler.precision import int8_kernels_pay

    graph = load_graph(path, input_shapes,
                       int8_kernels=hw is None or int8_kernels_pay(hw))
    if hw is not None:
        from tunecache.compiler.passes import plan_graph
        from tunecache.compiler.precision import apply_precision

        graph, _ = apply_precision(plan_graph(graph, hw, precision=precision), hw, precision)
    users: dict[OpSignature, list[str]] = {}
    for node in graph.kernel_nodes:
        users.setdefault(node.op, []).append(node.name)
    out = []
    for op, names in users.items():
        label = ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        out.append((op, len(names), label))
    return out


def _dims(type_proto: Any) -> tuple[int | None, ...] | None:
    """The dims of a tensor type, None for an unknown dim, or None for an unknown rank."""
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)


def _nodes_text(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"node{'s' if len(names) > 1 else ''} {shown}{more}"


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class _Loader:
    """One load: reads, infers shapes, folds constants, lowers (:mod:`.lowering.driver`),
    and builds the Graph."""

    def __init__(self, onnx: Any, source: ModelSource,
                 input_shapes: Mapping[str, Sequence[int]] | None, symbolic: bool,
                 int8_kernels: bool = True) -> None:
        self.onnx = onnx
        self.source = source
        self.model = source.model
        self.base_dir = source.base_dir
        self.name = self.model.graph.name or source.name
        self.input_shapes = dict(input_shapes or {})
        # Symbolic: dynamic input dimensions stay unknown (inspect_model), else an error.
        self.symbolic = symbolic
        self.dim_names: dict[str, tuple[str, ...]] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int | None, ...]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.quantized: dict[str, QuantizedConstant] = {}
        self.int8_kernels = int8_kernels

    # -- the pipeline ---------------------------------------------------------------------

    def _folded(self) -> tuple[list[TensorInfo], list[ReadNode]]:
        """Read, sort, infer shapes and fold constants; refuse what cannot run."""
        model = self.model
        if not model.HasField("graph") or not model.opset_import:
            raise ModelError(f"{self.name!r} is not an ONNX model: it has no graph or no opset "
                             "import (an empty or truncated file?)")
        self.opset = self._opset()
        # Initializers first: reading them slims the proto (ModelSource.slimmed), and the
        # nodes then hold parts of the slim one, not of the original.
        self._read_initializers()
        nodes = self._nodes()
        inputs = self._inputs()
        graph = self.model.graph
        problem = definition_problem([i.name for i in graph.input],
                                     [i.name for i in graph.initializer], nodes,
                                     [o.name for o in graph.output])
        if problem:
            raise ModelError(f"model {self.name!r} is not a valid ONNX graph: {problem}")
        nodes = self._sorted(nodes, inputs)
        # What the input shapes and constants alone determine folds first, so that shape
        # inference (the load's costliest step) walks fewer nodes.
        nodes = self._fold_constants(nodes)
        # Strict: an inconsistency (shapes that do not broadcast, a type constraint broken)
        # is refused here, as onnxruntime refuses it when it creates a session.
        self._infer_in_stages(inputs, nodes)
        self._check_inferred(nodes)
        nodes = self._fold_constants(nodes)
        # ONNX data propagation covers only some op versions (e.g. not Reshape targets built
        # by Concat at opset 13); inferring again over the nodes still missing shapes, now
        # that folding made such targets constants, fills the gaps, while that helps.
        missing = [] if self.symbolic else self._missing_shapes(nodes)
        while missing:
            self._infer_shapes(inputs, missing)
            nodes = self._fold_constants(nodes)
            still = self._missing_shapes(nodes)
            if len(still) >= len(missing):
                break
            missing = still
        self._reject_unsupported(nodes, self._shape_only(nodes) if self.symbolic else set())
        self._reject_training(nodes)
        return inputs, nodes

    def _reject_training(self, nodes: list[ReadNode]) -> None:
        """A Dropout whose ``training_mode`` input is not a constant false is training."""
        for node in nodes:
            if node.op_type != "Dropout" or node.domain or len(node.inputs) < 3 \
                    or not node.inputs[2]:
                continue
            mode = self.constants.get(node.inputs[2])
            if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
                raise ModelError(f"node {node.name!r} (Dropout): training mode is not "
                                 "supported (inference only): its training_mode input is "
                                 + ("true" if mode is not None else "not a constant"))

    def inspect(self) -> ModelInfo:
        inputs, _ = self._folded()
        return ModelInfo(self.name, self.opset, tuple(inputs), tuple(self._outputs()),
                         MappingProxyType(dict(self.dim_names)))

    def interface(self) -> ModelInfo:
        if not self.model.HasField("graph") or not self.model.opset_import:
            raise ModelError(f"{self.name!r} is not an ONNX model: it has no graph or no opset "
                             "import (an empty or truncated file?)")
        opset = self._opset()
        inputs = self._inputs()
        outputs = []
        for vi in self.model.graph.output:
            dims = _dims(vi.type) or ()
            outputs.append(TensorInfo(vi.name, tuple(-1 if d is None else d for d in dims),
                                      onnx_ops.ONNX_DTYPES.get(vi.type.tensor_type.elem_type,
                                                               FLOAT32)))
        return ModelInfo(self.name, opset, tuple(inputs), tuple(outputs),
                         MappingProxyType(dict(self.dim_names)))

    def load(self) -> Graph:
        inputs, nodes = self._folded()
        outputs = self._outputs()
        names = {o.name for o in outputs}
        nodes = pairwise_sums(live(nodes, names), self.shapes, self.dtypes)
        tables = RewriteTensors(self.shapes, self.dtypes, self.constants, self.opset)
        nodes = rewrite_nodes(nodes, tables)
        if (problem := leftover_problem(nodes, tables)) is not None:
            raise ModelError(problem)
        nodes = elide(nodes, names, self.dtypes)
        nodes = deduplicate(nodes, names, self.constants)
        steps = lower_nodes(nodes, {o.name for o in outputs}, self.opset, self.constants,
                            self.shapes, self.dtypes, self.source.derived, self.quantized,
                            self.int8_kernels)
        self._drop_unread_constants(steps, {o.name for o in outputs})
        for array in self.constants.values():
            array.flags.writeable = False
        tensors = {name: (shape, self.dtypes[name]) for name in self.shapes
                   if (shape := self._shape(name)) is not None and name in self.dtypes}
        return Graph(self.name, self.opset, tuple(inputs), tuple(outputs),
                     MappingProxyType(self.constants), tuple(steps), MappingProxyType(tensors))

    def _opset(self) -> int:
        versions = {imp.domain: imp.version for imp in self.model.opset_import}
        opset = versions.get("", versions.get("ai.onnx"))
        if opset is None:
            raise ModelError(f"model {self.name!r} imports no default-domain (ai.onnx) opset")
        if opset < MIN_OPSET:
            raise ModelError(f"model {self.name!r} uses opset {opset}; tunecache reads opset "
                             f"{MIN_OPSET} and later (convert it with "
                             "onnx.version_converter.convert_version)")
        newest = self.onnx.defs.onnx_opset_version()
        if opset > newest:
            raise ModelError(f"model {self.name!r} uses opset {opset}, which does not exist "
                             f"yet (onnx {self.onnx.__version__} defines opsets up to {newest})")
        if self.model.ir_version > self.onnx.IR_VERSION:
            raise ModelError(f"model {self.name!r} has IR version {self.model.ir_version}, "
                             f"which does not exist yet (onnx {self.onnx.__version__} reads up "
                             f"to {self.onnx.IR_VERSION})")
        return int(opset)

    def _nodes(self) -> list[ReadNode]:
        if not self.source.nodes:
            self.source.nodes.extend(self._read_nodes())
        return [replace(n, attrs=dict(n.attrs)) for n in self.source.nodes]

    def _read_nodes(self) -> list[ReadNode]:
        nodes = []
        seen: set[str] = set()
        context = checker_context(self.onnx, {
            ("" if imp.domain == "ai.onnx" else imp.domain): int(imp.version)
            for imp in self.model.opset_import}, int(self.model.ir_version))
        for index, proto in enumerate(self.model.graph.node):
            name = proto.name or f"node{index}"
            if name in seen:
                name = f"{name}#{index}"
            seen.add(name)
            try:
                attrs = {a.name: attr_value(self.onnx, a) for a in proto.attribute}
            except Exception as exc:
                raise ModelError(f"node {name!r} ({proto.op_type}) has an unreadable attribute: "
                                 f"{exc}") from exc
            domain = proto.domain if proto.domain != "ai.onnx" else ""
            node = with_scope(ReadNode(index, name, proto.op_type, tuple(proto.input),
                                       tuple(proto.output), attrs, proto, domain))
            if node.engine(self.opset):
                # (an op tunecache lacks is refused by name, unless it folds away)
                problem = schema_problem(self.onnx, node, context)
                if problem:
                    raise ModelError(f"node {name!r} ({node.op_type}): {problem}")
                self._check_node(node)
            nodes.append(node)
        return nodes

    def _reject_unsupported(self, nodes: list[ReadNode], shape_only: set[str]) -> None:
        """Refuse the nodes the executor cannot run, after folding (an op that only computes
        shapes is evaluated at load time and need not be runnable)."""
        unknown: dict[str, list[str]] = {}
        for node in nodes:
            if node.engine(self.opset) or (not node.domain and node.outputs
                                           and all(o in shape_only for o in node.outputs if o)):
                continue
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            unknown.setdefault(op, []).append(node.name)
        if unknown:
            ops = "; ".join(f"{op!r} ({_nodes_text(names)})" for op, names in unknown.items())
            raise ModelError(f"model {self.name!r} has op types tunecache cannot run: {ops}. "
                             "It runs the default-domain ops of docs/ONNX.md, and every other "
                             "one ONNX's reference implementation has for tensors (not "
                             "sequences or optionals)")

    def _check_node(self, node: ReadNode) -> None:
        """Load-time rejection of supported op types used in ways the executor cannot run."""
        where = f"node {node.name!r} ({node.op_type})"
        if node.op_type in ("BatchNormalization", "Dropout") and (
                node.attrs.get("training_mode", 0)):
            raise ModelError(f"{where}: training mode is not supported (inference only)")
        if node.op_type == "Constant" and ("sparse_value" in node.attrs
                                           or "value_string" in node.attrs
                                           or "value_strings" in node.attrs):
            raise ModelError(f"{where}: sparse and string constants are not supported")
        if node.op_type == "Pad" and node.attrs.get("mode", "constant") not in (
                "constant", "reflect", "edge", "wrap"):
            raise ModelError(f"{where}: mode {node.attrs['mode']!r} is not supported")
        if node.op_type == "Cast" and int(node.attrs.get("to", 1)) not in onnx_ops.ONNX_DTYPES:
            to = int(node.attrs.get("to", 0))
            raise ModelError(f"{where}: casts to element type {to}, which ONNX does not "
                             "define; it defines: " + ", ".join(
                                 f"{code} ({t})" for code, t in onnx_ops.ONNX_DTYPES.items()))
        if node.op_type == "Split" and "num_outputs" not in node.attrs:
            # Without `split`, the outputs split the axis evenly; the implementation needs
            # their count.
            node.attrs["num_outputs"] = len(node.outputs)

    def _read_initializers(self) -> None:
        graph = self.model.graph
        if len(graph.sparse_initializer):
            raise ModelError(f"model {self.name!r} has sparse initializers, which are not "
                             "supported")
        read = self.source.arrays
        for init in graph.initializer:
            array = read.get(init.name)
            if array is None:
                array = read[init.name] = self._read_initializer(init)
            self._set_constant(init.name, array)
        if self.source.owned:
            dropped = False
            for init in graph.initializer:
                # Shape inference reads the arrays (never the proto), so the bytes can go.
                if init.data_type == _ONNX_FLOAT and read[init.name].size >= _SHARED_FLOATS \
                        and (init.HasField("raw_data") or len(init.float_data)):
                    init.ClearField("raw_data")
                    init.ClearField("float_data")
                    dropped = True
            if dropped:
                self.model = self.source.slimmed()

    def _read_initializer(self, init: Any) -> np.ndarray:
        try:
            array = self.onnx.numpy_helper.to_array(init, base_dir=self.base_dir)
        except Exception as exc:
            where = (f" (external data is read relative to {self.base_dir!r})"
                     if self.base_dir else
                     " (pass the model's path, or load it with its external data)")
            raise ModelError(f"cannot read initializer {init.name!r}{where}: {exc}") from exc
        array.flags.writeable = False
        return array

    def _set_constant(self, name: str, array: np.ndarray) -> None:
        self.constants[name] = array
        self.shapes[name] = tuple(array.shape)
        self.dtypes[name] = array.dtype

    def _inputs(self) -> list[TensorInfo]:
        infos = []
        initializers = {init.name for init in self.model.graph.initializer}
        declared = [vi for vi in self.model.graph.input
                    if vi.name not in self.constants and vi.name not in initializers]
        names = {vi.name for vi in declared}
        extra = sorted(set(self.input_shapes) - names)
        if extra:
            raise ModelError(f"input_shapes names {', '.join(map(repr, extra))}, which "
                             f"{'is' if len(extra) == 1 else 'are'} not an input of model "
                             f"{self.name!r}; its inputs: {', '.join(sorted(names)) or 'none'}")
        for vi in declared:
            elem = vi.type.tensor_type.elem_type
            dtype = onnx_ops.ONNX_DTYPES.get(elem)
            if dtype is None:
                raise ModelError(f"input {vi.name!r} has element type "
                                 f"{self.onnx.TensorProto.DataType.Name(elem)}, which is not "
                                 "supported")
            dims = _dims(vi.type)
            if dims is not None:
                self.dim_names[vi.name] = tuple(
                    "" if d.HasField("dim_value") else (d.dim_param or "?")
                    for d in vi.type.tensor_type.shape.dim)
            override = self.input_shapes.get(vi.name)
            if override is not None:
                wanted = tuple(int(d) for d in override)
                if dims is not None and (len(dims) != len(wanted) or any(
                        d is not None and d != w for d, w in zip(dims, wanted, strict=True))):
                    raise ModelError(f"input_shapes gives input {vi.name!r} shape "
                                     f"{list(wanted)}, but the model declares "
                                     f"{_fmt_shape(dims)}")
                if any(w < 0 for w in wanted):
                    raise ModelError(f"input_shapes gives input {vi.name!r} a negative "
                                     f"dimension: {list(wanted)}")
                if not self.symbolic:
                    dims = wanted
            if dims is None or (not self.symbolic and any(d is None for d in dims)):
                labels = [str(d.dim_param or "?") for d in vi.type.tensor_type.shape.dim
                          if not d.HasField("dim_value")] if dims is not None else []
                shown = _fmt_shape(dims) if dims is not None else "unknown rank"
                raise ModelError(
                    f"input {vi.name!r} has dynamic shape {shown}"
                    + (f" (dims {', '.join(labels)})" if labels else "")
                    + f"; give its shape with input_shapes={{{vi.name!r}: [...]}}"
                )
            self.shapes[vi.name] = dims
            self.dtypes[vi.name] = dtype
            infos.append(TensorInfo(vi.name, tuple(-1 if d is None else int(d) for d in dims),
                                    dtype))
        return infos

    def _missing_shapes(self, nodes: list[ReadNode]) -> list[ReadNode]:
        """The nodes with an output of unknown shape or rank."""
        def known(name: str) -> bool:
            shape = self.shapes.get(name) if name else ()
            return shape is not None and None not in shape
        return [n for n in nodes if not all(known(o) for o in n.outputs)]

    def _infer_shapes(self, inputs: list[TensorInfo], nodes: list[ReadNode],
                      strict: bool = False) -> None:
        """ONNX shape inference over ``nodes``: every tensor they read but do not produce is
        declared with what is known of it (a model input as declared, a constant, an earlier
        node's inferred type), so a later pass can walk only the nodes still missing shapes.
        ``strict`` refuses a node whose inference fails, unless a tensor it reads has no
        known type (no earlier pass could infer it)."""
        onnx = self.onnx
        helper, numpy_helper = onnx.helper, onnx.numpy_helper
        light = onnx.ModelProto()
        light.ir_version = max(int(self.model.ir_version), 4)
        light.opset_import.extend(self.model.opset_import)
        graph = light.graph
        graph.name = self.name
        graph.node.extend(n.proto for n in nodes)
        produced = {t for n in nodes for t in n.outputs}
        read = {t for n in nodes for t in n.inputs if t and t not in produced}
        for info in inputs:
            if info.name not in read:
                continue
            read.discard(info.name)
            labels = self.dim_names.get(info.name, ())
            named: list[int | str | None] = [
                d if d >= 0 else (labels[k] if k < len(labels) and labels[k] != "?" else None)
                for k, d in enumerate(info.shape)]
            graph.input.append(helper.make_tensor_value_info(
                info.name, helper.np_dtype_to_tensor_dtype(info.dtype), named))
        for name in sorted(read):
            array = self.constants.get(name)
            if array is not None and (array.dtype.kind in "iub"
                                      or array.size <= _INFERENCE_VALUE_LIMIT):
                graph.initializer.append(numpy_helper.from_array(array, name))
            elif name in self.dtypes and self.shapes.get(name) is not None:
                graph.input.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(self.dtypes[name]),
                    list(self.shapes[name])))
            else:
                strict = False
        for out in self.model.graph.output:
            if out.name not in produced:
                continue
            vi = graph.output.add()
            vi.name = out.name
            vi.type.tensor_type.elem_type = out.type.tensor_type.elem_type
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=strict, data_prop=True)
        except Exception as exc:
            # An op tunecache does not know is the likelier culprit; name it instead.
            self._reject_unsupported(nodes, set())
            raise ModelError(f"shape inference failed on model {self.name!r}: {exc}") from exc
        for vi in (*inferred.graph.value_info, *inferred.graph.output):
            if vi.name in self.constants or not vi.type.HasField("tensor_type"):
                continue
            dims = _dims(vi.type)
            if dims is not None:
                self.shapes[vi.name] = dims
            dtype = onnx_ops.ONNX_DTYPES.get(vi.type.tensor_type.elem_type)
            if dtype is not None:
                self.dtypes[vi.name] = dtype

    def _infer_in_stages(self, inputs: list[TensorInfo], nodes: list[ReadNode]) -> None:
        """Strict shape inference over ``nodes``, in stages that end at each node whose
        shape ONNX inference can get wrong or leave out (``onnx_ops.shape_fix``: a
        ceil-mode pool's last window, opset 21's GroupNormalization): its true shape goes
        in before inference goes past it."""
        start = 0
        for i, node in enumerate(nodes):
            fix = None if node.domain else onnx_ops.shape_fix(node.op_type)
            if fix is None:
                continue
            self._infer_shapes(inputs, nodes[start:i + 1], strict=True)
            x = self.shapes.get(node.inputs[0]) if node.inputs else None
            shape = None if x is None else fix(node.attrs, x)
            if shape is not None and node.inputs[0] in self.dtypes:
                self.shapes[node.outputs[0]] = shape
                self.dtypes[node.outputs[0]] = self.dtypes[node.inputs[0]]
            start = i + 1
        if start < len(nodes):
            self._infer_shapes(inputs, nodes[start:], strict=True)

    def _check_inferred(self, nodes: list[ReadNode]) -> None:
        """Refuse what shape inference lets pass and onnxruntime does not: broken type
        constraints, a Conv weight that does not fit."""
        for node in nodes:
            problem = type_problem(self.onnx, node, self.opset, self.dtypes) or \
                conv_problem(node, self.shapes)
            if problem:
                raise ModelError(f"node {node.name!r} ({node.op_type}): {problem}")

    def _sorted(self, nodes: list[ReadNode], inputs: list[TensorInfo]) -> list[ReadNode]:
        """The nodes in a topological order (ONNX requires one; exporters sometimes slip)."""
        available = {i.name for i in inputs} | set(self.constants) | {""}
        if all(self._ready(n, available, add=True) for n in nodes):
            return nodes
        available = {i.name for i in inputs} | set(self.constants) | {""}
        pending, ordered = list(nodes), []
        while pending:
            ready = [n for n in pending if self._ready(n, available, add=False)]
            if not ready:
                node = pending[0]
                missing = [t for t in node.inputs if t not in available]
                raise ModelError(f"node {node.name!r} ({node.op_type}) uses tensor "
                                 f"{missing[0]!r}, which is not a model input, an initializer or "
                                 "the output of another node (or the graph has a cycle)")
            for node in ready:
                available.update(node.outputs)
                ordered.append(node)
            pending = [n for n in pending if n not in ready]
        return ordered

    @staticmethod
    def _ready(node: ReadNode, available: set[str], add: bool) -> bool:
        ok = all(t in available for t in node.inputs)
        if ok and add:
            available.update(node.outputs)
        return ok

    def _fold_constants(self, nodes: list[ReadNode]) -> list[ReadNode]:
        """Evaluate nodes computed from constants alone (and Shape/Size of static shapes)."""
        kept = []
        for node in nodes:
            values: list[np.ndarray] | None = None
            if node.op_type in ("Shape", "Size") and not node.domain and (
                    node.inputs[0] not in self.constants):
                shape = self.shapes.get(node.inputs[0])
                if shape is not None and all(d is not None for d in shape):
                    static = tuple(int(d) for d in shape if d is not None)
                    values = ([onnx_ops.shape_of(static, node.attrs)] if node.op_type == "Shape"
                              else [np.asarray(math.prod(static), dtype=np.int64)])
            elif node.op_type == "If" and not node.domain and node.inputs[0] in self.constants:
                branch = constant_branch(self.onnx, node, self.constants[node.inputs[0]])
                if branch is not None:  # its nodes join the graph, folded in their turn
                    inlined, constants = branch
                    for name, array in constants.items():
                        self._set_constant(name, array)
                    kept += self._fold_constants(inlined)
                    continue
            elif self._foldable(node):
                problem = type_problem(self.onnx, node, self.opset, self.dtypes)
                if problem:
                    raise ModelError(f"node {node.name!r} ({node.op_type}): {problem}")
                values = self._evaluate(node)
            if values is None:
                kept.append(node)
                continue
            for name, value in zip(node.outputs, values, strict=False):
                if name:
                    self._set_constant(name, np.asarray(value))
            if node.op_type == "DequantizeLinear" and not node.domain:
                self._record_quantized(node)
        return kept

    def _record_quantized(self, node: ReadNode) -> None:
        """Remember the integer weights a folded ``DequantizeLinear`` read (lowerings run
        them as they are); per-tensor or per-axis int8/uint8 only."""
        values = self.constants[node.inputs[0]]
        scale = self.constants[node.inputs[1]]
        zero = self.constants[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] \
            else np.zeros(1, values.dtype)
        if values.dtype not in (np.int8, np.uint8) or int(node.attrs.get("block_size", 0)):
            return
        axis = int(node.attrs.get("axis", 1))
        self.quantized[node.outputs[0]] = QuantizedConstant(
            values, scale, zero, axis + values.ndim if axis < 0 else axis)

    def _foldable(self, node: ReadNode) -> bool:
        return (not node.domain and node.op_type not in NONDETERMINISTIC
                and all(t == "" or t in self.constants for t in node.inputs))

    def _evaluate(self, node: ReadNode) -> list[np.ndarray]:
        """A constant node's outputs: onnx_ops, or ONNX's reference implementation for an op
        the executor does not run (it may only ever appear in shape computations)."""
        args = [self.constants[t] if t else None for t in node.inputs]
        try:
            if node.engine(self.opset):
                return onnx_ops.node_function(node.op_type, node.inputs, node.outputs,
                                              node.attrs, self.opset)(args)
            from onnx.reference import ReferenceEvaluator

            evaluator = ReferenceEvaluator(node.proto, opsets={"": self.opset})
            feeds = {t: a for t, a in zip(node.inputs, args, strict=True) if t}
            return [np.asarray(v) for v in evaluator.run(None, feeds)]
        except Exception as exc:
            raise ModelError(f"node {node.name!r} ({node.op_type}) computes from "
                             f"constants only but failed: {exc}") from exc

    def _shape_only(self, nodes: list[ReadNode]) -> set[str]:
        """Tensors computed from input shapes and constants only: they fold once the input
        shapes are known."""
        derived: set[str] = set()
        for node in nodes:
            if node.domain or node.op_type in NONDETERMINISTIC:
                continue
            if node.op_type in ("Shape", "Size") or all(
                    t == "" or t in self.constants or t in derived for t in node.inputs):
                derived.update(o for o in node.outputs if o)
        return derived

    def _outputs(self) -> list[TensorInfo]:
        infos = []
        for vi in self.model.graph.output:
            shape = self.shapes.get(vi.name)
            dtype = self.dtypes.get(vi.name) or onnx_ops.ONNX_DTYPES.get(
                vi.type.tensor_type.elem_type, FLOAT32)
            infos.append(TensorInfo(vi.name, tuple(-1 if d is None else d for d in shape or ()),
                                    dtype))
        return infos

    def _drop_unread_constants(self, steps: list[Step], outputs: set[str]) -> None:
        """Forget constants no step reads (folded into others, or sliced by a step pass),
        so the compiled model does not keep their bytes."""
        read = {t for step in steps for t in step.inputs} | outputs
        for name in [n for n in self.constants if n not in read]:
            del self.constants[name]

    def _shape(self, name: str) -> tuple[int, ...] | None:
        shape = self.shapes.get(name)
        if shape is None or None in shape:
            return None
        return cast(tuple[int, ...], shape)
