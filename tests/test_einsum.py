"""Einsum products become matmul kernels (and, between a softmax, one attention kernel);
other equations stay Einsum nodes run by the reference; all match onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import compile_and_compare, ort_run

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.tuner.deploy import compile_model


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]],
           inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "einsum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("equation", "a", "b", "kinds"), [
    ("bhid,bhjd->bhij", [2, 3, 5, 8], [2, 3, 7, 8], {"batch_matmul"}),  # attention scores
    ("bhij,bhjd->bhid", [2, 3, 5, 7], [2, 3, 7, 8], {"batch_matmul"}),  # attention context
    ("ik,kj->ij", [6, 9], [9, 4], {"batch_matmul"}),  # two activations: batch of one
    ("bki,bkj->bji", [2, 9, 5], [2, 9, 4], {"batch_matmul"}),  # both operands transposed
    ("id,jd->ji", [5, 8], [7, 8], {"batch_matmul"}),  # the output transposed too
], ids=["scores", "context", "plain", "transposed", "output-transposed"])
def test_products_become_kernels_and_match_onnxruntime(
        equation: str, a: list[int], b: list[int], kinds: set[str], tmp_path: Path) -> None:
    model = _model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)],
                   {"a": a, "b": b})
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    graph = load_graph(path)
    assert {k.op.kind for k in graph.kernel_nodes} == kinds
    assert "Einsum" not in {n.op_type for n in graph.onnx_nodes}
    compile_and_compare(model, tmp_path)


def test_einsum_attention_becomes_one_attention_kernel(tmp_path: Path) -> None:
    """softmax(einsum(q, k) * scale) then einsum(p, v), as torch.einsum attention exports."""
    nodes = [helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhid,bhjd->bhij"),
             helper.make_node("Mul", ["s", "scale"], ["t"]),
             helper.make_node("Softmax", ["t"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhij,bhjd->bhid")]
    shape = [1, 4, 16, 32]
    model = _model(nodes, {"q": shape, "k": shape, "v": shape},
                   {"scale": np.array(32 ** -0.5, np.float32)})
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert [k.op.kind for k in load_graph(path).kernel_nodes] == ["attention"]
    compile_and_compare(model, tmp_path)


@pytest.mark.parametrize(("equation", "shapes"), [
    ("ij->ji", [[3, 4]]),                 # one operand
    ("ij,jk->i", [[3, 4], [4, 5]]),       # a letter summed away
    ("ii,ij->ij", [[3, 3], [3, 4]]),      # a diagonal
    ("...ij,...jk->...ik", [[2, 3, 4], [2, 4, 5]]),  # an ellipsis
    ("bij,bjk->bik", [[2, 3, 4], [1, 4, 5]]),        # a broadcast batch
], ids=["transpose", "summed", "diagonal", "ellipsis", "broadcast"])
def test_other_equations_stay_einsum_and_match(equation: str, shapes: list[list[int]],
                                               tmp_path: Path) -> None:
    names = ["a", "b"][:len(shapes)]
    model = _model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                   dict(zip(names, shapes, strict=True)))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert [n.op_type for n in load_graph(path).onnx_nodes] == ["Einsum"]
    feeds = {n: np.random.default_rng(3).standard_normal(s).astype(np.float32)
             for n, s in zip(names, shapes, strict=True)}
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    try:
        expected = ort_run(model, feeds)[0]
    except Exception:  # onnxruntime refuses the broadcast batch; the reference decides
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected, rtol=1e-5, atol=1e-5)
