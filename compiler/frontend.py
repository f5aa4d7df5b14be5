"""Read ONNX models into a :class:`Graph` of kernel calls and numpy-run nodes.

:func:`load_graph` reads a model (a path, with external data resolved relative to the model's
folder, or a loaded ``onnx.ModelProto``), fixes dynamic input dimensions from
``input_shapes``, infers every tensor's shape with ONNX shape inference (``data_prop`` on),
folds constant subgraphs (``Constant`` nodes, ``Shape`` of static shapes and everything
computed only from constants), and turns ``Conv``, ``MatMul`` and ``Gemm`` nodes into
:class:`KernelNode` s — one :class:`~tunecache.compiler.ops.OpSignature` each, with foldable
neighbours fused in:

* ``Conv`` (2-D) + ``BatchNormalization`` (folded into new weights and bias) + ``Add`` of a
  per-channel constant (into the bias) + residual ``Add`` (epilogue ``add``) + ``Relu``;
* ``MatMul``/``Gemm`` + ``Add`` of a bias over the last axis (epilogue ``bias``) + ``Relu``.

A neighbour is fused only when the intermediate tensor has exactly one use and is not a graph
output. Every other node becomes an :class:`OnnxNode`, run by the executor with numpy. Ops are
checked after folding: a shape computation folds whatever its ops (those the executor lacks
are evaluated with ONNX's reference implementation), and a node left that the executor cannot
run is an error here, at load time, naming the node and op type. :func:`inspect_model` reads
a model whose inputs keep dynamic dimensions: its interface, and the same check, sparing the
nodes that compute from input shapes only. See docs/ONNX.md for the op set, opset handling,
fusion rules and dynamic shapes.

Needs the ``onnx`` package (a dependency of tunecache); it is imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tunecache.compiler import onnx_ops
from tunecache.compiler.errors import OpSignatureError, TunecacheError
from tunecache.compiler.kinds.conv2d import ACTIVATIONS
from tunecache.compiler.lowering import (
    clip_step,
    lowerings_for,
    other_input,
    producers,
    readers,
    silu_nodes,
    step_passes,
)
from tunecache.compiler.memo import IdentityMemo
from tunecache.compiler.ops import OpSignature

if TYPE_CHECKING:
    import onnx

    from tunecache.compiler.hardware import HardwareSpec

__all__ = [
    "MIN_OPSET", "Graph", "KernelNode", "ModelError", "ModelInfo", "ModelSource", "OnnxNode",
    "TensorInfo", "inspect_model", "kernel_ops", "load_graph", "read_model", "supported_ops",
]

# Opsets 7 and 8 differ from 9 only in ops we do not run or in ways the implementations
# already accept (BatchNormalization's `spatial`); before 7, Add/Mul used legacy broadcasting.
MIN_OPSET = 7
KERNEL_OP_TYPES = ("Conv", "MatMul", "Gemm")
FLOAT32 = np.dtype(np.float32)
# Initializers up to this many elements (and every integer one) go to shape inference with
# their values, so that data propagation sees Reshape targets, Slice bounds, etc.; larger
# ones go as typed inputs, which keeps inference from copying the weights.
_INFERENCE_VALUE_LIMIT = 1024
# Ops whose value is not a function of their inputs: never folded, however constant.
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                               "RandomUniformLike", "Multinomial", "Bernoulli"})


class ModelError(TunecacheError):
    """An ONNX model cannot be read or run: malformed file, unsupported op, bad inputs."""


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: name, shape (``-1`` for a dimension left unknown), dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class KernelNode:
    """One generated-kernel call, fusing one or more ONNX nodes.

    ``inputs`` name the tensors for the kernel's input arguments in
    ``op.arguments()`` order (A, B, [bias] for matmuls; X, W, [bias], [add] for conv2d);
    constants among them are entries of :attr:`Graph.constants`. The executor reshapes each
    to its argument's shape (same element count) and the kernel's output to ``output_shape``.
    """

    name: str
    nodes: tuple[str, ...]
    op: OpSignature
    inputs: tuple[str, ...]
    output: str
    output_shape: tuple[int, ...]


@dataclass(frozen=True)
class OnnxNode:
    """A node run with numpy (:mod:`tunecache.compiler.onnx_ops`).

    ``inputs``/``outputs`` keep ONNX's positions (``""`` for an omitted optional one).
    ``note`` says why a ``Conv``/``MatMul``/``Gemm`` node did not become a kernel (empty
    otherwise).
    """

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(compare=False, hash=False)
    note: str = ""


Step = KernelNode | OnnxNode


@dataclass(frozen=True, eq=False)
class Graph:
    """A loaded model: static inputs and outputs, constants, and steps in execution order."""

    name: str
    opset: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    constants: Mapping[str, np.ndarray]
    steps: tuple[Step, ...]
    tensors: Mapping[str, tuple[tuple[int, ...], np.dtype]] = field(
        default_factory=lambda: MappingProxyType({}))
    """Static shape and dtype of each tensor the loader inferred (steps' outputs among
    them); empty for graphs rewritten since (layout planning), whose shapes are traced."""

    @property
    def kernel_nodes(self) -> tuple[KernelNode, ...]:
        """The steps that call generated kernels, in execution order."""
        return tuple(s for s in self.steps if isinstance(s, KernelNode))

    @property
    def onnx_nodes(self) -> tuple[OnnxNode, ...]:
        """The steps run with numpy, in execution order."""
        return tuple(s for s in self.steps if isinstance(s, OnnxNode))


def supported_ops() -> tuple[str, ...]:
    """The ONNX op types (default domain) a model may use, sorted."""
    return tuple(sorted(onnx_ops.OPS))


# -- loading -------------------------------------------------------------------------------


def _import_onnx() -> Any:
    try:
        import onnx
        import onnx.numpy_helper
        import onnx.shape_inference
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError(
            "reading ONNX models needs the onnx package: pip install onnx"
        ) from exc
    return onnx


_SMALL_CONSTANT = 64
"""Constants this small are compared by value when looking for repeated computations."""
_ONNX_FLOAT = 1
"""``TensorProto.FLOAT``."""
_SHARED_FLOATS = 1024
"""Float initializers this large leave an owned source's proto once read (weights, not the
small constants folding and shape inference look at)."""


@dataclass(eq=False)
class ModelSource:
    """A model read once and loaded many times (once per input shape): the ``ModelProto``
    without its external data, the folder that data is read from, and a default name.

    Its initializers are converted to arrays once, on the first load, and every later load
    shares those (read-only) arrays: the weights of a model planned at many shapes are held
    once. A source that read its own file (``owned``, :func:`read_model`) then also drops
    the large float initializers' bytes from its proto, which is not handed out."""

    model: Any
    base_dir: str
    name: str
    owned: bool = False
    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    derived: IdentityMemo[np.ndarray] = field(default_factory=IdentityMemo, repr=False)
    """Constants a lowering computed from others (weight slices, say), kept for the next
    load while the arrays they came from live."""
    nodes: list[_Node] = field(default_factory=list, repr=False)
    """The graph's nodes as read and checked by the first load; later loads copy them
    instead of parsing every attribute again."""

    def slimmed(self) -> Any:
        """Replace the proto by a copy parsed anew from its bytes, and return it: a cleared
        field's bytes stay in the message's arena (protobuf's upb backend) until the whole
        message goes, so dropping the weights' bytes frees nothing until then (BERT-base:
        414 MB held twice, as arrays and in the proto)."""
        self.model = type(self.model).FromString(self.model.SerializeToString())
        return self.model


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


