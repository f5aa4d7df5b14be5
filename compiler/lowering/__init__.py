"""ONNX node patterns lowered onto registered op kinds, so they run as generated kernels.

The walk (:mod:`tunecache.compiler.lowering.driver`, run by the ONNX reader on a folded,
sorted graph) asks, at each node not yet taken by an earlier fusion, the lowerings registered
for its op type, in registration order, to turn it (and single-use followers it can fuse)
into one :class:`~tunecache.compiler.graph.KernelNode`. A lowering returns the kernel node
and the position of the last node it took, or ``None``/a reason when the pattern does not
apply; the node then runs in numpy. One module per family of kinds, each registering its
op types here: neither the reader nor the walk branches on them. ``Conv`` (:mod:`.conv`),
``MatMul`` and ``Gemm`` (:mod:`.matmul`) are such families too, registered last and with
``explains``: their reason for leaving a node to numpy becomes its note.

Lowerings are tried at every node not yet taken, so a pattern is matched at its first node
in execution order (attention before the plain matmul mapping of its first MatMul). A
lowering sees the graph through :class:`FusionContext`: static shapes and dtypes, constants,
consumer links, and ways to add constants and helper nodes, nothing else.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.graph import FLOAT32, QuantizedConstant

if TYPE_CHECKING:
    from tunecache.compiler.ops import OpSignature


class GraphNode(Protocol):
    """What a lowering reads of a node."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]


class FusionContext(Protocol):
    """The walk's view of the graph being lowered."""

    @property
    def nodes(self) -> Sequence[GraphNode]:
        """The graph's nodes in execution order (positions index it)."""

    constants: dict[str, np.ndarray]
    opset: int
    int8_kernels: bool
    """Whether statically quantized products become int8 kernels (else float32 ones on the
    dequantized weights): :func:`tunecache.compiler.precision.int8_kernels_pay`."""

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The static shape of a tensor, None when unknown."""

    def is_float32(self, name: str) -> bool:
        """Whether a tensor is float32."""

    def producer(self, tensor: str) -> int | None:
        """The position of the node writing ``tensor`` (None: an input or a constant)."""

    def uses(self, tensor: str) -> int:
        """How many times nodes read ``tensor`` (a node reading it twice counts twice)."""

    def is_graph_output(self, name: str) -> bool:
        """Whether ``name`` is one of the graph's outputs."""

    def sole_consumer(self, tensor: str) -> int | None:
        """The position of the only node reading ``tensor``, if fusing it away is safe (one
        use, not a graph output, not yet taken)."""

    def consumers_of(self, tensor: str) -> tuple[int, ...]:
        """The positions of every node reading ``tensor``, taken by a fusion or not."""

    def consumers(self, tensor: str) -> tuple[int, ...] | None:
        """The positions of every node reading ``tensor``, if fusing them all away is safe
        (read at least once, not a graph output, none taken); None otherwise."""

    def add_constant(self, base: str, array: np.ndarray) -> str:
        """A new float32 constant named after ``base``; returns its name."""

    def add_typed_constant(self, base: str, array: np.ndarray) -> str:
        """A new constant named after ``base`` keeping ``array``'s dtype (integer weights,
        bfloat16 bits); returns its name."""

    def quantized(self, name: str) -> QuantizedConstant | None:
        """The integer weights a float32 constant was dequantized from, or None."""

    def add_node(self, op_type: str, inputs: list[str], attrs: dict[str, Any],
                 shape: tuple[int, ...], dtype: np.dtype | None = None) -> str:
        """A helper node run with numpy just before the kernel of the lowering adding it (a
        ``Transpose`` laying an operand out as the kernel reads it), its output of static
        ``shape`` and ``dtype`` (default: its first input's); returns the output's name.
        Dropped when the lowering does not finish."""

    def finish(self, position: int, fused: list[int], sig: OpSignature, inputs: list[str],
               output: str) -> Any:
        """The kernel node for ``fused`` (positions, ``position`` first), calling ``sig``
        with ``inputs``; marks them taken. Returns ``(KernelNode, last position)``, or a
        reason when the kernel cannot stand in for the nodes."""


Lowering = Callable[[FusionContext, int], Any]
"""``(context, position) -> (kernel node, last position) | reason it does not apply``."""


class StepContext(Protocol):
    """What a step pass reads of the lowered graph besides its steps."""

    constants: dict[str, np.ndarray]

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The static shape of a tensor, None when unknown."""

    def is_graph_output(self, name: str) -> bool:
        """Whether ``name`` is one of the graph's outputs."""

    def derived_constant(self, base: str, key: Hashable, sources: tuple[np.ndarray, ...],
                         make: Callable[[], np.ndarray]) -> str:
        """A float32 constant named after ``base`` holding ``make()``: the array computed
        by the operation ``key`` names from the constant arrays ``sources``. Computed once
        per model while those arrays live, so the model planned at other shapes reuses it
        (and the weights packed from it)."""


