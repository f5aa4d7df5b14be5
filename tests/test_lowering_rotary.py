"""Rotary position embeddings written as primitive ONNX nodes (two Slices, Neg, Concat, two
Muls and an Add) become one ``rotary`` kernel: in hand-built graphs of the TorchScript and
dynamo forms, in the Llama exporter fixtures (queries and keys of every layer), and not when
the pattern is only nearly there (those nodes then run in numpy, still correctly)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx_support import Builder, compile_and_compare
from test_frontend_exporters import DATA, checked_runs

from tunecache.compiler.frontend import load_graph
from tunecache.compiler.graph import Graph, KernelNode
from tunecache.compiler.kinds.rotary import rotary_tables

B, H, S, D = 2, 3, 5, 8
SHAPE = (B, H, S, D)
PATTERN = {"Slice", "Neg", "Concat"}


def rotary_kernels(graph: Graph) -> list[KernelNode]:
    return [k for k in graph.kernel_nodes if k.op.kind == "rotary"]


def numpy_ops(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.onnx_nodes]


def tables(form: str) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin as the form's exporter leaves them after folding: ``[1, 1, S, D]``
    (torchscript), ``[S, D]`` (dynamo), ``[B, 1, S, D]`` the same for each batch element
    (``batch``) or different (``per_batch``: positions offset by the batch index)."""
    cos, sin = rotary_tables(S + B, D)
    if form == "dynamo":
        return cos[:S], sin[:S]
    if form in ("batch", "per_batch"):
        step = 1 if form == "per_batch" else 0
        return (np.stack([cos[b * step:b * step + S] for b in range(B)])[:, None],
                np.stack([sin[b * step:b * step + S] for b in range(B)])[:, None])
    return cos[None, None, :S], sin[None, None, :S]


def rotary_model(form: str, miss: str = "") -> onnx.ModelProto:
    """``y = x * cos + rotate_half(x) * sin`` over ``x = q * 1`` (a computed tensor), then
    doubled. ``torchscript``: ``Mul(x, cos)`` first, Slices on axis 3 with ``ends`` of
    INT64_MAX; ``dynamo`` and the rest: the Slices first, axis -1, operands of the Muls and
    the Add swapped. ``miss`` breaks one detail: ``order`` (``Concat(lo, -hi)``), ``shared``
    (the Neg also a graph output) or ``input`` (cos a graph input)."""
    b = Builder(17 if form == "torchscript" else 18, seed=5)
    x = b.node("Mul", [b.input("q", SHAPE), b.const(np.float32(1.0))], name="scale")
    cos_value, sin_value = tables(form)
    cos = b.input("cos", cos_value.shape) if miss == "input" else b.const(cos_value)
    sin = b.const(sin_value)
    axis = 3 if form == "torchscript" else -1
    half, end = D // 2, (2**63 - 1 if form == "torchscript" else D)
    if form == "torchscript":
        cos_term = b.node("Mul", [x, cos], name="mul_cos")
    lo = b.node("Slice", [x, b.ints([0]), b.ints([half]), b.ints([axis]), b.ints([1])],
                name="slice_lo")
    hi = b.node("Slice", [x, b.ints([half]), b.ints([end]), b.ints([axis]), b.ints([1])])
    neg = b.node("Neg", [hi], name="neg")
    rot = b.node("Concat", [lo, neg] if miss == "order" else [neg, lo], axis=axis)
    if form == "torchscript":
        y = b.node("Add", [cos_term, b.node("Mul", [rot, sin])], name="rope")
    else:
        cos_term = b.node("Mul", [cos, x], name="mul_cos")
        y = b.node("Add", [b.node("Mul", [sin, rot]), cos_term], name="rope")
    out = b.node("Add", [y, y], name="out")
    return b.model([out, neg] if miss == "shared" else [out])


@pytest.mark.parametrize("form", ["torchscript", "dynamo", "batch", "per_batch"])
def test_rotary_pattern_is_one_kernel(form: str, tmp_path: Path) -> None:
    graph = load_graph(rotary_model(form))
    (kernel,) = rotary_kernels(graph)
    rows = B * H * S if form == "per_batch" else S  # tables varying by batch cover every row
    assert kernel.op.text == f"rotary(M={B * H * S},D={D},S={rows},dtype=float32,epilogue=none)"
    assert kernel.nodes[0] == ("mul_cos" if form == "torchscript" else "slice_lo")
    assert kernel.nodes[-1] == "rope" and len(kernel.nodes) == 7
    cos = graph.constants[kernel.inputs[1]]
    assert cos.shape == (rows, D) and cos.flags.c_contiguous
    assert not PATTERN & set(numpy_ops(graph))
    compiled = compile_and_compare(rotary_model(form), tmp_path)
    assert [e.op.text for e in compiled.plan if e.op.kind == "rotary"] == [kernel.op.text]


@pytest.mark.parametrize("miss", ["order", "shared", "input"])
def test_near_miss_stays_in_numpy_and_runs(miss: str, tmp_path: Path) -> None:
    model = rotary_model("dynamo", miss)
    graph = load_graph(model)
    assert not rotary_kernels(graph)
    assert {"Slice", "Concat"} <= set(numpy_ops(graph))  # the Neg is an elementwise kernel
    compile_and_compare(model, tmp_path)


@pytest.mark.parametrize("name", ["llama_torchscript17", "llama_dynamo18",
                                  "llama_past_torchscript17"])
def test_llama_rotary_embeddings_are_kernels(name: str, tmp_path: Path) -> None:
    path = DATA / f"{name}.onnx"
    model = onnx.load(str(path))
    layers = 2
    assert sum(n.op_type == "Neg" for n in model.graph.node) == 2 * layers  # q and k
    # Past models also return the present keys: rotated by the kernel.
    for compiled, feeds, _, seq in checked_runs(name, tmp_path, ((1, 4), (2, 3))):
        shapes = {k: v.shape for k, v in feeds.items()}
        graph = load_graph(path, shapes)
        kernels = rotary_kernels(graph)
        assert len(kernels) == 2 * layers
        assert {k.op.dim("D") for k in kernels} == {8} and {k.op.dim("S") for k in kernels} == {seq}
        assert not {"Slice", "Neg"} & set(numpy_ops(graph))
        planned = compiled.prepare(shapes).plan
        assert sum(e.op.kind == "rotary" for e in planned) == 2 * layers
