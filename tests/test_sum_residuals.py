"""An n-ary ``Sum`` is a chain of ``Add`` nodes, which fuse like any other.

Older exporters write ResNet's residuals as ``Sum``; run in numpy, each one sent the
activations back to NCHW and cost the next convolution its blocked input (issue 54: 1.86x
the faster peer against parity for the ``Add`` export). Written as ``Add``, every residual
joins its convolution's epilogue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime")

from onnx_support import assert_close, ort_run, random_feeds, resnet50_model

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.tuner.deploy import compile_model


def test_resnet_with_sum_residuals_fuses_them_like_adds(tmp_path: Path) -> None:
    model = resnet50_model(1, 32)
    adds = [n for n in model.graph.node if n.op_type == "Add"]
    for node in adds:
        node.op_type = "Sum"
    path = tmp_path / "sum.onnx"
    onnx.save(model, str(path))
    graph = load_graph(path)
    assert not [s for s in graph.onnx_nodes if s.op_type in ("Sum", "Add")]
    residual = [k for k in graph.kernel_nodes if "add" in k.op.epilogue]
    assert len(residual) == len(adds) == 16
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    feeds = random_feeds(model)
    names = [o.name for o in model.graph.output]
    assert_close(compiled.run(feeds), ort_run(model, feeds), names, rtol=1e-4, atol=1e-4)


def test_nary_sum_broadcasts_as_onnx_says(tmp_path: Path) -> None:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
              for n, s in (("a", [2, 3, 4]), ("b", [4]), ("c", [3, 1]), ("d", [1, 1, 1]))]
    graph = helper.make_graph([helper.make_node("Sum", ["a", "b", "c", "d"], ["y"]),
                               helper.make_node("Sum", ["y"], ["z"])], "sums", inputs,
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert {s.op_type for s in load_graph(path).onnx_nodes} <= {"Add", "Identity"}  # a view
    rng = np.random.default_rng(5)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in inputs}
    ours = compile_model(path, store=Store(tmp_path / "s"), policy="analytic").run(feeds)
    np.testing.assert_allclose(ours["z"], ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)
