"""Attention written as primitive ONNX nodes (MatMul, scalings, mask Add, Softmax, MatMul)
becomes one ``attention`` kernel: in every exporter fixture (one per layer, at two shapes,
each with a padded position), in hand-built graphs of the forms the kernel's masks and
scales cover, and not when a link is needed elsewhere or the mask does not broadcast as rows
(those nodes then run as before: batched matmuls and a softmax kernel)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx_support import Builder, compile_and_compare
from test_frontend_exporters import FIXTURES, checked_runs

from tunecache.compiler.graph import Graph, KernelNode
from tunecache.compiler.kinds.attention import causal_keep

LAYERS = 2
B, H, M, N, D = 2, 3, 5, 7, 8


def attention_kernels(graph: Graph) -> list[KernelNode]:
    return [k for k in graph.kernel_nodes if k.op.kind == "attention"]


@pytest.mark.parametrize("name", FIXTURES)
def test_exported_attention_is_one_kernel_per_layer(name: str, tmp_path: Path) -> None:
    # exporter_feeds pads the first position of the first sequence
    for compiled, feeds, batch, _ in checked_runs(name, tmp_path, ((2, 5), (1, 3))):
        planned = compiled.prepare({k: v.shape for k, v in feeds.items()})
        kernels = attention_kernels(planned.graph)
        assert len(kernels) == LAYERS, [k.op.text for k in planned.graph.kernel_nodes]
        assert sum(e.op.kind == "attention" for e in planned.plan) == LAYERS
        assert all(e.node in planned.kernels for e in planned.plan)
        for kernel in kernels:
            op = kernel.op
            # SDPA's two sqrt(scale) factors multiply into the default 1/sqrt(D)
            assert op.attr("scale") == "default"
            if name.startswith("vit"):
                assert op.attr("mask") == "none"  # dynamo's constant zero mask is dropped
            else:
                # the [batch, 1, M, N] mask built at run time from attention_mask
                assert (op.attr("mask"), op.dim("mask_rows")) == ("full", batch)
            # the head split and merge are the kernel's layouts, not numpy Transposes
            assert op.attr("tokens") == _token_major(name), op.text
            assert op.dim("heads") == op.dim("B") // batch
        steps = {s.op_type for s in planned.graph.onnx_nodes}
        assert not steps & {"Softmax", "IsNaN", "MatMul"}
        if _token_major(name) == "qkvy":
            assert not [s.name for s in planned.graph.onnx_nodes if s.op_type == "Transpose"
                        and tuple(s.attrs["perm"]) == (0, 2, 1, 3)]


def _token_major(fixture: str) -> str:
    """Which attention tensors an exporter fixture's kernels read or write token-major: all
    four where the heads are split from and merged into the projections; Q and Y where K and
    V come from the key/value cache (head-major, the ``present`` outputs); Y alone in Llama
    (Q and K pass the rotary embedding head-major, K and V the grouped-query repeat)."""
    if fixture.startswith("llama"):
        return "y"
    return "qy" if "past" in fixture else "qkvy"


def attention_model(form: str) -> onnx.ModelProto:
    """One attention over ``q [B, H, M, D]``, ``k``, ``v [B, H, N, D]``, as eager BERT writes
    it: ``Softmax(q @ kᵀ / sqrt(D) + mask) @ v`` with K transposed by its own Transpose.

    ``padding``: a ``[B, 1, 1, N]`` mask input; ``causal``: a constant lower-triangle mask
    (``-1e4`` above); ``scaled``: ``q * 0.3`` and ``(q kᵀ) * 0.5``, no mask; ``head_mask``: a
    ``[1, H, 1, N]`` mask (not rows of the batch); ``scores_twice``: the scores are also a
    graph output; ``probs_twice``: so are the probabilities, behind SDPA's
    ``Where(IsNaN(p), 0, p)``."""
    b = Builder(17, seed=11)
    q = b.input("q", [B, H, M, D])
    k = b.input("k", [B, H, N, D])
    v = b.input("v", [B, H, N, D])
    if form == "scaled":
        q = b.node("Mul", [q, b.const(np.float32(0.3))])
    kt = b.node("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.node("MatMul", [q, kt], name="scores")
    if form == "scaled":
        s = b.node("Mul", [scores, b.const(np.float32(0.5))])
    else:
        s = b.node("Div", [scores, b.const(np.float32(math.sqrt(D)))])
    if form in ("padding", "scores_twice", "probs_twice"):
        s = b.node("Add", [s, b.input("mask", [B, 1, 1, N])])
    elif form == "head_mask":
        s = b.node("Add", [s, b.input("mask", [1, H, 1, N])])
    elif form == "causal":
        mask = np.where(causal_keep(M, N), 0.0, -1e4).astype(np.float32)
        s = b.node("Add", [b.const(mask[None, None]), s])
    probs = b.node("Softmax", [s], axis=-1)
    if form == "probs_twice":
        kept = b.node("Where", [b.node("IsNaN", [probs]), b.const(np.float32(0.0)), probs])
    else:
        kept = probs
    out = b.node("MatMul", [kept, v], name="context")
    extra = {"scores_twice": [scores], "probs_twice": [probs]}.get(form, [])
    return b.model([out, *extra], f"attention_{form}")


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "mask":
            mask = np.zeros(shape, np.float32)
            mask[..., -2:] = -1e4  # the last two keys are padding
            mask.reshape(-1, N)[0, 0] = -np.inf
            feeds[vi.name] = mask
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize(("form", "mask", "scale"), [
    ("padding", ("padding", B), "default"),
    ("causal", ("causal", 0), "default"),
    ("scaled", ("none", 0), "input"),
])
def test_hand_built_forms(form: str, mask: tuple[str, int], scale: str,
                          tmp_path: Path) -> None:
    model = attention_model(form)
    compiled = compile_and_compare(model, tmp_path, feeds_for(model))
    [kernel] = attention_kernels(compiled.graph)
    assert kernel.name == "scores" and kernel.nodes[-1] == "context"
    assert (kernel.op.attr("mask"), kernel.op.dim("mask_rows")) == mask
    assert kernel.op.attr("scale") == scale
    assert kernel.op.dims_dict == {"B": B * H, "M": M, "N": N, "D": D, "Dv": 0,
                                   "mask_rows": mask[1], "heads": 0}
    if scale == "input":
        assert float(compiled.graph.constants[kernel.inputs[3]][0]) == pytest.approx(0.15)
    assert not compiled.graph.onnx_nodes  # K is read as it is: no helper Transpose


@pytest.mark.parametrize("form", ["scores_twice", "probs_twice", "head_mask"])
def test_not_fused_when_a_link_is_needed_elsewhere(form: str, tmp_path: Path) -> None:
    """A scores (or probabilities) tensor with a second reader, or a mask varying over
    heads, keeps the unfused kernels: batched matmuls and a softmax (scaled and masked when
    the mask adds rows of the batch)."""
    model = attention_model(form)
    compiled = compile_and_compare(model, tmp_path, feeds_for(model))
    assert not attention_kernels(compiled.graph)
    kinds = [k.op.kind for k in compiled.graph.kernel_nodes]
    assert kinds.count("batch_matmul") == 2 and kinds.count("softmax") == 1
    softmax = next(k for k in compiled.graph.kernel_nodes if k.op.kind == "softmax")
    if form != "head_mask":
        assert (softmax.op.attr("scale"), softmax.op.dim("mask_rows")) == ("yes", B)
