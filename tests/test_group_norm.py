"""Group and instance normalisations become a layernorm kernel and a per-channel
elementwise kernel, and match onnxruntime (the reference where onnxruntime has no kernel)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import op_model, ort_run

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.tuner.deploy import compile_model


def _model(op: str, x: list[int | str], params: int, opset: int, follow: str | None = None,
           **attrs: object) -> onnx.ModelProto:
    rng = np.random.default_rng(params)
    inits = {n: rng.standard_normal(params).astype(np.float32) for n in ("scale", "bias")}
    return op_model(op, x, inits, follow=follow, opset=opset, ir_version=10, **attrs)


CASES = {
    "instance-2d": ("InstanceNormalization", [2, 6, 9, 7], 6, 17, {}),
    "instance-1d": ("InstanceNormalization", [1, 4, 33], 4, 13, {}),
    "instance-3d-eps": ("InstanceNormalization", [1, 3, 4, 5, 6], 3, 17, {"epsilon": 1e-3}),
    "group": ("GroupNormalization", [2, 8, 5, 5], 8, 21, {"num_groups": 4}),
    "group-wide": ("GroupNormalization", [1, 12, 6, 10], 12, 21, {"num_groups": 3}),
    "group-any-batch": ("GroupNormalization", ["N", 6, 4, 4], 6, 21, {"num_groups": 2}),
}


def _expected(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    try:
        return np.asarray(ort_run(model, feeds)[0])
    except Exception:  # an onnxruntime without this opset's op: the reference decides
        from onnx.reference import ReferenceEvaluator

        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("follow", [None, "Relu"])
def test_normalisation_is_kernels_and_matches(case: str, follow: str | None,
                                              tmp_path: Path) -> None:
    op, x, params, opset, attrs = CASES[case]
    model = _model(op, x, params, opset, follow, **attrs)
    concrete = [2 if isinstance(d, str) else d for d in x]
    graph = load_graph(model, input_shapes={"x": concrete})
    assert op not in {n.op_type for n in graph.onnx_nodes}
    assert {"layernorm", "elementwise"} <= {k.op.kind for k in graph.kernel_nodes}
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    feeds = {"x": (np.random.default_rng(2).standard_normal(concrete) * 3 + 1).astype(
        np.float32)}
    np.testing.assert_allclose(compiled.run(feeds)["y"], _expected(model, feeds),
                               rtol=1e-4, atol=1e-4)


def test_scale_that_is_not_a_constant_stays_and_matches(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])], "norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    assert "InstanceNormalization" in {n.op_type for n in load_graph(model).onnx_nodes}
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32),
             "s": rng.standard_normal(3).astype(np.float32)}
    np.testing.assert_allclose(compiled.run(feeds)["y"], ort_run(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)
