"""ONNX nodes as the reader holds them, and the clean-ups of a folded node list.

A :class:`ReadNode` is a node of the model with plain-Python attributes and its original
position. Before lowering, the reader (:mod:`tunecache.compiler.frontend`) drops what needs
no step: nodes whose outputs nothing reads (:func:`live`), inference no-ops such as
``Identity``, ``Dropout`` and a ``Cast`` to the dtype its input has (:func:`elide`), and
repeated computations (:func:`deduplicate`). Each returns a new list, renaming the inputs of
the nodes that read what was dropped.

The reader also refuses what onnxruntime refuses when it creates a session, with the checks
here, each returning what is wrong (or None): names defined twice or never
(:func:`definition_problem`), a node that breaks its op's schema (:func:`schema_problem`) or
type constraints (:func:`type_problem`), a ``Conv`` whose weight does not fit its input
(:func:`conv_problem`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tunecache.compiler import onnx_ops

__all__ = ["NONDETERMINISTIC", "ReadNode", "attr_value", "checker_context", "constant_branch",
           "conv_problem", "deduplicate", "definition_problem", "elide", "live", "outer_names",
           "pairwise_sums", "schema_problem", "subgraphs", "type_problem", "with_scope"]

NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli"})
"""Ops whose value is not a function of their inputs: never folded, however constant, and
never taken for a repeat of an earlier node."""

_SMALL_CONSTANT = 64
"""Constants this small are compared by value when looking for repeated computations."""


@dataclass
class ReadNode:
    """A node being loaded: its original position and plain-Python attributes."""

    index: int
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    proto: Any
    domain: str = ""

    def engine(self, opset: int) -> str | None:
        """What runs this node (:data:`~tunecache.compiler.onnx_ops.ENGINES`), or None
        where the executor cannot (another domain, an op neither tunecache nor ONNX's
        reference implementation runs)."""
        return None if self.domain else onnx_ops.engine(self.op_type, opset, self.attrs,
                                                         self.outputs)


def outer_names(graph: Any) -> list[str]:
    """The names a GraphProto's nodes (and theirs, recursively) read that it does not define
    itself: what it takes from the enclosing scope, in first-use order."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    out: dict[str, None] = {}
    for node in graph.node:
        for name in (*node.input, *(n for g in subgraphs(node) for n in outer_names(g))):
            if name and name not in defined:
                out.setdefault(name)
        defined.update(o for o in node.output if o)
    return list(out)


