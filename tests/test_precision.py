"""The compile-time precision policy (issue 53): ``precision="bf16"`` runs the products with
constant weights as bf16 kernels where the CPU has bf16 dot products, reports the error
against fp32, and keeps fp32 (saying why) where it has none."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_support import Builder, bert_layer_model, mlp_model, resnet_model
from test_cli_compiler import tunecache

from tunecache.compiler import frontend
from tunecache.compiler.graph import Graph, KernelNode, ModelError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.layouts import TILE_ROW_LAYOUT
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.passes import plan_graph
from tunecache.compiler.precision import apply_precision
from tunecache.tuner.deploy import CompiledModel, compile_model

HW = local_spec()
BF16 = "avx512_bf16" in HW.features
WITH_BF16 = replace(HW.with_isa("avx512"), features=("avx512_bf16",)) \
    if "avx512" in HW.isa else None
WITH_TILES = None if WITH_BF16 is None else replace(
    WITH_BF16, features=("amx_bf16", "amx_tile", "avx512_bf16"))


def _graph(model: onnx.ModelProto) -> Graph:
    return plan_graph(frontend.load_graph(model), HW)


def _beside_fp32(path: Path, compiled: CompiledModel, store: Path,
                 feeds: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ours, float32's)`` per output of ``compiled`` and the float32 compile of ``path``
    run on ``feeds``."""
    fp32 = compile_model(path, store=store, policy="analytic")
    ours, exact = compiled.run(feeds), fp32.run(feeds)
    return [(ours[name], value) for name, value in exact.items()]


def _normal_feeds(compiled: CompiledModel, seed: int) -> dict[str, np.ndarray]:
    return {i.name: np.random.default_rng(seed).standard_normal(i.shape).astype(np.float32)
            for i in compiled.graph.inputs}


def test_fp32_changes_nothing() -> None:
    graph = _graph(bert_layer_model())
    same, plan = apply_precision(graph, HW, "fp32")
    assert same is graph and plan.used == "fp32" and plan.nodes == 0


def test_a_machine_without_bf16_dot_products_compiles_fp32_and_says_so() -> None:
    plain = replace(HW, features=())
    graph = _graph(bert_layer_model())
    same, plan = apply_precision(graph, plain, "bf16")
    assert same is graph
    assert (plan.requested, plan.used, plan.nodes) == ("bf16", "fp32", 0)
    assert "no bf16 dot product" in plan.note


