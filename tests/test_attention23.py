"""Opset 23's Attention node becomes the attention kernel (via MatMul/Softmax/MatMul) and
matches onnxruntime: 4-D and 3-D inputs, grouped-query heads, a float mask, causal, a
given scale; the forms left to the reference still match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime")

from onnx_support import ort_run

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.tuner.deploy import compile_model


def _model(q: list[int], k: list[int], v: list[int], mask: list[int] | None = None,
           mask_type: int = TensorProto.FLOAT, **attrs: Any
           ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(len(q) + sum(q))
    shapes = {"q": q, "k": k, "v": v} | ({"mask": mask} if mask else {})
    inputs = [helper.make_tensor_value_info(
        n, mask_type if n == "mask" else TensorProto.FLOAT, s) for n, s in shapes.items()]
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    if mask and mask_type == TensorProto.BOOL:
        feeds["mask"] = rng.random(mask) > 0.3
    node = helper.make_node("Attention", list(shapes), ["y"], **attrs)
    graph = helper.make_graph([node], "attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                              ir_version=10)
    return model, feeds


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path,
           kernels: bool) -> None:
    graph = load_graph(model)
    assert ("Attention" not in {n.op_type for n in graph.onnx_nodes}) == kernels
    assert ([k.op.kind for k in graph.kernel_nodes] == ["attention"]) == kernels
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    np.testing.assert_allclose(compiled.run(feeds)["y"], ort_run(model, feeds)[0],
                               rtol=1e-4, atol=1e-5)


CASES: dict[str, tuple[Any, ...]] = {
    "4d": ([2, 4, 6, 8], [2, 4, 7, 8], [2, 4, 7, 8], None, {}),
    "4d-gqa-causal": ([1, 4, 5, 8], [1, 2, 5, 8], [1, 2, 5, 8], None, {"is_causal": 1}),
    "3d-mask-scale": ([2, 5, 32], [2, 6, 32], [2, 6, 32], [5, 6],
                      {"q_num_heads": 4, "kv_num_heads": 4, "scale": 0.3}),
    "3d-gqa": ([1, 4, 48], [1, 4, 16], [1, 4, 24],
               None, {"q_num_heads": 6, "kv_num_heads": 2}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_node_runs_as_kernels_and_matches(case: str, tmp_path: Path) -> None:
    q, k, v, mask, attrs = CASES[case]
    model, feeds = _model(q, k, v, mask, **attrs)
    _check(model, feeds, tmp_path, kernels=True)


def test_a_boolean_mask_is_left_to_the_reference_and_matches(tmp_path: Path) -> None:
    model, feeds = _model([1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], [4, 4],
                          mask_type=TensorProto.BOOL)
    _check(model, feeds, tmp_path, kernels=False)