def subgraphs(node: Any) -> list[Any]:
    """The GraphProtos among a NodeProto's attributes."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs))]


def with_scope(node: ReadNode) -> ReadNode:
    """``node`` reading, after its own inputs, what its subgraphs take from the enclosing
    graph (``onnx_ops.SCOPE`` names them), so that ordering, liveness and the runners see those
    reads; a node without subgraphs as it is."""
    names = [n for g in subgraphs(node.proto) for n in outer_names(g)]
    if not names:
        return node
    scope = tuple(dict.fromkeys(names))
    return replace(node, inputs=(*node.inputs, *scope),
                   attrs={**node.attrs, onnx_ops.SCOPE: scope})


def attr_value(onnx: Any, attr: Any) -> Any:
    """An AttributeProto's value as plain Python: strings decoded, tensors as arrays,
    lists as tuples; subgraphs stay GraphProtos."""
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value)
    return value


def constant_branch(onnx: Any, node: ReadNode, condition: np.ndarray
                    ) -> tuple[list[ReadNode], dict[str, np.ndarray]] | None:
    """The nodes of the branch an ``If`` with a constant ``condition`` takes, to stand in
    the graph for it (so its products become kernels, and shapes flow through it), with the
    branch's initializers: names the branch defines are prefixed with the If's name, outer
    names stay, an ``Identity`` per output writes the If's. None for a branch whose nodes
    have subgraphs of their own (their names would need the same renaming)."""
    graph = node.attrs.get("then_branch" if bool(condition.reshape(-1)[0]) else "else_branch")
    if not isinstance(graph, onnx.GraphProto) or any(subgraphs(n) for n in graph.node):
        return None
    own = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output if o}

    def renamed(name: str) -> str:
        return f"{node.name}/{name}" if name in own else name

    def read(proto: Any, name: str, attrs: dict[str, Any]) -> ReadNode:
        proto = onnx.helper.make_node(proto.op_type, [renamed(t) for t in proto.input],
                                      [renamed(t) for t in proto.output], name=name,
                                      domain=proto.domain or None)
        return ReadNode(node.index, name, proto.op_type, tuple(proto.input),
                        tuple(proto.output), attrs, proto,
                        proto.domain if proto.domain != "ai.onnx" else "")

    nodes = []
    for k, inner in enumerate(graph.node):
        nodes.append(read(inner, f"{node.name}/{inner.name or k}",
                          {a.name: attr_value(onnx, a) for a in inner.attribute}))
        nodes[-1].proto.attribute.extend(inner.attribute)
    for k, (out, target) in enumerate(zip(graph.output, node.outputs, strict=False)):
        if target:
            nodes.append(read(onnx.helper.make_node("Identity", [out.name], [target]),
                              f"{node.name}/out{k}", {}))
    constants = {renamed(i.name): onnx.numpy_helper.to_array(i) for i in graph.initializer}
    return nodes, constants


def live(nodes: list[ReadNode], outputs: set[str]) -> list[ReadNode]:
    """Drop nodes whose outputs nothing needs (left behind by constant folding)."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs if o):
            kept.append(node)
            needed.update(t for t in node.inputs if t)
    return kept[::-1]


def elide(nodes: list[ReadNode], outputs: set[str],
          dtypes: Mapping[str, np.dtype]) -> list[ReadNode]:
    """Drop inference no-ops (Identity, Dropout, a Cast to the dtype its input already
    has) so that fusion sees through them."""
    used = {t for node in nodes for t in node.inputs}
    alias: dict[str, str] = {}
    kept = []
    for node in nodes:
        if any(t in alias for t in node.inputs):
            node = replace(node, inputs=tuple(alias.get(t, t) for t in node.inputs))
        out = node.outputs[0]
        if (node.op_type in ("Identity", "Dropout") or _same_type_cast(node, dtypes)) and \
                out not in outputs and not any(
                o and (o in used or o in outputs) for o in node.outputs[1:]):
            alias[out] = node.inputs[0]
            continue
        kept.append(node)
    return kept


def pairwise_sums(nodes: list[ReadNode], shapes: dict[str, tuple[int | None, ...]],
                  dtypes: dict[str, np.dtype]) -> list[ReadNode]:
    """Each n-ary ``Sum`` (older exporters write residuals so) as a chain of ``Add`` nodes,
    which the lowerings fuse (a residual into its convolution) where a ``Sum`` would run in
    numpy; a one-input ``Sum`` as an ``Identity``. The chain's intermediate tensors get
    their broadcast shape and the first input's dtype; a ``Sum`` whose input shapes are not
    all known stays as it is."""
    out = []
    for node in nodes:
        ins = [t for t in node.inputs if t]
        known = [shapes.get(t) for t in ins]
        if node.op_type != "Sum" or node.domain or not ins or any(
                s is None or None in s for s in known):
            out.append(node)
            continue
        if len(ins) == 1:
            out.append(replace(node, op_type="Identity", inputs=(ins[0],)))
            continue
        static = [tuple(int(d or 0) for d in s or ()) for s in known]
        running, shape = ins[0], static[0]
        for k, (name, other) in enumerate(zip(ins[1:], static[1:], strict=True), 1):
            last = k == len(ins) - 1
            shape = tuple(np.broadcast_shapes(shape, other))
            result = node.outputs[0] if last else f"{node.outputs[0]}/sum{k}"
            if not last:
                shapes[result], dtypes[result] = shape, dtypes.get(ins[0], np.dtype(np.float32))
            out.append(replace(node, name=node.name if last else f"{node.name}/add{k}",
                               op_type="Add", inputs=(running, name), outputs=(result,),
                               attrs={}))
            running = result
    return out