@pytest.mark.skipif(WITH_BF16 is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_products_with_constant_weights_become_bf16() -> None:
    assert WITH_BF16 is not None
    graph = _graph(bert_layer_model())
    lowered, plan = apply_precision(graph, WITH_BF16, "bf16")
    kinds = [(n.op.kind, n.op.dtype) for n in lowered.kernel_nodes]
    # The six projections (QKV, output, both FFN matmuls); attention stays float32.
    assert kinds.count(("matmul", "bf16")) == 6 == plan.nodes
    assert ("attention", "float32") in kinds
    writers = {n.output: n for n in lowered.kernel_nodes}
    for node in lowered.kernel_nodes:
        if node.op.dtype == "bf16":
            # float32 A, rounded by the kernel, unless its writer hands it bfloat16
            writer = writers.get(node.inputs[0])
            narrow = writer is not None and writer.op.arguments()[-1].dtype == "bfloat16"
            assert node.op.attr("a_type") == ("dtype" if narrow else "float32")
            assert lowered.constants[node.inputs[1]].dtype == np.uint16
    with pytest.raises(ModelError, match="precision 'int4' is not one of fp32, bf16"):
        apply_precision(graph, HW, "int4")


@pytest.mark.skipif(WITH_TILES is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_with_bf16_tiles_attention_becomes_bf16_too() -> None:
    assert WITH_TILES is not None
    lowered, plan = apply_precision(_graph(bert_layer_model()), WITH_TILES, "bf16")
    kinds = [(n.op.kind, n.op.dtype) for n in lowered.kernel_nodes]
    assert kinds.count(("matmul", "bf16")) == 6 and ("attention", "bf16") in kinds
    assert plan.nodes == 7
    attention = next(n for n in lowered.kernel_nodes if n.op.kind == "attention")
    assert all(name not in lowered.constants for name in attention.inputs)
    # it reads the projections' outputs themselves (the heads' Reshape folded), as bfloat16
    writers = {n.output: n for n in lowered.kernel_nodes}
    assert attention.op.attr("narrow") == "q+k+v"
    for name in attention.inputs[:3]:
        assert writers[name].op.kind == "matmul" and writers[name].op.attr("narrow") == "y"


@pytest.mark.skipif(not BF16, reason="needs a CPU with AVX512-BF16 to run bf16 kernels")
def test_a_bf16_model_reports_its_error_against_fp32(tmp_path: Path) -> None:
    path = tmp_path / "bert.onnx"
    onnx.save(bert_layer_model(), path)
    compiled = compile_model(path, store=tmp_path / "store", policy="analytic",
                             precision="bf16")
    # the six projections, and the attention where it runs on bf16 tiles
    tiles = {"amx_tile", "amx_bf16"} <= set(HW.features)
    assert compiled.precision.used == "bf16" and compiled.precision.nodes == 6 + tiles
    assert compiled.accuracy is not None
    # bfloat16 keeps 8 bits of mantissa: a K=32..128 product errs by well under 1%.
    assert 0 < compiled.accuracy["max_rel_to_range"] < 2e-2
    for ours, exact in _beside_fp32(path, compiled, tmp_path / "store",
                                    _normal_feeds(compiled, 5)):
        assert np.abs(ours - exact).max() <= 2e-2 * np.abs(exact).max()


def test_the_cli_takes_a_precision_and_reports_it(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    result = tunecache("compile", str(path), "--precision", "bf16", "--policy", "analytic",
                       "--root", str(tmp_path / "store"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["precision"]["requested"] == "bf16"
    assert report["precision"]["used"] == ("bf16" if BF16 else "fp32")
    assert ("accuracy" in report) == BF16
    bad = tunecache("compile", str(path), "--precision", "fp8")
    assert bad.returncode == 2 and "'fp8' is not one of 'fp32', 'bf16'" in bad.stderr


@pytest.mark.skipif(WITH_BF16 is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_dense_convolutions_become_bf16_and_rgb_stems_stay_float32() -> None:
    assert WITH_BF16 is not None
    graph = _graph(resnet_model())
    lowered, plan = apply_precision(graph, WITH_BF16, "bf16")
    convs = [n.op for n in lowered.kernel_nodes if n.op.kind == "conv2d"]
    assert {op.dtype for op in convs if op.dim("C") >= 8} == {"bf16"}
    assert {op.dtype for op in convs if op.dim("C") < 8} == {"float32"}
    # the convolutions, the classifier and the blocked global pool
    assert plan.nodes == sum(n.op.dtype == "bf16" for n in lowered.kernel_nodes) == sum(
        op.dtype == "bf16" for op in convs) + 2


@pytest.mark.skipif(not BF16, reason="needs a CPU with AVX512-BF16 to run bf16 kernels")
def test_tuning_a_model_at_bf16_tunes_the_kernels_it_will_run(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    ops = [op for op, _, _ in frontend.kernel_ops(path, hw=HW, precision="bf16")]
    assert any(op.dtype == "bf16" for op in ops)
    result = tunecache("tune", "--model", str(path), "--precision", "bf16", "--trials", "2",
                       "--no-refine", "--no-baseline", "--publish", "--root",
                       str(tmp_path / "store"), "--json")
    assert result.returncode == 0, result.stderr
    tuned = {op["op"] for op in json.loads(result.stdout)["ops"] if op["status"] == "tuned"}
    assert {op.text for op in ops if op.dtype == "bf16"} <= tuned
    compiled = tunecache("compile", str(path), "--precision", "bf16", "--policy", "cache-only",
                         "--root", str(tmp_path / "store"), "--json")
    assert json.loads(compiled.stdout)["actions"] == {"cache": len(ops)}


@pytest.mark.skipif(WITH_BF16 is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_activations_between_bf16_convolutions_flow_as_bfloat16() -> None:
    assert WITH_BF16 is not None
    lowered, _ = apply_precision(_graph(resnet_model()), WITH_BF16, "bf16")
    steps, outputs = lowered.steps, {t.name for t in lowered.outputs}
    narrowed = 0
    for node in lowered.kernel_nodes:
        held = dict(node.op.attrs).get("narrow", "none")
        users = [s for s in steps if node.output in s.inputs]
        readable = node.op.dtype == "bf16" and users and node.output not in outputs and all(
            isinstance(s, KernelNode) and s.op.dtype == "bf16" for s in users)
        # a bf16 writer whose every reader is a bf16 kernel hands it bfloat16 ...
        assert ("y" in held.split("+")) == bool(readable and all(
            s.op.kind in ("conv2d", "pool2d") for s in users)), node.op
        narrowed += "y" in held.split("+")
        for user in users if "y" in held.split("+") else ():
            role = {"X": "x", "add": "add"}[
                [a.name for a in user.op.arguments()][user.inputs.index(node.output)]]
            assert role in user.op.attr("narrow").split("+")  # ... and each takes it so
    assert narrowed >= 3
    assert {lowered.kernel_nodes[-1].op.arguments()[-1].dtype} == {"float32"}


@pytest.mark.skipif(not BF16, reason="needs a CPU with AVX512-BF16 to run bf16 kernels")
def test_a_bf16_cnn_with_bfloat16_activations_stays_near_fp32(tmp_path: Path) -> None:
    path = tmp_path / "resnet.onnx"
    onnx.save(resnet_model(width=32), path)
    compiled = compile_model(path, store=tmp_path / "store", policy="analytic",
                             precision="bf16")
    held = [n.op.attr("narrow") for n in compiled.graph.kernel_nodes if n.op.kind == "conv2d"]
    assert any("y" in h for h in held) and any("x" in h for h in held)
    for ours, exact in _beside_fp32(path, compiled, tmp_path / "store",
                                    _normal_feeds(compiled, 6)):
        assert ours.dtype == np.float32
        assert np.abs(ours - exact).max() <= 3e-2 * np.abs(exact).max()


@pytest.mark.skipif(WITH_TILES is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_with_bf16_tiles_activations_between_convolutions_take_tile_row_blocks() -> None:
    assert WITH_TILES is not None and WITH_BF16 is not None
    without, _ = apply_precision(_graph(resnet_model(width=32)), WITH_BF16, "bf16")
    assert not any(TILE_ROW_LAYOUT in (n.op.attr("layout"), n.op.attr("out_layout"))
                   for n in without.kernel_nodes if n.op.kind == "conv2d")
    lowered, _ = apply_precision(_graph(resnet_model(width=32)), WITH_TILES, "bf16")
    convs = [n for n in lowered.kernel_nodes if n.op.kind == "conv2d"]
    blocked = [n for n in lowered.kernel_nodes if n.op.kind in ("conv2d", "pool2d")]
    wide = {n.output for n in blocked if _out_layout(n.op) == TILE_ROW_LAYOUT}
    assert wide  # held in 64-byte blocks: only bfloat16 between bf16 kernels
    assert wide <= {n.output for n in blocked if "y" in n.op.attr("narrow").split("+")}
    for node in convs:
        names = [a.name for a in node.op.arguments() if a.role == "input"]
        roles = dict(zip(names, node.inputs, strict=False))
        assert (node.op.attr("layout") == TILE_ROW_LAYOUT) == (roles["X"] in wide)
        if "add" in roles:  # a residual lies in its reader's output layout
            assert (roles["add"] in wide) == (node.output in wide)


def _out_layout(op: OpSignature) -> str:
    attrs = dict(op.attrs)
    return attrs.get("out_layout", attrs["layout"])


def _inverted_residual() -> onnx.ModelProto:
    """A MobileNet-v2 block of whole 16-channel blocks between two convolutions: 1x1
    expand, 3x3 depthwise, 1x1 project and the residual; then a strided block's first
    two."""
    b = Builder(13, seed=4)
    x = b.conv(b.input("x", [1, 16, 28, 28]), 16, 16, 3, bias=True, name="stem")
    t = b.clip(b.conv(x, 16, 64, 1, pad=0, bias=True, name="expand"), 0.0, 6.0)
    t = b.clip(b.conv(t, 64, 64, 3, groups=64, bias=True, name="dw"), 0.0, 6.0)
    t = b.node("Add", [x, b.conv(t, 64, 16, 1, pad=0, bias=True, name="project")])
    t = b.clip(b.conv(t, 16, 64, 1, pad=0, bias=True, name="expand2"), 0.0, 6.0)
    t = b.conv(t, 64, 64, 3, stride=2, groups=64, bias=True, name="dw2")
    return b.model([b.conv(t, 64, 32, 1, pad=0, bias=True, name="head")], "inverted_residual")


@pytest.mark.skipif(WITH_TILES is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_at_bf16_an_expansion_stays_apart_from_its_depthwise_layer() -> None:
    # fused, the expansion would run in float32; apart, on bf16 tiles, with the depthwise
    # layer between bf16 convolutions reading and writing bfloat16
    assert WITH_TILES is not None
    loaded = frontend.load_graph(_inverted_residual())
    assert "pwdw" in {n.op.kind for n in plan_graph(loaded, WITH_TILES).kernel_nodes}
    apart = plan_graph(loaded, WITH_TILES, precision="bf16")
    lowered, _ = apply_precision(apart, WITH_TILES, "bf16")
    ops = {n.nodes[0]: n.op for n in lowered.kernel_nodes}
    assert {op.kind for op in ops.values()} == {"conv2d"}
    assert {op.dtype for op in ops.values()} == {"bf16"}
    assert ops["dw"].attr("narrow") == "x+y" and ops["dw"].arguments()[1].dtype == "float32"
    # 64 channels: whole tile-row blocks on either side, but not around a strided one
    assert ops["dw"].attr("layout") == ops["dw"].attr("out_layout") == TILE_ROW_LAYOUT
    assert ops["dw2"].attr("layout") == ops["dw2"].attr("out_layout") == "nchw16c"
    assert ops["expand"].attr("out_layout") == TILE_ROW_LAYOUT


@pytest.mark.skipif(not BF16, reason="needs a CPU with AVX512-BF16 to run bf16 kernels")
def test_a_bf16_inverted_residual_block_stays_near_fp32(tmp_path: Path) -> None:
    path = tmp_path / "block.onnx"
    onnx.save(_inverted_residual(), path)
    compiled = compile_model(path, store=tmp_path / "store", policy="analytic",
                             precision="bf16")
    assert any(n.op.dtype == "bf16" and n.op.dim("groups") > 1
               for n in compiled.graph.kernel_nodes)
    for ours, exact in _beside_fp32(path, compiled, tmp_path / "store",
                                    _normal_feeds(compiled, 7)):
        assert np.abs(ours - exact).max() <= 3e-2 * np.abs(exact).max()


@pytest.mark.skipif(WITH_TILES is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_a_kernel_of_one_block_size_keeps_its_input_where_its_output_stays() -> None:
    # the depthwise layer's output goes to a float32 pool (16-channel blocks), so its X
    # stays in them too; the stem's output, between dense convolutions, still moves
    assert WITH_TILES is not None
    b = Builder(13, seed=5)
    x = b.conv(b.input("x", [1, 16, 28, 28]), 16, 64, 3, bias=True, name="stem")
    t = b.conv(x, 64, 64, 1, pad=0, bias=True, name="expand")
    t = b.conv(t, 64, 64, 3, groups=64, bias=True, name="dw")
    model = b.model([b.node("GlobalAveragePool", [t], name="pool")], "one_block_size")
    graph = plan_graph(frontend.load_graph(model), WITH_TILES, precision="bf16")
    lowered, _ = apply_precision(graph, WITH_TILES, "bf16")
    ops = {n.nodes[0]: n.op for n in lowered.kernel_nodes}
    assert ops["stem"].attr("out_layout") == ops["expand"].attr("layout") == TILE_ROW_LAYOUT
    assert ops["expand"].attr("out_layout") == ops["dw"].attr("layout") == "nchw16c"


@pytest.mark.skipif(WITH_BF16 is None, reason="needs AVX-512 to generate bf16 kernels for")
def test_the_ffn_hands_its_activation_on_as_bfloat16() -> None:
    """BERT's FFN: the first matmul's GELU output is read only by the second, which rounds
    it to bfloat16 anyway: the first stores it so and the second reads it as it is."""
    assert WITH_BF16 is not None
    lowered, _ = apply_precision(_graph(bert_layer_model()), WITH_BF16, "bf16")
    matmuls = {n.output: n for n in lowered.kernel_nodes if n.op.kind == "matmul"}
    ffn_in = next(n for n in matmuls.values() if "gelu_erf" in n.op.epilogue)
    ffn_out = next(n for n in matmuls.values() if ffn_in.output in n.inputs)
    assert ffn_in.op.attr("narrow") == "y" and ffn_in.op.arguments()[-1].dtype == "bfloat16"
    assert ffn_out.op.attr("a_type") == "dtype"
    # the projections' outputs go to float32 readers (attention, layernorm): float32
    others = [n for n in matmuls.values() if n is not ffn_in]
    assert all(n.op.attr("narrow") == "none" for n in others)


@pytest.mark.skipif(not BF16, reason="needs a CPU with AVX512-BF16 to run bf16 kernels")
def test_narrowing_the_ffn_changes_no_output_bit(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bert.onnx"
    onnx.save(bert_layer_model(), path)
    feeds = None
    outputs = []
    from tunecache.compiler.lowering import bf16

    for roles in (None, {k: v for k, v in bf16._ROLES.items() if k != "A"}):
        if roles is not None:
            monkeypatch.setattr("tunecache.compiler.lowering.bf16._ROLES", roles)
        compiled = compile_model(path, store=tmp_path / "store", policy="analytic",
                                 precision="bf16")
        feeds = feeds or _normal_feeds(compiled, 7)
        outputs.append(compiled.run(feeds))
    for name, value in outputs[0].items():
        np.testing.assert_array_equal(value, outputs[1][name])
