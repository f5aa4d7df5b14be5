"""A constant-weight projection cut by ``Split`` along its columns (GPT-2's fused Q/K/V
``Conv1D``) becomes one matmul per piece writing its own tensor: no Split copy, the same
outputs as onnxruntime. Not when the cut is along another axis, the projection's output is
read elsewhere too, or its weights are computed."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx_support import Builder, compile_and_compare
from test_frontend_exporters import checked_runs

ROWS, K = 6, 16
WIDTHS = (8, 16, 24)


def projection_model(form: str) -> onnx.ModelProto:
    """``Split(Reshape(x @ W + b), WIDTHS)`` as the TorchScript export writes GPT-2's
    ``Conv1D``: ``gemm`` a Gemm with ``transB``; ``matmul`` a MatMul + Add; ``rows`` cut along
    the rows instead; ``reread`` with the projection also a graph output; ``computed`` with
    weights that are a graph input."""
    b = Builder(17, seed=4)
    x = b.input("x", [ROWS, K])
    n = sum(WIDTHS)
    if form == "gemm":
        y = b.node("Gemm", [x, b.weight(n, K), b.weight(n, scale=0.5)], transB=1)
    elif form == "computed":
        y = b.node("MatMul", [x, b.input("w", [K, n])])
    else:
        y = b.node("Add", [b.node("MatMul", [x, b.weight(K, n)]), b.weight(n, scale=0.5)])
    shaped = b.node("Reshape", [y, b.ints([1, ROWS, n])])
    if form == "rows":
        pieces = b.node("Split", [shaped, b.ints([2, 4])], n_out=2, axis=1)
    else:
        pieces = b.node("Split", [shaped, b.ints(list(WIDTHS))], n_out=3, axis=-1)
    outs = [b.node("Relu", [p]) for p in pieces]
    return b.model([*outs, *([y] if form == "reread" else [])], f"projection_{form}")


@pytest.mark.parametrize("form", ["gemm", "matmul"])
def test_a_split_projection_is_one_matmul_per_piece(form: str, tmp_path: Path) -> None:
    compiled = compile_and_compare(projection_model(form), tmp_path)
    assert not [s for s in compiled.graph.onnx_nodes if s.op_type == "Split"]
    matmuls = [k for k in compiled.graph.kernel_nodes if k.op.kind == "matmul"]
    assert [k.op.dim("N") for k in matmuls] == list(WIDTHS)
    # each piece's Relu reads only its matmul's result: it runs as that matmul's epilogue
    assert all(k.op.epilogue == ("bias", "relu") for k in matmuls)
    assert not [k for k in compiled.graph.kernel_nodes if k.op.kind == "elementwise"]
    assert len({k.name for k in matmuls}) == len(WIDTHS)
    # the whole weight matrix is not kept beside its slices
    sizes = [compiled.graph.constants[t].size for k in matmuls for t in k.inputs[1:]]
    assert sum(sizes) == (K + 1) * sum(WIDTHS)
    assert sum(a.size for a in compiled.graph.constants.values()) <= sum(sizes) + 16


@pytest.mark.parametrize("form", ["rows", "reread", "computed"])
def test_other_splits_stay(form: str, tmp_path: Path) -> None:
    compiled = compile_and_compare(projection_model(form), tmp_path)
    assert [s.op_type for s in compiled.graph.onnx_nodes].count("Split") == 1


@pytest.mark.parametrize("name", ["gpt2_torchscript17", "gpt2_dynamo18"])
def test_gpt2_projects_q_k_and_v_separately(name: str, tmp_path: Path) -> None:
    for compiled, feeds, _, _ in checked_runs(name, tmp_path, ((2, 5),)):
        planned = compiled.prepare({k: v.shape for k, v in feeds.items()})
        assert "Split" not in {s.op_type for s in planned.graph.onnx_nodes}
        matmuls = [k.op for k in planned.graph.kernel_nodes if k.op.kind == "matmul"]
        # per layer: Q, K, V and the output projection, each hidden x hidden
        assert sum(op.dim("N") == op.dim("K") for op in matmuls) == 4 * 2
        assert not [op.text for op in matmuls if op.dim("N") == 3 * op.dim("K")]