StepPass = Callable[[list[Any], StepContext], list[Any]]
"""``(steps, context) -> steps``: a rewrite of the lowered step list (kernel nodes, which
have an ``op``, and numpy nodes, which have an ``op_type``), run after every lowering, in
registration order. It may replace kernel nodes (``dataclasses.replace``) and drop the
numpy nodes they absorb; it keeps the order of what stays."""

_LOWERINGS: dict[str, list[Lowering]] = {}
_EXPLAINING: set[Lowering] = set()
_STEP_PASSES: list[StepPass] = []


def scalar_constant(ctx: FusionContext, name: str | None) -> float | None:
    """The value of a one-element constant, or None."""
    value = ctx.constants.get(name) if name else None
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def reduced_axes(ctx: FusionContext, node: GraphNode, rank: int) -> frozenset[int] | None:
    """The axes a ``Reduce*`` node reduces, non-negative (from the ``axes`` attribute before
    opset 18, from the constant second input since; every axis when neither is given), or
    None when they are not constants or it reduces nothing (``noop_with_empty_axes``)."""
    if len(node.inputs) > 1 and node.inputs[1]:
        value = ctx.constants.get(node.inputs[1])
        if value is None:
            return None
        axes = [int(a) for a in value.reshape(-1)]
    elif "axes" in node.attrs:
        axes = [int(a) for a in node.attrs["axes"]]
    elif int(node.attrs.get("noop_with_empty_axes", 0)):
        return None
    else:
        axes = list(range(rank))
    return frozenset(a + rank if a < 0 else a for a in axes)


def other_input(inputs: tuple[str, ...], one: str | None) -> str | None:
    """The other input of a two-input node that reads ``one``, or None."""
    if len(inputs) != 2 or one not in inputs:
        return None
    return inputs[1] if inputs[0] == one else inputs[0]


def clip_step(ctx: FusionContext, attrs: dict[str, Any], inputs: tuple[str, ...]) -> str | None:
    """The activation a ``Clip`` node computes when it is one: ``clip6`` for bounds (0, 6)
    (ReLU6), ``relu`` for (0, none or inf); None otherwise. Bounds are attributes before
    opset 11 and constant inputs from it on."""
    if ctx.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo = scalar_constant(ctx, inputs[1]) if len(inputs) > 1 and inputs[1] else None
        hi = scalar_constant(ctx, inputs[2]) if len(inputs) > 2 and inputs[2] else None
        if (len(inputs) > 1 and inputs[1] and lo is None) or (
                len(inputs) > 2 and inputs[2] and hi is None):
            return None
    if lo == 0.0 and hi == 6.0:
        return "clip6"
    if lo == 0.0 and (hi is None or math.isinf(hi)):
        return "relu"
    return None


def activation_step(node: GraphNode) -> str | None:
    """The epilogue step of a ``HardSwish``, of a ``HardSigmoid`` with torch's slope and
    offset (1/6, 1/2: MobileNet-v3's), of opset 20's ``Gelu`` (either approximation) or of
    opset 18's ``Mish``; None for any other node."""
    if node.op_type == "HardSwish":
        return "hardswish"
    if node.op_type == "Mish":
        return "mish"
    if node.op_type == "Gelu":
        return "gelu_tanh" if node.attrs.get("approximate", "none") == "tanh" else "gelu_erf"
    if node.op_type == "HardSigmoid" and math.isclose(
            float(node.attrs.get("alpha", 0.2)), 1 / 6, rel_tol=1e-6) and \
            float(node.attrs.get("beta", 0.5)) == 0.5:
        return "hardsigmoid"
    return None


def channel_constant(ctx: FusionContext, name: str, out_shape: tuple[int, ...],
                     axis: int) -> np.ndarray | None:
    """A float32 constant broadcast along ``axis`` of ``out_shape`` only, as a 1-D vector, or
    None."""
    value = ctx.constants.get(name)
    if value is None or value.dtype != FLOAT32 or value.ndim > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - value.ndim) + value.shape
    for i, (v, o) in enumerate(zip(padded, out_shape, strict=True)):
        if (i == axis and v not in (1, o)) or (i != axis and v != 1):
            return None
    return np.broadcast_to(value.reshape(padded[axis]), (out_shape[axis],))


def silu_nodes(ctx: FusionContext, position: int, value: str) -> list[int] | None:
    """``Sigmoid(value)`` at ``position``, read only by ``Mul(value, it)`` (either order):
    the positions of both, or None. Whether ``value`` itself may be fused away is the
    caller's question."""
    node = ctx.nodes[position]
    if node.op_type != "Sigmoid" or node.inputs[:1] != (value,):
        return None
    mul = ctx.sole_consumer(node.outputs[0])
    if mul is None or ctx.nodes[mul].op_type != "Mul" or \
            sorted(ctx.nodes[mul].inputs) != sorted((value, node.outputs[0])):
        return None
    return [position, mul]