def deduplicate(nodes: list[ReadNode], outputs: set[str],
                constants: Mapping[str, np.ndarray]) -> list[ReadNode]:
    """Drop a node computing what an earlier one did (same op and attributes, the same
    inputs, small constants compared by value): its readers read the earlier outputs.
    Exporters repeat per layer what depends only on the inputs (BERT's 12 identical
    attention-mask ``Where``s)."""
    seen: dict[Hashable, ReadNode] = {}
    alias: dict[str, str] = {}
    kept = []
    for node in nodes:
        if any(t in alias for t in node.inputs):
            node = replace(node, inputs=tuple(alias.get(t, t) for t in node.inputs))
        key = _computation(node, constants)
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


def _computation(node: ReadNode, constants: Mapping[str, np.ndarray]) -> Hashable | None:
    """What ``node`` computes, as a hashable value; None when unsure (a random op,
    another domain, an attribute that is not a plain value, a missing output)."""
    if node.domain or node.op_type in NONDETERMINISTIC or not all(node.outputs):
        return None
    attrs = []
    for name, value in sorted(node.attrs.items()):
        plain = tuple(value) if isinstance(value, (list, tuple)) else value
        if not isinstance(plain, (int, float, str, bytes, tuple)) or (
                isinstance(plain, tuple) and not all(
                    isinstance(v, (int, float, str, bytes)) for v in plain)):
            return None
        attrs.append((name, plain))
    inputs = tuple(_input_identity(t, constants) for t in node.inputs)
    return node.op_type, inputs, tuple(attrs)


def _input_identity(name: str, constants: Mapping[str, np.ndarray]) -> Hashable:
    value = constants.get(name)
    if value is not None and value.size <= _SMALL_CONSTANT:
        return "value", value.dtype.str, value.shape, value.tobytes()
    return "tensor", name


def _same_type_cast(node: ReadNode, dtypes: Mapping[str, np.dtype]) -> bool:
    if node.op_type != "Cast" or not node.inputs:
        return False
    target = onnx_ops.ONNX_DTYPES.get(int(node.attrs.get("to", 0)))
    return target is not None and dtypes.get(node.inputs[0]) == target


# -- what onnxruntime refuses -----------------------------------------------------------------


def definition_problem(inputs: Sequence[str], initializers: Sequence[str],
                       nodes: Sequence[ReadNode], outputs: Sequence[str]) -> str | None:
    """How the graph breaks ONNX's naming rules, or None: every tensor is defined once (a
    graph input, an initializer, which may also be listed as an input, or one node's
    output), and the graph has outputs, each of them defined."""
    defined: dict[str, str] = {}
    for kind, names in (("a graph input", inputs), ("an initializer", initializers)):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                return f"{kind.split(' ', 1)[1]} {name!r} is declared twice"
            seen.add(name)
            defined.setdefault(name, kind)
    for node in nodes:
        for out in node.outputs:
            if not out:
                continue
            if out in defined:
                return (f"node {node.name!r} ({node.op_type}) writes {out!r}, which is already "
                        f"{defined[out]}")
            defined[out] = f"written by node {node.name!r}"
    if not outputs:
        return "the graph has no outputs"
    for name in outputs:
        if name not in defined:
            return (f"graph output {name!r} is not a graph input, an initializer or the output "
                    "of a node")
    return None


def _schema(onnx: Any, node: ReadNode, opset: int) -> Any:
    """The default-domain schema ``node`` has at ``opset``, or None (another domain, or an op
    this opset lacks: refused by name later unless it folds away)."""
    if node.domain:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:
        return None


