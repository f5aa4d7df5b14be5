"""Differential fuzzing against onnxruntime: small ONNX graphs and how to judge tunecache on them.

:func:`valid_cases` is a hypothesis strategy of small valid float32 graphs (opset 17) over
the ops tunecache generates kernels for: MatMul and Gemm, Conv (dense, grouped, depthwise;
kernels 1 and 3, strides, pads, dilations, auto_pad), pooling, broadcasting element-wise
arithmetic, activations (Relu, Clip, Sigmoid, Tanh, Exp, Erf, GELU in its erf and tanh
forms, SiLU, ...), Softmax, LayerNormalization, BatchNormalization and the shape ops around
them (Transpose, Reshape, Flatten, Concat). Dimensions come from a small vocabulary
(:data:`DIMS`), so kernels repeat and the build cache is reused; weights are initializers;
some examples' inputs hold NaN, infinities, signed zeros and denormals.
``graph_fuzz_invalid.invalid_cases`` is a strategy of small graphs onnxruntime refuses.

``graph_fuzz_judge.run_case`` compiles a case with
:func:`tunecache.tuner.deploy.compile_model`, runs it and judges it against onnxruntime: a
valid graph must give the same outputs (NaN where onnxruntime has NaN, the same
infinities, finite values within ``error_bounds``), an invalid one must be refused with a
:class:`~tunecache.compiler.errors.TunecacheError`. Used by
``tests/test_fuzz_onnxruntime.py`` and ``benchmarks/fuzz_onnxruntime.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

DIMS: tuple[int, ...] = (1, 2, 3, 4, 7, 8, 16, 17, 32)
"""The dimension vocabulary: odd and even, below and at the vector widths (8, 16 lanes)."""
SMALL_DIMS: tuple[int, ...] = (1, 2, 3, 4, 8, 16)
"""A smaller vocabulary, for valid graphs that should mostly reuse a cold build cache's
kernels."""
OPSET = 17
MAX_ELEMENTS = 4096
"""No tensor of a valid case is larger: the cases stay fast in numpy and onnxruntime."""
SPECIALS = (np.nan, np.inf, -np.inf, 1e-40, -3e-39, 0.0, -0.0)
"""Values sprinkled into some examples' inputs (1e-40 and -3e-39 are float32 denormals)."""

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


@dataclass(frozen=True)
class Value:
    """A tensor of the graph being built."""

    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class FuzzCase:
    """A generated model, its inputs and a one-line description of what it holds."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    valid: bool
    steps: list[str]
    special: bool = False

    def describe(self) -> str:
        """The steps with their shapes and attributes, and the inputs' special values."""
        inputs = ", ".join(f"{k}{list(v.shape)}" for k, v in self.feeds.items())
        text = f"{'valid' if self.valid else 'invalid'}: {' -> '.join(self.steps)} [inputs {inputs}]"
        if self.special:
            text += " with special values (" + ", ".join(
                f"{k}: {_specials_in(v)}" for k, v in self.feeds.items() if _specials_in(v)) + ")"
        return text


def _specials_in(array: np.ndarray) -> str:
    flat = array.reshape(-1)
    found = []
    for label, mask in (("nan", np.isnan(flat)), ("+inf", np.isposinf(flat)),
                        ("-inf", np.isneginf(flat)),
                        ("denormal", (flat != 0) & (np.abs(flat) < np.finfo(np.float32).tiny))):
        if mask.any():
            found.append(f"{label}@{np.flatnonzero(mask).tolist()}")
    return " ".join(found)