def read_model(path: str | Path) -> ModelSource:
    """Read a model file once (external data stays on disk, read at each load)."""
    onnx = _import_onnx()
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"ONNX model {str(path)!r} does not exist or is not a file")
    try:
        # External data is read per initializer by numpy_helper.to_array (relative to the
        # model's folder), straight into arrays, instead of into the proto and then again.
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {str(path)!r}: not a valid ONNX protobuf "
                         f"({type(exc).__name__}: {exc})") from exc
    return ModelSource(model, str(path.parent), path.stem, owned=True)


def _source(path_or_model: str | Path | onnx.ModelProto | ModelSource) -> ModelSource:
    onnx = _import_onnx()
    if isinstance(path_or_model, ModelSource):
        return path_or_model
    if isinstance(path_or_model, (str, Path)):
        return read_model(path_or_model)
    if isinstance(path_or_model, onnx.ModelProto):
        return ModelSource(path_or_model, "", "model")
    raise ModelError(f"load_graph needs a path or an onnx.ModelProto, got "
                     f"{type(path_or_model).__name__}")


def load_graph(path_or_model: str | Path | onnx.ModelProto | ModelSource,
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Read an ONNX model into a :class:`Graph`.

    ``path_or_model`` is a file (external data is read relative to its folder), a loaded
    ``ModelProto`` (its external data must already be loaded) or a :class:`ModelSource`.
    ``input_shapes`` fixes input dimensions the model leaves dynamic (and must agree with the
    static ones); every input dimension must be known in the end. Constant subgraphs (shape
    computations included) are folded before ops are checked, so an op the executor cannot
    run is an error only if it survives folding. Raises :class:`ModelError` for an unreadable
    or malformed model, such an op, or bad ``input_shapes``.
    """
    source = _source(path_or_model)
    return _Loader(_import_onnx(), source, input_shapes, symbolic=False).load()


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
               hw: HardwareSpec | None = None) -> list[tuple[OpSignature, int, str]]:
    """The distinct kernel ops of a model: ``(op, count, label)`` in first-use order.

    ``label`` names the kernel nodes using the op (the first few, then how many more).
    With ``hw``, the ops a model compiled for ``hw`` runs: its activations' layouts planned
    (:func:`tunecache.compiler.layout_plan.plan_layouts`), reorders included, and kernel
    pairs fused (:func:`tunecache.compiler.fusion.fuse_pairs`).
    """
    graph = load_graph(path, input_shapes)
    if hw is not None:
        from tunecache.compiler.fusion import fuse_pairs
        from tunecache.compiler.layout_plan import plan_layouts

        graph, _ = fuse_pairs(plan_layouts(graph, hw).graph)
    users: dict[OpSignature, list[str]] = {}
    for node in graph.kernel_nodes:
        users.setdefault(node.op, []).append(node.name)
    out = []
    for op, names in users.items():
        label = ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        out.append((op, len(names), label))
    return out


@dataclass
class _Node:
    """A node being loaded: its original position and plain-Python attributes."""

    index: int
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    proto: Any
    domain: str = ""

    @property
    def supported(self) -> bool:
        """Whether the executor can run this node (default domain, an op in onnx_ops)."""
        return not self.domain and self.op_type in onnx_ops.OPS


def _attr_value(onnx: Any, attr: Any) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value)
    return value


def _dims(type_proto: Any) -> tuple[int | None, ...] | None:
    """The dims of a tensor type, None for an unknown dim, or None for an unknown rank."""
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class _Loader:
    """One load: reads, infers shapes, folds constants, fuses, and builds the Graph."""

    def __init__(self, onnx: Any, source: ModelSource,
                 input_shapes: Mapping[str, Sequence[int]] | None, symbolic: bool,
                 lower: bool = True) -> None:
        self.onnx = onnx
        self.lower = lower
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
        self.step_names: set[str] = set()

    # -- the pipeline ---------------------------------------------------------------------

    def _folded(self) -> tuple[list[TensorInfo], list[_Node]]:
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
        nodes = self._sorted(nodes, inputs)
        # What the input shapes and constants alone determine folds first, so that shape
        # inference (the load's costliest step) walks fewer nodes.
        nodes = self._fold_constants(nodes)
        self._infer_shapes(inputs, nodes)
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
        return inputs, nodes

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
        nodes = self._elide(self._live(nodes, {o.name for o in outputs}),
                            {o.name for o in outputs})
        nodes = self._deduplicate(nodes, {o.name for o in outputs})
        steps = self._fuse(nodes, {o.name for o in outputs})
        if self.lower:
            for rewrite in step_passes():
                steps = rewrite(steps, self)
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
        return int(opset)

    def _nodes(self) -> list[_Node]:
        if not self.source.nodes:
            self.source.nodes.extend(self._read_nodes())
        return [replace(n, attrs=dict(n.attrs)) for n in self.source.nodes]

    def _read_nodes(self) -> list[_Node]:
        nodes = []
        seen: set[str] = set()
        for index, proto in enumerate(self.model.graph.node):
            name = proto.name or f"node{index}"
            if name in seen:
                name = f"{name}#{index}"
            seen.add(name)
            try:
                attrs = {a.name: _attr_value(self.onnx, a) for a in proto.attribute}
            except Exception as exc:
                raise ModelError(f"node {name!r} ({proto.op_type}) has an unreadable attribute: "
                                 f"{exc}") from exc
            domain = proto.domain if proto.domain != "ai.onnx" else ""
            node = _Node(index, name, proto.op_type, tuple(proto.input), tuple(proto.output),
                         attrs, proto, domain)
            if node.supported:
                self._check_node(node)
            nodes.append(node)
        return nodes

    def _reject_unsupported(self, nodes: list[_Node], shape_only: set[str]) -> None:
        """Refuse the nodes the executor cannot run, after folding (an op that only computes
        shapes is evaluated at load time and need not be runnable)."""
        unknown = []
        for node in nodes:
            if node.supported or (not node.domain and node.outputs
                                  and all(o in shape_only for o in node.outputs if o)):
                continue
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            unknown.append(f"node {node.name!r} has op type {op!r}")
        if unknown:
            more = f" (and {len(unknown) - 1} more unsupported node(s))" if len(unknown) > 1 else ""
            raise ModelError(f"{unknown[0]}, which tunecache cannot run{more}; supported op "
                             f"types: {', '.join(supported_ops())} (see docs/ONNX.md)")

    def _check_node(self, node: _Node) -> None:
        """Load-time rejection of supported op types used in ways the executor cannot run."""
        where = f"node {node.name!r} ({node.op_type})"
        if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
            raise ModelError(f"{where}: the Indices output is not supported")
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

    def _missing_shapes(self, nodes: list[_Node]) -> list[_Node]:
        """The nodes with an output of unknown shape or rank."""
        def known(name: str) -> bool:
            shape = self.shapes.get(name) if name else ()
            return shape is not None and None not in shape
        return [n for n in nodes if not all(known(o) for o in n.outputs)]

    def _infer_shapes(self, inputs: list[TensorInfo], nodes: list[_Node]) -> None:
        """ONNX shape inference over ``nodes``: every tensor they read but do not produce is
        declared with what is known of it (a model input as declared, a constant, an earlier
        node's inferred type), so a later pass can walk only the nodes still missing shapes."""
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
        for out in self.model.graph.output:
            if out.name not in produced:
                continue
            vi = graph.output.add()
            vi.name = out.name
            vi.type.tensor_type.elem_type = out.type.tensor_type.elem_type
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
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

    def _sorted(self, nodes: list[_Node], inputs: list[TensorInfo]) -> list[_Node]:
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
    def _ready(node: _Node, available: set[str], add: bool) -> bool:
        ok = all(t in available for t in node.inputs)
        if ok and add:
            available.update(node.outputs)
        return ok

    def _fold_constants(self, nodes: list[_Node]) -> list[_Node]:
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
            elif self._foldable(node):
                values = self._evaluate(node)
            if values is None:
                kept.append(node)
                continue
            for name, value in zip(node.outputs, values, strict=False):
                if name:
                    self._set_constant(name, np.asarray(value))
        return kept

    def _foldable(self, node: _Node) -> bool:
        return (not node.domain and node.op_type not in _NONDETERMINISTIC
                and all(t == "" or t in self.constants for t in node.inputs))

    def _evaluate(self, node: _Node) -> list[np.ndarray]:
        """A constant node's outputs: onnx_ops, or ONNX's reference implementation for an op
        the executor does not run (it may only ever appear in shape computations)."""
        args = [self.constants[t] if t else None for t in node.inputs]
        try:
            impl = onnx_ops.OPS.get(node.op_type)
            if impl is not None:
                return impl(args, node.attrs, self.opset)
            from onnx.reference import ReferenceEvaluator

            evaluator = ReferenceEvaluator(node.proto, opsets={"": self.opset})
            feeds = {t: a for t, a in zip(node.inputs, args, strict=True) if t}
            return [np.asarray(v) for v in evaluator.run(None, feeds)]
        except Exception as exc:
            raise ModelError(f"node {node.name!r} ({node.op_type}) computes from "
                             f"constants only but failed: {exc}") from exc

    def _shape_only(self, nodes: list[_Node]) -> set[str]:
        """Tensors computed from input shapes and constants only: they fold once the input
        shapes are known."""
        derived: set[str] = set()
        for node in nodes:
            if node.domain or node.op_type in _NONDETERMINISTIC:
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

    @staticmethod
    def _live(nodes: list[_Node], outputs: set[str]) -> list[_Node]:
        """Drop nodes whose outputs nothing needs (left behind by constant folding)."""
        needed = set(outputs)
        live = []
        for node in reversed(nodes):
            if any(o in needed for o in node.outputs if o):
                live.append(node)
                needed.update(t for t in node.inputs if t)
        return live[::-1]

    def _elide(self, nodes: list[_Node], outputs: set[str]) -> list[_Node]:
        """Drop inference no-ops (Identity, Dropout, a Cast to the dtype its input already
        has) so that fusion sees through them."""
        used = {t for node in nodes for t in node.inputs}
        alias: dict[str, str] = {}
        kept = []
        for node in nodes:
            if any(t in alias for t in node.inputs):
                node = replace(node, inputs=tuple(alias.get(t, t) for t in node.inputs))
            out = node.outputs[0]
            if (node.op_type in ("Identity", "Dropout") or self._same_type_cast(node)) and \
                    out not in outputs and not any(
                    o and (o in used or o in outputs) for o in node.outputs[1:]):
                alias[out] = node.inputs[0]
                continue
            kept.append(node)
        return kept

    def _deduplicate(self, nodes: list[_Node], outputs: set[str]) -> list[_Node]:
        """Drop a node computing what an earlier one did (same op and attributes, the same
        inputs, small constants compared by value): its readers read the earlier outputs.
        Exporters repeat per layer what depends only on the inputs (BERT's 12 identical
        attention-mask ``Where``s)."""
        seen: dict[Hashable, _Node] = {}
        alias: dict[str, str] = {}
        kept = []
        for node in nodes:
            if any(t in alias for t in node.inputs):
                node = replace(node, inputs=tuple(alias.get(t, t) for t in node.inputs))
            key = self._computation(node)
            earlier = seen.get(key) if key is not None else None
            if earlier is not None and len(earlier.outputs) == len(node.outputs) and \
                    not any(o in outputs for o in node.outputs):
                alias.update((o, e) for o, e in zip(node.outputs, earlier.outputs, strict=True)
                             if o)
                continue
            if key is not None:
                seen.setdefault(key, node)
            kept.append(node)
        return kept

    def _computation(self, node: _Node) -> Hashable | None:
        """What ``node`` computes, as a hashable value; None when unsure (a random op,
        another domain, an attribute that is not a plain value, a missing output)."""
        if node.domain or node.op_type in _NONDETERMINISTIC or not all(node.outputs):
            return None
        attrs = []
        for name, value in sorted(node.attrs.items()):
            plain = tuple(value) if isinstance(value, (list, tuple)) else value
            if not isinstance(plain, (int, float, str, bytes, tuple)) or (
                    isinstance(plain, tuple) and not all(
                        isinstance(v, (int, float, str, bytes)) for v in plain)):
                return None
            attrs.append((name, plain))
        inputs = tuple(self._input_identity(t) for t in node.inputs)
        return node.op_type, inputs, tuple(attrs)

    def _input_identity(self, name: str) -> Hashable:
        value = self.constants.get(name)
        if value is not None and value.size <= _SMALL_CONSTANT:
            return "value", value.dtype.str, value.shape, value.tobytes()
        return "tensor", name

    def _same_type_cast(self, node: _Node) -> bool:
        if node.op_type != "Cast" or not node.inputs:
            return False
        target = onnx_ops.ONNX_DTYPES.get(int(node.attrs.get("to", 0)))
        return target is not None and self.dtypes.get(node.inputs[0]) == target

    # -- fusion ---------------------------------------------------------------------------

    def _fuse(self, nodes: list[_Node], outputs: set[str]) -> list[Step]:
        # Per tensor, the position of each read (a node reading it twice counts twice).
        self.readers = readers(nodes)
        self.producers = producers(nodes)
        self.graph_outputs = outputs
        self.nodes = nodes
        self.taken = [False] * len(nodes)
        self.helpers: list[OnnxNode] = []
        slots: list[list[Step]] = [[] for _ in nodes]
        for position, node in enumerate(nodes):
            if self.taken[position]:
                continue
            # Lowerings first: a multi-node pattern (attention) may start at a MatMul.
            lowered = self._lowered(position) if self.lower else None
            if lowered is not None:
                slots[lowered[1]] += [*lowered[2], lowered[0]]
                continue
            note = ""
            if node.op_type in KERNEL_OP_TYPES:
                built = self._kernel(position)
                if isinstance(built, tuple):
                    kernel, last = built
                    slots[last].append(kernel)
                    continue
                note = built
            slots[position].append(OnnxNode(node.name, node.op_type, node.inputs, node.outputs,
                                            MappingProxyType(node.attrs), note))
        return [step for slot in slots for step in slot]

    def _lowered(self, position: int) -> tuple[KernelNode, int, list[OnnxNode]] | None:
        """The first registered lowering (:mod:`tunecache.compiler.lowering`) that turns the
        node at ``position`` into a kernel, with the helper nodes it added (run just before
        the kernel), or None: the node then runs in numpy (or as a Conv/MatMul/Gemm kernel)."""
        node = self.nodes[position]
        if node.domain:
            return None
        for lowering in lowerings_for(node.op_type):
            self.helpers = []
            built = lowering(self, position)
            if isinstance(built, tuple):
                return built[0], built[1], self.helpers
        return None

    # -- the view lowerings have of the graph (lowering.FusionContext) ---------------------

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self._shape(name)

    def is_float32(self, name: str) -> bool:
        return self._float32(name)

    def producer(self, tensor: str) -> int | None:
        return self.producers.get(tensor)

    def sole_consumer(self, tensor: str) -> int | None:
        return self._next(tensor)

    def consumers(self, tensor: str) -> tuple[int, ...] | None:
        readers = self.readers.get(tensor, [])
        if not readers or tensor in self.graph_outputs or any(self.taken[p] for p in readers):
            return None
        return tuple(sorted(set(readers)))

    def add_node(self, op_type: str, inputs: list[str], attrs: dict[str, Any],
                 shape: tuple[int, ...]) -> str:
        name = self._fresh_name(f"{inputs[0]}/{op_type.lower()}")
        self.shapes[name] = tuple(int(d) for d in shape)
        self.dtypes[name] = self.dtypes.get(inputs[0], FLOAT32)
        self.helpers.append(OnnxNode(name, op_type, tuple(inputs), (name,),
                                     MappingProxyType(dict(attrs))))
        return name

    def add_constant(self, base: str, array: np.ndarray) -> str:
        return self._new_constant(base, array)

    def is_graph_output(self, name: str) -> bool:
        return name in self.graph_outputs

    def derived_constant(self, base: str, key: Hashable, sources: tuple[np.ndarray, ...],
                         make: Callable[[], np.ndarray]) -> str:
        def made() -> np.ndarray:
            array = np.ascontiguousarray(make(), dtype=FLOAT32)
            array.flags.writeable = False
            return array

        array = self.source.derived.get(sources, key, made)
        name = self._fresh_name(base)
        self._set_constant(name, array)
        return name

    def _drop_unread_constants(self, steps: list[Step], outputs: set[str]) -> None:
        """Forget constants no step reads (folded into others, or sliced by a step pass),
        so the compiled model does not keep their bytes."""
        read = {t for step in steps for t in step.inputs} | outputs
        for name in [n for n in self.constants if n not in read]:
            del self.constants[name]

    def finish(self, position: int, fused: list[int], sig: OpSignature, inputs: list[str],
               output: str) -> tuple[KernelNode, int] | str:
        return self._finish(position, fused, sig, inputs, output)

    def _next(self, tensor: str) -> int | None:
        """The position of the only node using ``tensor``, if fusing it away is safe."""
        if self._uses(tensor) != 1 or tensor in self.graph_outputs:
            return None
        position = self.readers[tensor][-1]
        return None if self.taken[position] else position

    def _uses(self, tensor: str) -> int:
        return len(self.readers.get(tensor, ()))

    def _shape(self, name: str) -> tuple[int, ...] | None:
        shape = self.shapes.get(name)
        if shape is None or None in shape:
            return None
        return cast(tuple[int, ...], shape)

    def _float32(self, name: str) -> bool:
        return self.dtypes.get(name) == FLOAT32

    def _new_constant(self, base: str, array: np.ndarray) -> str:
        name = self._fresh_name(base)
        self._set_constant(name, np.ascontiguousarray(array, dtype=FLOAT32))
        return name

    def _fresh_name(self, base: str) -> str:
        """``base``, or ``base`` with a number after it: a tensor name not yet in use."""
        name = base
        n = 1
        while name in self.constants or name in self.shapes:
            n += 1
            name = f"{base}{n}"
        return name

    def _kernel(self, position: int) -> tuple[KernelNode, int] | str:
        """A kernel for the node at ``position`` and its fused followers, or why not."""
        node = self.nodes[position]
        for t in node.inputs:
            if t and not self._float32(t):
                return f"input {t!r} is not float32"
        try:
            if node.op_type == "Conv":
                return self._conv(position)
            return self._matmul(position)
        except OpSignatureError as exc:
            return f"no kernel signature: {exc}"

    def _finish(self, position: int, fused: list[int], sig: OpSignature, inputs: list[str],
                output: str) -> tuple[KernelNode, int] | str:
        out_shape = self._shape(output)
        if out_shape is None:
            raise ModelError(f"cannot determine the shape of {output!r}, the output of node "
                             f"{self.nodes[fused[-1]].name!r}; give static input shapes")
        produced = next(a.shape for a in sig.arguments() if a.role == "output")
        if math.prod(produced) != math.prod(out_shape):  # pragma: no cover - defensive
            return f"kernel output {produced} does not match the ONNX output {out_shape}"
        for p in fused:
            self.taken[p] = True
        node = KernelNode(self.nodes[position].name, tuple(self.nodes[p].name for p in fused),
                          sig, tuple(inputs), output, out_shape)
        return node, fused[-1]

    def _channel_constant(self, name: str, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
        """A constant broadcast along ``axis`` of ``out_shape`` only, as a 1-D vector, or None."""
        value = self.constants.get(name)
        if value is None or value.dtype != FLOAT32 or value.ndim > len(out_shape):
            return None
        padded = (1,) * (len(out_shape) - value.ndim) + value.shape
        for i, (v, o) in enumerate(zip(padded, out_shape, strict=True)):
            if (i == axis and v not in (1, o)) or (i != axis and v != 1):
                return None
        return np.broadcast_to(value.reshape(padded[axis]), (out_shape[axis],))

    def _conv(self, position: int) -> tuple[KernelNode, int] | str:
        node = self.nodes[position]
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        x_shape, w_shape = self._shape(x), self._shape(w)
        if x_shape is None or w_shape is None:
            raise ModelError(f"cannot determine the input shapes of node {node.name!r} (Conv); "
                             "give static input shapes")
        if len(x_shape) != 4:
            return f"{len(x_shape) - 2}-D convolution (kernels are 2-D)"
        p = onnx_ops.conv_params(node.attrs, x_shape, w_shape)
        n, c, h, wd = x_shape
        f, _, r, s = w_shape
        epilogue: list[str] = ["bias"] if bias else []
        fused = [position]
        add_input: str | None = None
        weight_name = w
        out = node.outputs[0]
        while True:
            silu = self._silu_after(out)
            if silu is not None:
                epilogue.append("silu")
                fused += silu
                out = self.nodes[silu[-1]].outputs[0]
                break
            nxt = self._next(out)
            if nxt is None:
                break
            follower = self.nodes[nxt]
            activation = self._activation(follower, out)
            if activation is not None:
                epilogue.append(activation)
                fused.append(nxt)
                out = follower.outputs[0]
                break
            if follower.op_type == "BatchNormalization" and "add" not in epilogue:
                folded = self._fold_bn(follower, weight_name, bias, f)
                if folded is None:
                    break
                weight_name, bias = folded
                epilogue = ["bias"]
            elif follower.op_type == "Add":
                other = follower.inputs[1] if follower.inputs[0] == out else follower.inputs[0]
                out_shape = self._shape(follower.outputs[0])
                vector = (self._channel_constant(other, out_shape, 1)
                          if out_shape is not None and out_shape == self._shape(out) else None)
                if vector is not None and (bias is None or bias in self.constants):
                    total = vector if bias is None else self.constants[bias] + vector
                    bias = self._new_constant(f"{node.name}/bias", total)
                    if "bias" not in epilogue:
                        epilogue.insert(0, "bias")
                elif ("add" not in epilogue and self._float32(other)
                      and self._shape(other) is not None
                      and self._shape(other) == self._shape(out) == out_shape):
                    add_input = other
                    epilogue = [e for e in epilogue if e == "bias"] + ["add"]
                else:
                    break
            else:
                break
            fused.append(nxt)
            out = follower.outputs[0]
        sig = OpSignature.conv2d(n, c, h, wd, f, r, s, stride=p.stride, pads=p.pads,
                                 dilation=p.dilation, groups=p.groups, epilogue=tuple(epilogue))
        inputs = [x, weight_name] + ([bias] if bias else []) + ([add_input] if add_input else [])
        return self._finish(position, fused, sig, inputs, out)

    def _activation(self, node: _Node, value: str) -> str | None:
        """The conv epilogue activation ``node`` applies to ``value``, if it is one: ``Relu``,
        ``Clip(0, 6)`` or ``Clip(0, inf)`` (another Clip is not)."""
        if node.op_type == "Relu":
            return "relu"
        if node.op_type == "Clip" and node.inputs[0] == value:
            step = clip_step(self, node.attrs, node.inputs)
            return step if step in ACTIVATIONS else None
        return None

    def _silu_after(self, tensor: str) -> list[int] | None:
        """The positions of ``Sigmoid(tensor)`` and ``Mul(tensor, it)`` when they are the only
        readers of ``tensor`` (not a graph output) and may be fused away: a conv's SiLU."""
        if self._uses(tensor) != 2 or tensor in self.graph_outputs:
            return None
        mul = self.readers[tensor][-1]
        sigmoid = self.producer(other_input(self.nodes[mul].inputs, tensor) or "")
        if sigmoid is None or self.taken[sigmoid] or self.taken[mul]:
            return None
        return silu_nodes(self, sigmoid, tensor)

    def _fold_bn(self, bn: _Node, weight: str, bias: str | None,
                 channels: int) -> tuple[str, str] | None:
        """New (weight, bias) constants with an inference BatchNormalization folded in."""
        params = [self.constants.get(t) for t in bn.inputs[1:5]]
        w = self.constants.get(weight)
        b = self.constants.get(bias) if bias else None
        if w is None or (bias and b is None) or any(
                v is None or v.size != channels for v in params):
            return None
        if any(o and (self._uses(o) or o in self.graph_outputs) for o in bn.outputs[1:]):
            return None  # the running statistics outputs are used
        scale, beta, mean, var = (np.asarray(v, dtype=np.float64).reshape(-1) for v in params
                                  if v is not None)
        factor = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        # The factor is computed in float64, the weights scaled in float32 (one pass, no
        # float64 copy of large weights).
        new_w = w * factor.astype(np.float32).reshape(-1, 1, 1, 1)
        new_b = ((b.astype(np.float64) if b is not None else 0.0) - mean) * factor + beta
        return (self._new_constant(f"{bn.name}/folded_weight", new_w),
                self._new_constant(f"{bn.name}/folded_bias", new_b))

    def _matmul(self, position: int) -> tuple[KernelNode, int] | str:
        node = self.nodes[position]
        a, b = node.inputs[0], node.inputs[1]
        a_shape, b_shape = self._shape(a), self._shape(b)
        if a_shape is None or b_shape is None:
            raise ModelError(f"cannot determine the input shapes of node {node.name!r} "
                             f"({node.op_type}); give static input shapes")
        if not a_shape or not b_shape:
            return "a scalar operand (MatMul needs at least 1-D operands)"
        bias: str | None = None
        trans_a = trans_b = False
        # With a 1-D B the output has no N axis, so a following Add is not a bias over N.
        bias_ok = len(b_shape) != 1
        if node.op_type == "Gemm":
            built = self._gemm_operands(node, a_shape, b_shape)
            if isinstance(built, str):
                return built
            a, b, bias, trans_a, trans_b = built
            m = a_shape[1] if trans_a else a_shape[0]
            k = a_shape[0] if trans_a else a_shape[1]
            nn = b_shape[0] if trans_b else b_shape[1]
            batch, shared = 1, "plain"
        else:
            a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
            b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
            m, k, nn = a2[-2], a2[-1], b2[-1]
            if b2[-2] != k:
                raise ModelError(f"node {node.name!r} (MatMul) multiplies {list(a_shape)} by "
                                 f"{list(b_shape)}: inner dimensions differ")
            a_batch, b_batch = a2[:-2], b2[:-2]
            rank = max(len(a_batch), len(b_batch))
            a_pad = (1,) * (rank - len(a_batch)) + a_batch
            b_pad = (1,) * (rank - len(b_batch)) + b_batch
            if math.prod(b_batch) == 1:
                # [b..., M, K] . [K, N] is one matmul over the flattened rows.
                m, batch, shared = m * math.prod(a_batch), 1, "plain"
            elif math.prod(a_batch) == 1:
                batch, shared = math.prod(b_batch), "a"
            elif a_pad == b_pad:
                batch, shared = math.prod(a_batch), "none"
            else:
                return (f"broadcast batch dimensions {list(a_batch)} x {list(b_batch)} "
                        "(kernels need equal batch dimensions or one 2-D operand)")
        fused = [position]
        out = node.outputs[0]
        relu = False
        while True:
            nxt = self._next(out)
            if nxt is None:
                break
            follower = self.nodes[nxt]
            if follower.op_type == "Add" and not relu and bias_ok:
                other = follower.inputs[1] if follower.inputs[0] == out else follower.inputs[0]
                merged = self._matmul_bias(other, out, follower.outputs[0], nn, bias,
                                           f"{node.name}/bias")
                if merged is None:
                    break
                bias = merged
            elif follower.op_type == "Relu":
                relu = True
            else:
                break
            fused.append(nxt)
            out = follower.outputs[0]
            if relu:
                break
        epilogue = tuple(e for e, on in (("bias", bias is not None), ("relu", relu)) if on)
        if shared == "plain" and b in self.constants:
            sig = OpSignature.matmul(m, nn, k, trans_a=trans_a, trans_b=trans_b, epilogue=epilogue)
        elif shared == "plain":
            # A product of two activations: batch_matmul, whose B is packed per call (the
            # matmul kind's B is a constant, packed once at compile time and timed so).
            sig = OpSignature.batch_matmul(1, m, nn, k, trans_a=trans_a, trans_b=trans_b,
                                           shared="none", epilogue=epilogue)
        else:
            sig = OpSignature.batch_matmul(batch, m, nn, k, shared=shared, epilogue=epilogue)
        return self._finish(position, fused, sig, [a, b] + ([bias] if bias else []), out)

    def _matmul_bias(self, other: str, product: str, result: str, n: int, bias: str | None,
                     base: str) -> str | None:
        """The bias tensor after adding ``other`` to a matmul's output, or None if not a bias."""
        out_shape = self._shape(result)
        if out_shape is None or out_shape != self._shape(product) or not self._float32(other):
            return None
        vector = self._channel_constant(other, out_shape, len(out_shape) - 1)
        if vector is not None:
            if bias is None:
                return other if self._shape(other) == (n,) else self._new_constant(base, vector)
            if bias in self.constants:
                return self._new_constant(base, self.constants[bias] + vector)
            return None
        shape = self._shape(other)
        if bias is None and shape is not None and len(shape) <= len(out_shape) and shape and (
                shape[-1] == n and math.prod(shape) == n):
            return other  # a computed bias vector, passed to the kernel as is
        return None

    def _gemm_operands(self, node: _Node, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
                       ) -> tuple[str, str, str | None, bool, bool] | str:
        """(A, B, bias, transA, transB) for a Gemm, pre-scaling constants for alpha/beta."""
        a, b = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        trans_a, trans_b = bool(node.attrs.get("transA", 0)), bool(node.attrs.get("transB", 0))
        alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
        if len(a_shape) != 2 or len(b_shape) != 2:
            return "Gemm operands are not 2-D"
        n = b_shape[0] if trans_b else b_shape[1]
        m = a_shape[1] if trans_a else a_shape[0]
        if alpha != 1.0:
            if b in self.constants:
                b = self._new_constant(f"{node.name}/B_scaled", self.constants[b] * alpha)
            elif a in self.constants:
                a = self._new_constant(f"{node.name}/A_scaled", self.constants[a] * alpha)
            else:
                return f"alpha={alpha:g} with neither operand constant"
        bias: str | None = None
        if c is not None and beta != 0.0:
            vector = self._channel_constant(c, (m, n), 1)
            if vector is not None and beta == 1.0 and self._shape(c) == (n,):
                bias = c  # already the kernel's bias vector
            elif vector is not None:
                bias = self._new_constant(f"{node.name}/bias",
                                          vector * beta if beta != 1.0 else vector)
            elif beta == 1.0 and self._shape(c) in ((n,), (1, n)):
                bias = c
            else:
                return (f"C of shape {list(self._shape(c) or ())} (beta={beta:g}) is not a bias "
                        f"over N={n}")
        return a, b, bias, trans_a, trans_b