def checker_context(onnx: Any, opset_imports: Mapping[str, int], ir_version: int) -> Any:
    """The onnx checker's context for a model's opset imports and IR version."""
    context = onnx.checker.C.CheckerContext()
    context.ir_version = ir_version
    context.opset_imports = dict(opset_imports)
    return context


def schema_problem(onnx: Any, node: ReadNode, context: Any) -> str | None:
    """What onnx's checker finds wrong with ``node`` against its op's schema (input and
    output counts, attribute names and types, required attributes) in ``context``
    (:func:`checker_context`), or None. Nodes with subgraphs are left alone (their names
    resolve in the enclosing scope)."""
    if _schema(onnx, node, context.opset_imports.get("", 0)) is None or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.proto.attribute):
        return None
    try:
        onnx.checker.check_node(node.proto, context)
    except onnx.checker.ValidationError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def _type_string(onnx: Any, dtype: np.dtype) -> str:
    """``tensor(float)`` for float32: how schemas spell a tensor's type."""
    code = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    return f"tensor({onnx.TensorProto.DataType.Name(code).lower()})"


def type_problem(onnx: Any, node: ReadNode, opset: int,
                 dtypes: Mapping[str, np.dtype]) -> str | None:
    """Which input of ``node`` breaks its op's type constraints, or None: an element type
    the constraint does not allow, or two inputs bound to one type parameter (``T`` of
    ``MatMul``'s A and B) with different types. Inputs of unknown type are not checked."""
    schema = _schema(onnx, node, opset)
    if schema is None or not schema.inputs:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[str, str]] = {}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    for i, name in enumerate(node.inputs):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)]
        if i >= len(schema.inputs) and formal.option != variadic:
            break
        dtype = dtypes.get(name) if name else None
        if dtype is None:
            continue
        actual = _type_string(onnx, dtype)
        if formal.type_str not in allowed:
            if formal.type_str.startswith("tensor(") and actual != formal.type_str:
                return f"input {name!r} is {actual}, where {formal.type_str} is expected"
            continue
        if actual not in allowed[formal.type_str]:
            return (f"input {name!r} is {actual}, which its type parameter {formal.type_str} "
                    "does not allow")
        first = bound.setdefault(formal.type_str, (name, actual))
        if first[1] != actual and (i < len(schema.inputs) or formal.is_homogeneous):
            return (f"inputs {first[0]!r} and {name!r} share type parameter {formal.type_str} "
                    f"but are {first[1]} and {actual}")
    return None


def conv_problem(node: ReadNode, shapes: Mapping[str, tuple[int | None, ...] | None]
                 ) -> str | None:
    """How a ``Conv`` node's weight contradicts its input, its group count, its
    ``kernel_shape`` or its bias (which ONNX shape inference lets pass and onnxruntime
    refuses), or None. Unknown dimensions are not checked."""
    if node.op_type != "Conv" or node.domain or len(node.inputs) < 2:
        return None
    x, w = shapes.get(node.inputs[0]), shapes.get(node.inputs[1])
    if x is None or w is None:
        return None
    groups = int(node.attrs.get("group", 1))
    if len(x) != len(w):
        return f"input rank {len(x)} differs from the weight's {len(w)}"
    if groups < 1 or (w[0] is not None and w[0] % groups):
        return f"group {groups} does not divide the weight's {w[0]} output channels"
    if x[1] is not None and w[1] is not None and x[1] != w[1] * groups:
        return (f"the input has {x[1]} channels, but the weight {list(w)} with group {groups} "
                f"takes {w[1] * groups}")
    kernel = tuple(node.attrs.get("kernel_shape", ()))
    if kernel and kernel != tuple(w[2:]):
        return f"kernel_shape {list(kernel)} differs from the weight's {list(w[2:])}"
    bias = shapes.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if bias is not None and w[0] is not None and (len(bias) != 1 or bias[0] not in (None, w[0])):
        return f"the bias has shape {list(bias)}, not [{w[0]}]"
    return None