class _Graph:
    """Collects nodes, initializers and inputs; each node's output shape comes from ONNX
    shape inference (so no shape rule is written twice) unless the builder gives it, where
    onnxruntime disagrees with that."""

    def __init__(self, seed: int, dims: Sequence[int]) -> None:
        self.rng = np.random.default_rng(seed)
        self.dims = tuple(dims)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.types: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.values: list[Value] = []
        self.steps: list[str] = []
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def input(self, shape: Sequence[int]) -> Value:
        name = "x" if not self.feeds else self.fresh("in")
        self.inputs.append(helper.make_tensor_value_info(name, F32, list(shape)))
        self.feeds[name] = self.rng.standard_normal(tuple(shape)).astype(np.float32)
        self.types[name] = (F32, tuple(shape))
        return Value(name, tuple(shape))

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.fresh(prefix)
        array = np.asarray(array)
        self.inits[name] = array
        self.types[name] = (helper.np_dtype_to_tensor_dtype(array.dtype), tuple(array.shape))
        return name

    def weight(self, shape: Sequence[int], fan_in: int | None = None) -> str:
        fan = fan_in if fan_in is not None else (shape[-2] if len(shape) > 1 else shape[0])
        scale = 1.0 / math.sqrt(max(fan, 1))
        return self.const((self.rng.standard_normal(tuple(shape)) * scale).astype(np.float32), "w")

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "i")

    def scalar(self, value: float) -> str:
        return self.const(np.asarray(value, dtype=np.float32), "s")

    def node(self, op: str, inputs: Sequence[str], shape: tuple[int, ...] | None = None,
             **attrs: Any) -> Value:
        """Add a node with one output; its shape is inferred unless given."""
        out = self.fresh(op.lower())
        node = helper.make_node(op, list(inputs), [out], name=out, **attrs)
        self.nodes.append(node)
        shape = shape if shape is not None else self._infer(node)
        self.types[out] = (F32, shape)
        value = Value(out, shape)
        self.values.append(value)
        return value

    def _infer(self, node: onnx.NodeProto) -> tuple[int, ...]:
        inits = [numpy_helper.from_array(self.inits[t], t) for t in node.input if t in self.inits]
        declared = [helper.make_tensor_value_info(t, *self.types[t]) for t in node.input
                    if t and t not in self.inits]
        graph = helper.make_graph([node], "infer", declared,
                                  [helper.make_tensor_value_info(node.output[0], F32, None)],
                                  inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=8)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        dims = inferred.graph.output[0].type.tensor_type.shape.dim
        return tuple(int(d.dim_value) for d in dims)

    def model(self, outputs: Sequence[Value]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "fuzz", self.inputs,
            [helper.make_tensor_value_info(o.name, F32, list(o.shape)) for o in outputs],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 ir_version=8)


def _dim(draw: st.DrawFn, g: _Graph, limit: float = MAX_ELEMENTS) -> int:
    """A vocabulary dimension no larger than ``limit`` (1 always fits)."""
    return draw(st.sampled_from([d for d in g.dims if d <= max(limit, 1)]))


def _budget(*dims: int) -> float:
    """How large one more dimension may be for a tensor of ``dims`` and others."""
    return MAX_ELEMENTS / max(math.prod(dims), 1)


# -- valid graphs: one builder per step ----------------------------------------------------


def _start(draw: st.DrawFn, g: _Graph) -> Value:
    rank = draw(st.sampled_from([4, 4, 2, 3]))
    shape: list[int] = []
    if rank == 4:
        shape.append(draw(st.sampled_from([1, 1, 2])))
    while len(shape) < rank:
        shape.append(_dim(draw, g, _budget(*shape) / 4))
    return g.input(shape)