BUILTIN_LOWERINGS = ("attention", "rowwise", "rmsnorm", "pool", "lrn", "rotary",
                     "elementwise", "batchnorm", "split", "quantized", "conv", "matmul", "chains",
                     "pairs", "u8", "affine", "dead")
"""Modules loaded on first use, in this order, which is the order their lowerings are tried
in: attention first (its scaling Mul and mask Add would otherwise start a scaled softmax or
an element-wise chain), then the residual-Add + LayerNormalization pattern, the RMSNorm chain
and the rotary embedding before an element-wise chain claims their Add, Sqrt, Neg or Mul;
the quantized MatMul/Gemm (integer kernels where the operands are dequantized, before the
float32 mapping would take them); the plain Conv and MatMul/Gemm kernels last, after every
pattern starting at such a node; ``chains`` holds the step pass folding element-wise chains
into the kernels they follow, ``pairs`` the one dropping quantize-dequantize pairs on
values already on their grid, ``u8`` the one passing quantized activations between int8
kernels as uint8 (after the fold: it reads the quantizers the fold put in epilogues),
``affine`` the one composing each epilogue's runs of per-channel multiplies and adds;
``dead`` holds only the step pass that drops unread steps, which runs after every other."""


def register_lowering(*op_types: str, explains: bool = False
                      ) -> Callable[[Lowering], Lowering]:
    """Register a lowering for ONNX ``op_types`` (tried after earlier registrations). With
    ``explains``, the reason it gives for not applying is the note of the numpy node left
    (see :attr:`~tunecache.compiler.graph.OnnxNode.note`)."""
    def decorate(fn: Lowering) -> Lowering:
        for op_type in op_types:
            _LOWERINGS.setdefault(op_type, []).append(fn)
        if explains:
            _EXPLAINING.add(fn)
        return fn
    return decorate


def explains(fn: Lowering) -> bool:
    """Whether ``fn`` was registered with ``explains``."""
    return fn in _EXPLAINING


def float32_kernel(ctx: FusionContext, position: int,
                   build: Callable[[FusionContext, int], Any]) -> Any:
    """``build(ctx, position)`` for a node whose inputs are all float32, with an op the kind
    refuses (:class:`~tunecache.compiler.errors.OpSignatureError`) as the reason it does not
    apply."""
    for t in ctx.nodes[position].inputs:
        if t and not ctx.is_float32(t):
            return f"input {t!r} is not float32"
    try:
        return build(ctx, position)
    except OpSignatureError as exc:
        return f"no kernel signature: {exc}"


def register_step_pass(fn: StepPass) -> StepPass:
    """Register a rewrite of the lowered steps (see :data:`StepPass`)."""
    _STEP_PASSES.append(fn)
    return fn


def step_passes() -> tuple[StepPass, ...]:
    """The registered step passes: builtin modules' in :data:`BUILTIN_LOWERINGS` order, then
    others as registered."""
    _load_builtin()
    return tuple(sorted(_STEP_PASSES, key=_builtin_rank))


def readers(steps: Sequence[Any]) -> dict[str, list[int]]:
    """Per tensor, the positions of the steps reading it (a step reading it twice counts
    twice)."""
    out: dict[str, list[int]] = {}
    for position, step in enumerate(steps):
        for t in step.inputs:
            if t:
                out.setdefault(t, []).append(position)
    return out


def producers(steps: Sequence[Any]) -> dict[str, int]:
    """Per tensor, the position of the step writing it."""
    out: dict[str, int] = {}
    for position, step in enumerate(steps):
        for t in (step.outputs if hasattr(step, "outputs") else (step.output,)):
            if t:
                out[t] = position
    return out


def lowerings_for(op_type: str) -> tuple[Lowering, ...]:
    """The lowerings to try for a node of ``op_type``, in order: builtin modules in
    :data:`BUILTIN_LOWERINGS` order whatever order they were imported in (one importing
    another, or a test importing one directly, must not let an element-wise chain claim an
    Add before the residual-LayerNorm pattern sees it), then others as registered."""
    _load_builtin()
    return tuple(sorted(_LOWERINGS.get(op_type, ()), key=_builtin_rank))


def _builtin_rank(fn: Callable[..., Any]) -> int:
    module = getattr(fn, "__module__", "").rpartition(".")[2]
    return BUILTIN_LOWERINGS.index(module) if module in BUILTIN_LOWERINGS \
        else len(BUILTIN_LOWERINGS)


_loaded = False


def _load_builtin() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN_LOWERINGS:
            importlib.import_module(f"tunecache.compiler.lowering.{module}")