def _conv_axis(draw: st.DrawFn, size: int, k: int, dil: int, auto: str
               ) -> tuple[int, int] | None:
    """Pads (begin, end) along one axis; None where ``auto`` pads or the window would not
    fit (the caller then pads explicitly)."""
    reach = dil * (k - 1) + 1
    if auto == "VALID":
        return None if size >= reach else (reach // 2, reach // 2)
    if auto.startswith("SAME"):
        return None
    how = draw(st.sampled_from(["same", "zero", "asym"]))
    pads = (reach // 2, reach // 2) if how == "same" else (0, 0) if how == "zero" else (
        draw(st.integers(0, reach - 1)), draw(st.integers(0, reach - 1)))
    return pads if size + sum(pads) >= reach else (reach // 2, reach // 2)


def _conv(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    n, c, h, w = x.shape
    kh, kw = draw(st.sampled_from([(1, 1), (3, 3), (3, 3), (1, 3), (3, 1)]))
    dil = draw(st.sampled_from([1, 1, 2])) if max(kh, kw) > 1 else 1
    strides = draw(st.sampled_from([(1, 1), (1, 1), (2, 2), (1, 2)]))
    auto = draw(st.sampled_from(["NOTSET"] * 4 + ["VALID"] + ["SAME_UPPER", "SAME_LOWER"] * (
        dil == 1)))  # onnxruntime refuses dilations with SAME padding
    axes = [_conv_axis(draw, h, kh, dil, auto), _conv_axis(draw, w, kw, dil, auto)]
    attrs: dict[str, Any] = {"kernel_shape": [kh, kw], "strides": list(strides)}
    if dil > 1:
        attrs["dilations"] = [dil, dil]
    if auto != "NOTSET" and all(a is None for a in axes):
        attrs["auto_pad"] = auto
    else:
        reach = [dil * (kh - 1) + 1, dil * (kw - 1) + 1]
        pads = [a if a is not None else (r // 2, r // 2) for a, r in zip(axes, reach, strict=True)]
        attrs["pads"] = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
        auto = "NOTSET"
    divisors = [d for d in range(2, c) if c % d == 0]
    mode = draw(st.sampled_from(["dense", "dense", "depthwise"] + (["grouped"] if divisors else [])))
    spatial = max(h * w // (strides[0] * strides[1]), 1) * n
    if mode == "dense":
        groups, f = 1, _dim(draw, g, MAX_ELEMENTS / spatial)
    elif mode == "depthwise":
        groups, f = c, c * (2 if c * 2 * spatial <= MAX_ELEMENTS and draw(st.booleans()) else 1)
    else:
        groups = draw(st.sampled_from(divisors))
        f = groups * (2 if groups * 2 * spatial <= MAX_ELEMENTS and draw(st.booleans()) else 1)
    inputs = [x.name, g.weight([f, c // groups, kh, kw], fan_in=c // groups * kh * kw)]
    if draw(st.booleans()):
        inputs.append(g.const((0.1 * g.rng.standard_normal(f)).astype(np.float32), "b"))
    out = g.node("Conv", inputs, group=groups, **attrs)
    pads_text = attrs.get("auto_pad") or attrs["pads"]
    g.steps.append(f"Conv[{c}->{f} k{kh}x{kw} s{strides[0]}x{strides[1]} d{dil} g{groups} "
                   f"pads={pads_text}{' +bias' if len(inputs) > 2 else ''}]{list(out.shape)}")
    return out


def _pool(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    op = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]))
    if op.startswith("Global"):
        out = g.node(op, [x.name])
        g.steps.append(f"{op}{list(out.shape)}")
        return out
    _, _, h, w = x.shape
    kernel = [draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))]
    pads = [draw(st.integers(0, k - 1)) for k in kernel + kernel]
    if draw(st.booleans()):
        pads = pads[:2] * 2
    attrs: dict[str, Any] = {"kernel_shape": kernel, "pads": pads,
                             "ceil_mode": draw(st.sampled_from([0, 0, 1]))}
    stride = draw(st.sampled_from([None, 1, 2, 3]))
    if stride is not None:
        attrs["strides"] = [stride, stride]
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    sizes = [_pooled(size, k, stride or 1, pads[i], pads[i + 2], attrs["ceil_mode"])
             for i, (size, k) in enumerate(zip((h, w), kernel, strict=True))]
    out = g.node(op, [x.name], shape=(*x.shape[:2], *sizes), **attrs)
    g.steps.append(f"{op}[k{kernel} s{stride} pads={pads} ceil={attrs['ceil_mode']}"
                   f"{' incl' if attrs.get('count_include_pad') else ''}]{list(out.shape)}")
    return out


def _pooled(size: int, k: int, stride: int, begin: int, end: int, ceil: int) -> int:
    """A pool's output size as onnxruntime computes it: with ``ceil``, a last window that
    would start past the input and its begin padding is dropped (ONNX shape inference keeps
    it, so it cannot say)."""
    span = size + begin + end - k
    out = (-(-span // stride) if ceil else span // stride) + 1
    return out - 1 if ceil and (out - 1) * stride >= size + begin else out


def _matmul(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    *batch, m, k = x.shape
    how = draw(st.sampled_from(["weight", "weight", "batched", "vector", "left", "self", "input",
                                "broadcast"]))
    rows = math.prod(x.shape[:-1])
    if how == "batched" and batch:
        n = _dim(draw, g, MAX_ELEMENTS / rows)
        a, b = x.name, g.weight([*batch, k, n])
    elif how == "broadcast" and len(x.shape) == 2:
        n = _dim(draw, g, MAX_ELEMENTS / m)
        a, b = x.name, g.weight([_dim(draw, g, MAX_ELEMENTS / (m * n)), k, n])
    elif how == "vector":
        a, b = x.name, g.weight([k])
    elif how == "left":
        rows_out = _dim(draw, g, MAX_ELEMENTS / (x.size / m))
        a, b = g.weight([rows_out, m]), x.name
    elif how == "self" and rows * m <= MAX_ELEMENTS:
        perm = [*range(len(batch)), len(batch) + 1, len(batch)]
        a, b = x.name, g.node("Transpose", [x.name], perm=perm).name
    elif how == "input":
        a, b = x.name, g.input([k, _dim(draw, g, MAX_ELEMENTS / rows)]).name
    else:
        a, b = x.name, g.weight([k, _dim(draw, g, MAX_ELEMENTS / rows)])
    out = g.node("MatMul", [a, b])
    g.steps.append(f"MatMul[{how} {list(g.types[a][1])}x{list(g.types[b][1])}]{list(out.shape)}")
    return out


def _gemm(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    trans_a, trans_b = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    m, k = reversed(x.shape) if trans_a else x.shape
    n = _dim(draw, g, MAX_ELEMENTS / m)
    b_shape = [n, k] if trans_b else [k, n]
    b = g.input(b_shape).name if draw(st.integers(0, 5)) == 0 else g.weight(b_shape, fan_in=k)
    inputs = [x.name, b]
    c_shape = draw(st.sampled_from([None, (), (n,), (1, n), (m, n), (m, 1), (1, 1)]))
    if c_shape is not None:
        inputs.append(g.const((0.1 * g.rng.standard_normal(c_shape)).astype(np.float32), "c"))
    alpha = draw(st.sampled_from([1.0, 1.0, 0.5, -2.0]))
    beta = draw(st.sampled_from([1.0, 1.0, 0.5, -1.0]))
    out = g.node("Gemm", inputs, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    g.steps.append(f"Gemm[A{list(x.shape)} tA{trans_a} B{b_shape} tB{trans_b} "
                   f"C{list(c_shape) if c_shape is not None else '-'} alpha={alpha} beta={beta}]"
                   f"{list(out.shape)}")
    return out


_CLIPS: tuple[tuple[float | None, float | None], ...] = (
    (0.0, 6.0), (0.0, None), (-1.0, 1.0), (None, 0.5), (0.0, 6.0))


def _unary(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    op = draw(st.sampled_from(["Relu", "Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Erf",
                               "Sqrt", "LeakyRelu", "Clip", "Clip", "gelu_erf", "gelu_tanh",
                               "silu"]))
    if op == "Clip":
        lo, hi = draw(st.sampled_from(_CLIPS))
        inputs = [x.name, g.scalar(lo) if lo is not None else ""]
        if hi is not None:
            inputs.append(g.scalar(hi))
        out = g.node("Clip", inputs)
        g.steps.append(f"Clip[{lo}, {hi}]")
        return out
    if op in _COMPOSITES:
        g.steps.append(op)
        return _COMPOSITES[op](g, x)
    attrs: dict[str, Any] = {"alpha": draw(st.sampled_from([0.01, 0.2]))} \
        if op == "LeakyRelu" else {}
    g.steps.append(op + (f"[{attrs['alpha']}]" if attrs else ""))
    return g.node(op, [x.name], **attrs)


def _gelu_erf(g: _Graph, x: Value) -> Value:
    core = g.node("Erf", [g.node("Div", [x.name, g.scalar(math.sqrt(2.0))]).name])
    half = g.node("Mul", [x.name, g.scalar(0.5)])
    return g.node("Mul", [half.name, g.node("Add", [core.name, g.scalar(1.0)]).name])


def _gelu_tanh(g: _Graph, x: Value) -> Value:
    cube = g.node("Pow", [x.name, g.scalar(3.0)])
    inner = g.node("Add", [x.name, g.node("Mul", [cube.name, g.scalar(0.044715)]).name])
    core = g.node("Tanh", [g.node("Mul", [inner.name, g.scalar(math.sqrt(2 / math.pi))]).name])
    half = g.node("Mul", [g.scalar(0.5), x.name])
    return g.node("Mul", [half.name, g.node("Add", [g.scalar(1.0), core.name]).name])


def _silu(g: _Graph, x: Value) -> Value:
    return g.node("Mul", [x.name, g.node("Sigmoid", [x.name]).name])


_COMPOSITES: dict[str, Callable[[_Graph, Value], Value]] = {
    "gelu_erf": _gelu_erf, "gelu_tanh": _gelu_tanh, "silu": _silu}


def _operand_shape(draw: st.DrawFn, g: _Graph, x: Value) -> tuple[int, ...]:
    """A shape broadcasting with ``x``'s: full, scalar, last axis, per channel, a random
    mask of ones, or one that widens ``x`` where it has ones."""
    shape = x.shape
    how = draw(st.sampled_from(["full", "scalar", "last", "channel", "mask", "widen"]))
    if how == "scalar":
        return draw(st.sampled_from([(), (1,)]))
    if how == "last":
        return shape[-1:]
    if how == "channel" and len(shape) >= 3:
        per = (shape[1],) + (1,) * (len(shape) - 2)
        return per if draw(st.booleans()) else (1, *per)
    if how == "mask":
        kept = tuple(d if draw(st.booleans()) else 1 for d in shape)
        return kept[draw(st.integers(0, len(kept))):] or (1,)
    if how == "widen":
        grown: list[int] = []
        for i, d in enumerate(shape):
            grown.append(d if d != 1 else _dim(draw, g, _budget(*grown, *shape[i + 1:])))
        if len(shape) < 4 and draw(st.booleans()):
            grown.insert(0, _dim(draw, g, _budget(*grown)))
        return tuple(grown)
    return shape


def _binary(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    op = draw(st.sampled_from(["Add", "Add", "Sub", "Mul", "Div", "Max", "Min"]))
    earlier = [v for v in g.values if v.shape == x.shape and v.name != x.name]
    source = draw(st.sampled_from(["const", "const", "input", "self"]
                                  + (["earlier", "earlier"] if earlier else [])))
    if source == "self":
        other, shape = x.name, x.shape
    elif source == "earlier":
        picked = draw(st.sampled_from(earlier))
        other, shape = picked.name, picked.shape
    else:
        shape = _operand_shape(draw, g, x)
        if source == "input":
            other = g.input(shape).name
        elif op == "Div":
            # magnitudes 0.5..2 with random signs keep a division by a constant well posed
            mag = g.rng.uniform(0.5, 2.0, shape) * g.rng.choice([-1.0, 1.0], shape)
            other = g.const(mag.astype(np.float32), "c")
        else:
            other = g.const(g.rng.standard_normal(shape).astype(np.float32), "c")
    swap = draw(st.integers(0, 3)) == 0
    out = g.node(op, [other, x.name] if swap else [x.name, other])
    g.steps.append(f"{op}[{'operand, x' if swap else 'x, operand'}: {source}{list(shape)}]"
                   f"{list(out.shape)}")
    return out


def _softmax(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    axis = draw(st.integers(-len(x.shape), len(x.shape) - 1))
    g.steps.append(f"Softmax[axis={axis}]")
    return g.node("Softmax", [x.name], axis=axis)


def _layernorm(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    axis = draw(st.sampled_from([-1, -1, *range(-len(x.shape), len(x.shape))]))
    normalized = x.shape[axis:]
    scale = g.const((1 + 0.2 * g.rng.standard_normal(normalized)).astype(np.float32), "gamma")
    inputs = [x.name, scale]
    if draw(st.booleans()):
        inputs.append(g.const((0.1 * g.rng.standard_normal(normalized)).astype(np.float32), "beta"))
    eps = draw(st.sampled_from([1e-5, 1e-3]))
    g.steps.append(f"LayerNormalization[axis={axis} eps={eps}{' +bias' if len(inputs) > 2 else ''}]")
    return g.node("LayerNormalization", inputs, axis=axis, epsilon=eps)


def _batchnorm(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    c = x.shape[1]
    r = g.rng
    params = [(1 + 0.2 * r.standard_normal(c)), 0.1 * r.standard_normal(c),
              0.1 * r.standard_normal(c), 0.5 + r.random(c)]
    names = [g.const(p.astype(np.float32), n) for p, n in zip(params, ["gamma", "beta", "mean", "var"],
                                                             strict=True)]
    eps = draw(st.sampled_from([1e-5, 1e-3]))
    g.steps.append(f"BatchNormalization[C={c} eps={eps}]")
    return g.node("BatchNormalization", [x.name, *names], epsilon=eps)


def _transpose(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    perm = draw(st.permutations(range(len(x.shape))))
    out = g.node("Transpose", [x.name], perm=list(perm))
    g.steps.append(f"Transpose[{list(perm)}]{list(out.shape)}")
    return out


def _reshape(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    if draw(st.integers(0, 2)) == 0:
        axis = draw(st.integers(-len(x.shape), len(x.shape)))
        out = g.node("Flatten", [x.name], axis=axis)
        g.steps.append(f"Flatten[axis={axis}]{list(out.shape)}")
        return out
    groups: list[list[int]] = []
    for d in x.shape:  # merge runs of neighbouring dims at random
        merge: bool = draw(st.booleans())
        if groups and merge:
            groups[-1].append(d)
        else:
            groups.append([d])
    target = [math.prod(group) for group in groups]
    if len(target) < 4 and draw(st.booleans()):
        target.insert(draw(st.integers(0, len(target))), 1)
    written = [0 if i < len(x.shape) and t == x.shape[i] and draw(st.booleans()) else t
               for i, t in enumerate(target)]
    if draw(st.booleans()):
        written[draw(st.integers(0, len(written) - 1))] = -1
    out = g.node("Reshape", [x.name, g.ints(written)])
    g.steps.append(f"Reshape[{written}]{list(out.shape)}")
    return out


def _concat(draw: st.DrawFn, g: _Graph, x: Value) -> Value:
    axis = draw(st.integers(-len(x.shape), len(x.shape) - 1))
    shape = list(x.shape)
    shape[axis] = _dim(draw, g, MAX_ELEMENTS / x.size * shape[axis] - shape[axis])
    source = draw(st.sampled_from(["const", "input", "self"]))
    if source == "self":
        other = x.name
    elif source == "input":
        other = g.input(shape).name
    else:
        other = g.const(g.rng.standard_normal(shape).astype(np.float32), "c")
    inputs = [x.name, other] if draw(st.booleans()) else [other, x.name]
    out = g.node("Concat", inputs, axis=axis)
    g.steps.append(f"Concat[axis={axis} with {source}]{list(out.shape)}")
    return out


_Builder = Callable[[st.DrawFn, _Graph, Value], Value]
_BUILDERS: dict[str, _Builder] = {
    "conv": _conv, "pool": _pool, "matmul": _matmul, "gemm": _gemm, "unary": _unary,
    "binary": _binary, "softmax": _softmax, "layernorm": _layernorm, "batchnorm": _batchnorm,
    "transpose": _transpose, "reshape": _reshape, "concat": _concat,
}


def _applicable(x: Value) -> list[str]:
    """Builders that fit ``x`` (repeats weight the draw towards kernel-making steps)."""
    rank = len(x.shape)
    names = ["unary", "unary", "binary", "binary", "softmax", "layernorm", "reshape"]
    if x.size * 2 <= MAX_ELEMENTS:
        names.append("concat")
    if rank >= 2:
        names += ["matmul", "matmul", "transpose", "batchnorm"]
    if rank == 2:
        names += ["gemm", "gemm"]
    if rank == 4:
        names += ["conv", "conv", "conv", "pool"]
    return names


def _sprinkle(draw: st.DrawFn, feeds: dict[str, np.ndarray]) -> bool:
    """Put special values at a few positions of some inputs; True if a NaN, an infinity
    or a denormal went in (signed zeros are ordinary values)."""
    for array in feeds.values():
        if not draw(st.booleans()):
            continue
        flat = array.reshape(-1)
        for _ in range(draw(st.integers(1, 3))):
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(SPECIALS))
    return any(_specials_in(array) for array in feeds.values())


@st.composite
def valid_cases(draw: st.DrawFn, max_steps: int = 4, dims: Sequence[int] = DIMS) -> FuzzCase:
    """A small valid graph of 1..``max_steps`` steps over dimensions from ``dims``, with
    seeded random weights and inputs (special values in about a quarter of the examples)."""
    g = _Graph(draw(st.integers(0, 2**32 - 1)), dims)
    x = _start(draw, g)
    outputs: list[Value] = []
    for _ in range(draw(st.integers(1, max_steps))):
        x = _BUILDERS[draw(st.sampled_from(_applicable(x)))](draw, g, x)
        if draw(st.integers(0, 5)) == 0:
            outputs.append(x)  # an intermediate graph output: fusion must leave it readable
    if x not in outputs:
        outputs.append(x)
    special = draw(st.integers(0, 3)) == 0 and _sprinkle(draw, g.feeds)
    return FuzzCase(g.model(outputs), g.feeds, True, g.steps, special)


