"""What load_graph turns into kernels: op signatures, fused nodes, folded constants."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx
import onnx_support as models
from onnx import helper

from tunecache.compiler.executor import Executor
from tunecache.compiler.frontend import kernel_ops, load_graph
from tunecache.compiler.graph import KernelNode, OnnxNode


def kernels_by_name(graph) -> dict[str, KernelNode]:
    return {n.name: n for n in graph.kernel_nodes}


def onnx_steps(graph) -> dict[str, OnnxNode]:
    return {n.name: n for n in graph.onnx_nodes}


def test_resnet_conv_bn_relu_and_residual_fusion() -> None:
    graph = load_graph(models.resnet_model(13))
    k = kernels_by_name(graph)
    assert k["stem"].nodes == ("stem", "stem_bn", "stem_relu")
    assert k["stem"].op.text == (
        "conv2d(N=1,C=3,H=16,W=16,F=8,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
        "pad_r=1,dil_h=1,dil_w=1,groups=1,dtype=float32,layout=nchw,epilogue=bias+relu)")
    assert k["b1_conv1"].nodes == ("b1_conv1", "b1_bn1", "b1_relu1")
    assert k["b1_conv2"].nodes == ("b1_conv2", "b1_bn2", "b1_add", "b1_relu2")
    assert k["b1_conv2"].op.epilogue == ("bias", "add", "relu")
    # the residual operand is the MaxPool output, the fourth kernel argument
    maxpool = next(s for s in graph.kernel_nodes if s.op.kind == "pool2d" and
                   s.op.attr("mode") == "max")
    assert k["b1_conv2"].inputs[3] == maxpool.output
    assert k["b2_conv1"].op.epilogue == ("bias", "relu")  # the conv's own bias, BN-folded
    assert k["b2_short"].nodes == ("b2_short", "b2_short_bn")
    assert k["b2_short"].op.epilogue == ("bias",)
    assert k["b2_conv2"].nodes == ("b2_conv2", "b2_bn2", "b2_add", "b2_relu2")
    assert k["b2_conv2"].inputs[3] == k["b2_short"].output
    assert k["fc"].op.text == "matmul(M=1,N=10,K=16,dtype=float32,layout=nt,epilogue=bias)"
    assert k["fc"].output_shape == (1, 10)
    # pooling is generated code too; only the flattening view is left (it costs nothing)
    assert [s.op_type for s in graph.onnx_nodes] == ["Flatten"]
    pools = [s.op for s in graph.kernel_nodes if s.op.kind == "pool2d"]
    assert [(op.attr("mode"), op.dim("R"), op.dim("stride_h")) for op in pools] == [
        ("max", 3, 2), ("avg", 2, 1)]  # global pooling: the window is the 2x2 plane
    # steps run in an order where every kernel's inputs already exist
    order = [s.name for s in graph.steps]
    assert order.index("b2_short") < order.index("b2_conv2")


def test_bn_folding_makes_new_read_only_constants() -> None:
    model = models.resnet_model(13)
    original = {i.name: models.numpy_helper.to_array(i).copy() for i in model.graph.initializer}
    graph = load_graph(model)
    stem = kernels_by_name(graph)["stem"]
    w_name, b_name = stem.inputs[1], stem.inputs[2]
    assert w_name not in original and b_name not in original
    w, b = graph.constants[w_name], graph.constants[b_name]
    assert w.dtype == np.float32 and w.shape == (8, 3, 3, 3) and b.shape == (8,)
    assert not w.flags.writeable
    conv = next(n for n in model.graph.node if n.name == "stem")
    bn = next(n for n in model.graph.node if n.name == "stem_bn")
    scale, beta, mean, var = (original[t] for t in bn.input[1:])
    factor = scale / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(w, original[conv.input[1]] * factor[:, None, None, None],
                               rtol=1e-6)
    np.testing.assert_allclose(b, beta - mean * factor, rtol=1e-5, atol=1e-7)
    for name, value in original.items():  # the model's own weights are untouched
        np.testing.assert_array_equal(models.numpy_helper.to_array(
            next(i for i in model.graph.initializer if i.name == name)), value)


def test_depthwise_blocks() -> None:
    graph = load_graph(models.mobilenet_model(13))
    k = kernels_by_name(graph)
    assert k["dw"].op.dim("groups") == 24 and k["dw"].op.epilogue == ("bias", "clip6")
    # ReLU6 (Clip(0, 6)) after the folded BatchNorm is the conv's epilogue: no extra kernel
    assert k["expand"].op.epilogue == ("bias", "clip6") and len(k["expand"].nodes) == 3
    assert graph.onnx_nodes == ()
    assert not [s for s in graph.kernel_nodes if s.op.kind == "elementwise"]
    assert k["project"].nodes == ("project", "project_bn", "residual")
    assert k["project"].op.epilogue == ("bias", "add")
    assert k["project"].inputs[3] == "x"
    dw2 = k["dw2"].op.dims_dict  # SAME_UPPER, stride 2 on 10x10: the extra pad at the end
    assert (dw2["pad_t"], dw2["pad_l"], dw2["pad_b"], dw2["pad_r"]) == (0, 0, 1, 1)
    assert dw2["groups"] == 8 and dw2["F"] == 16  # channel multiplier 2
    assert k["dw3"].op.dims_dict["pad_t"] == 0  # VALID


@pytest.mark.parametrize(("opset", "layer_norm_op"), [(17, True), (13, False)])
def test_bert_layer(opset: int, layer_norm_op: bool) -> None:
    graph = load_graph(models.bert_layer_model(opset, layer_norm_op=layer_norm_op))
    k = kernels_by_name(graph)
    for name in ("query", "key", "value", "attn_out"):
        assert k[name].nodes == (name, f"{name}_add")
        assert k[name].op.text == "matmul(M=16,N=32,K=32,dtype=float32,layout=nn,epilogue=bias)"
    assert k["ffn_in"].op.text == "matmul(M=16,N=128,K=32,dtype=float32,layout=nn,epilogue=bias)"
    assert k["ffn_out"].op.dims_dict == {"M": 16, "N": 32, "K": 128}
    # scores, scale, mask, softmax and context are one attention kernel; see
    # test_lowering_attention.py for the scaled, masked softmax kernel it replaces. It reads
    # Q, K and V as the projections wrote them and writes the merged heads (tokens=qkvy):
    # the head split's Reshapes and Transposes (K's perm (0, 2, 3, 1) too) and the merge's
    # Transpose are gone: it reads the projections' outputs themselves.
    assert k["scores"].op.text == (
        "attention(B=8,M=8,N=8,D=8,Dv=0,mask_rows=2,heads=4,dtype=float32,mask=padding,"
        "scale=default,tokens=qkvy,epilogue=none)")
    assert k["scores"].nodes[:6] == ("scores", "transpose15", "div21", "add22", "softmax23",
                                     "context")
    assert len(k["scores"].nodes) == 13 and "context" not in k
    assert k["scores"].inputs[:3] == ("query_add_out", "key_add_out", "value_add_out")
    assert k["scores"].output_shape == (2, 8, 4, 8)
    types = [s.op_type for s in graph.onnx_nodes]
    assert types.count("Reshape") == 1 and "Transpose" not in types  # the merge's: a view
    # the Shape/Gather/Unsqueeze/Concat chains became constants
    assert not {"Shape", "Gather", "Unsqueeze", "Concat"} & set(types)
    assert not [s for s in graph.kernel_nodes if s.op.kind == "softmax"]
    # so is the exported GELU one kernel
    gelu = next(s for s in graph.kernel_nodes if s.op.kind == "elementwise"
                and "gelu_erf" in s.op.epilogue)
    assert gelu.op.epilogue == ("gelu_erf",) and len(gelu.nodes) == 5
    assert "Softmax" not in types and "Erf" not in types
    # LayerNormalization with the residual Add before it: one kernel per norm; written out
    # in nodes, the RMSNorm of the centred rows (t - mean t) with scale and bias is one
    norms = [s for s in graph.kernel_nodes if s.op.kind == "layernorm"]
    assert len(norms) == 2
    assert all(n.op.attr("residual") == ("yes" if layer_norm_op else "no") for n in norms)
    assert all(n.op.attr("norm") == ("layer" if layer_norm_op else "rms") and
               n.op.attr("affine") == "gamma_beta" for n in norms)
    assert ("LayerNormalization" in types) is False


def test_matmul_and_gemm_mapping_and_fallbacks() -> None:
    graph = load_graph(models.fusion_cases_model(13))
    k, n = kernels_by_name(graph), onnx_steps(graph)
    assert k["c_dil"].nodes == ("c_dil", "c_dil_add", "c_dil_relu")
    d = k["c_dil"].op.dims_dict
    assert (d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]) == (0, 1, 2, 1)
    assert (d["stride_h"], d["stride_w"], d["dil_h"], d["dil_w"]) == (1, 2, 2, 2)
    # the per-channel constant Add is folded into the conv's bias
    np.testing.assert_allclose(graph.constants[k["c_dil"].inputs[2]],
                               np.linspace(-0.2, 0.2, 4) + np.array([0.1, -0.1, 0.2, 0.0]),
                               rtol=1e-6)
    assert k["c_grp"].nodes == ("c_grp", "c_grp_bn", "c_grp_add")
    assert k["c_grp"].inputs[3] == k["c_side"].output
    order = [s.name for s in graph.steps]
    assert order.index("c_side") < order.index("c_grp")  # placed at its last fused node
    assert k["c_twice"].nodes == ("c_twice",)   # output used twice
    assert k["c_out"].nodes == ("c_out",)       # output is a graph output
    # the Relu the conv could not take runs as an element-wise kernel (with the Mul after it)
    assert k["c_out_relu"].op.text == "elementwise(M=20,N=4,dtype=float32,operand=full,epilogue=relu)"
    assert k["c_twice_relu"].nodes == ("c_twice_relu", "mul11")
    assert k["c_twice_relu"].op.epilogue == ("relu", "mul")
    assert k["mm_rows"].nodes == ("mm_rows", "mm_rows_add", "mm_rows_relu")
    assert k["mm_rows"].op.text == "matmul(M=30,N=6,K=4,dtype=float32,layout=nn,epilogue=bias+relu)"
    assert k["mm_shared_a"].op.text == (
        "batch_matmul(B=6,M=5,N=5,K=4,dtype=float32,layout=nn,shared=a,epilogue=none)")
    # B is computed, not a constant: one batch item (matmul's B is constant weights)
    assert k["mm_shared_b"].op.text == (
        "batch_matmul(B=1,M=30,N=6,K=4,dtype=float32,layout=nn,shared=none,epilogue=none)")
    assert k["mm_vec"].op.dims_dict == {"M": 30, "N": 1, "K": 4}
    assert k["mm_vec"].nodes == ("mm_vec",)
    assert "broadcast batch dimensions [2, 3] x [1, 3]" in n["mm_bcast"].note
    assert n["gemm_alpha"].note == "alpha=0.5 with neither operand constant"
    # an Add of a vector the matmul could not take (N=1): a kernel with a per-row operand
    assert k["mm_vec_add"].op.text == "elementwise(M=6,N=5,dtype=float32,operand=row,epilogue=add)"


def test_gemm_attributes() -> None:
    model = models.mlp_model(9)
    inits = {i.name: models.numpy_helper.to_array(i) for i in model.graph.initializer}
    node = {n.name: n for n in model.graph.node}
    graph = load_graph(model)
    k, n = kernels_by_name(graph), onnx_steps(graph)
    assert k["fc1"].nodes == ("fc1", "fc1_relu")
    assert k["fc1"].op.text == "matmul(M=4,N=16,K=24,dtype=float32,layout=nt,epilogue=bias+relu)"
    assert k["fc1"].inputs[1:] == tuple(node["fc1"].input[1:])  # used as they are, no copy
    # alpha=0.5 pre-scales the constant B; beta=2 pre-scales the constant C
    fc2 = k["fc2"]
    np.testing.assert_allclose(graph.constants[fc2.inputs[1]], inits[node["fc2"].input[1]] * 0.5)
    np.testing.assert_allclose(graph.constants[fc2.inputs[2]],
                               inits[node["fc2"].input[2]].reshape(-1) * 2.0)
    assert k["fc3"].op.attr("layout") == "tn"
    np.testing.assert_allclose(graph.constants[k["fc3"].inputs[2]], np.full(6, 0.125))
    assert "C of shape [4, 6]" in n["fc4"].note


def test_kernel_ops_counts_and_labels(tmp_path) -> None:
    path = tmp_path / "bert.onnx"
    models.onnx.save(models.bert_layer_model(17), str(path))
    ops = kernel_ops(path)
    counts = {op.text: (count, label) for op, count, label in ops}
    qkv = "matmul(M=16,N=32,K=32,dtype=float32,layout=nn,epilogue=bias)"
    assert counts[qkv] == (4, "query, key, value (+1 more)")
    attention = ("attention(B=8,M=8,N=8,D=8,Dv=0,mask_rows=2,heads=4,dtype=float32,"
                 "mask=padding,scale=default,tokens=qkvy,epilogue=none)")
    assert counts[attention] == (1, "scores")
    # 6 matmuls, the attention, GELU and the two residual layer norms
    assert sum(c for c, _ in counts.values()) == 10
    assert sum(c for op, (c, _) in zip(counts, counts.values(), strict=True)
               if op.startswith("layernorm(")) == 2
    assert ops[0][0].text == qkv  # first-use order


def test_unsorted_nodes_are_ordered() -> None:
    model = models.resnet_model(13)
    nodes = list(model.graph.node)
    random.Random(0).shuffle(nodes)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    graph = load_graph(model)
    feeds = models.random_feeds(model)
    expected = Executor(load_graph(models.resnet_model(13))).run(feeds)
    got = Executor(graph).run(feeds)
    np.testing.assert_allclose(got[graph.outputs[0].name], expected[graph.outputs[0].name],
                               rtol=1e-5, atol=1e-6)


def test_constant_only_subgraphs_are_folded_and_dead_nodes_dropped() -> None:
    b = models.Builder(13)
    x = b.input("x", [2, 6])
    w = b.node("Transpose", [b.weight(4, 6)], perm=[1, 0])       # folded: a constant [6, 4]
    unused = b.node("Relu", [x])                                 # feeds nothing
    del unused
    y = b.node("MatMul", [x, w], name="mm")
    graph = load_graph(b.model([y]))
    assert [s.name for s in graph.steps] == ["mm"]
    mm = graph.kernel_nodes[0]
    assert graph.constants[mm.inputs[1]].shape == (6, 4)


def test_resnet50_sized_load_folds_every_batchnorm() -> None:
    model = models.resnet50_model()
    params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    assert 25_000_000 < params < 26_000_000
    graph = load_graph(model)
    # 53 convs (all BN-folded), the classifier, the stem's max pool and the global pool
    assert len(graph.kernel_nodes) == 56
    assert all(len(n.nodes) >= 2 for n in graph.kernel_nodes if n.op.kind == "conv2d")


def test_graph_output_that_is_a_constant_or_an_input() -> None:
    b = models.Builder(13)
    x = b.input("x", [3])
    c = b.node("Constant", [], value=helper.make_tensor("v", models.F32, [2], [1.0, 2.0]))
    graph = load_graph(b.model([c, x]))
    out = Executor(graph).run({"x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(out[c], [1.0, 2.0])
    out[c][0] = 5.0  # a copy: the graph's constant is unchanged
    assert Executor(graph).run([np.zeros(3, np.float32)])[c][0] == 1.0


def test_identity_and_dropout_do_not_block_fusion() -> None:
    b = models.Builder(13)
    x = b.input("x", [2, 6])
    y = b.node("MatMul", [x, b.weight(6, 4)], name="mm")
    y = b.node("Identity", [y])
    y = b.node("Add", [y, b.weight(4)], name="mm_add")
    y = b.node("Dropout", [y])
    y = b.node("Relu", [y], name="mm_relu")
    kept = b.node("Identity", [y], name="last")  # a graph output: kept
    model = b.model([kept])
    graph = load_graph(model)
    assert graph.kernel_nodes[0].nodes == ("mm", "mm_add", "mm_relu")
    assert [s.op_type for s in graph.onnx_nodes] == ["Identity"]
    feeds = models.random_feeds(model)
    got = Executor(graph).run(feeds)
    np.testing.assert_allclose(got[kept], models.ort_run(model, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["half_first", "value_then_half", "half_of_erf_first"])
def test_exported_gelu_in_every_association_is_one_kernel(form: str) -> None:
    b = models.Builder(13)
    x = b.input("x", [3, 10])
    half = b.const(np.float32(0.5))
    if form == "half_first":  # (0.5 * x) * (1 + erf(x / sqrt2)), the halving written first
        h = b.node("Mul", [x, half])
    erf = b.node("Erf", [b.node("Div", [x, b.const(np.float32(np.sqrt(2.0)))])])
    plus = b.node("Add", [erf, b.const(np.float32(1.0))])
    if form == "half_first":
        y = b.node("Mul", [h, plus])
    elif form == "value_then_half":  # (x * (1 + erf)) * 0.5
        y = b.node("Mul", [b.node("Mul", [x, plus]), half])
    else:  # (1 + erf) * (0.5 * x), the halving written after the erf
        y = b.node("Mul", [plus, b.node("Mul", [x, half])])
    model = b.model([y])
    graph = load_graph(model)
    [gelu] = graph.kernel_nodes
    assert gelu.op.epilogue == ("gelu_erf",) and len(gelu.nodes) == 5
    assert graph.onnx_nodes == ()
    feeds = models.random_feeds(model)
    models.assert_close(Executor(graph).run(feeds), models.ort_run(model, feeds), [y])


@pytest.mark.parametrize("form", ["half_first", "pow_first", "other_cube"])
def test_gelu_tanh_as_gpt2_exports_it_is_one_kernel(form: str) -> None:
    """(0.5 * x) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), in GPT-2's node order or
    with the Pow first; with another exponent it is not GELU and is not fused as one."""
    b = models.Builder(13)
    x = b.input("x", [3, 10])
    if form == "half_first":
        h = b.node("Mul", [x, b.const(np.float32(0.5))])
    cube = b.node("Pow", [x, b.const(np.float32(3.0 if form != "other_cube" else 2.0))])
    inner = b.node("Add", [x, b.node("Mul", [cube, b.const(np.float32(0.044715))])])
    t = b.node("Tanh", [b.node("Mul", [inner, b.const(np.float32(np.sqrt(2.0 / np.pi)))])])
    plus = b.node("Add", [t, b.const(np.float32(1.0))])
    if form != "half_first":
        h = b.node("Mul", [x, b.const(np.float32(0.5))])
    y = b.node("Mul", [h, plus])
    model = b.model([y])
    graph = load_graph(model)
    if form == "other_cube":
        assert all("gelu_tanh" not in k.op.epilogue for k in graph.kernel_nodes)
    else:
        [gelu] = graph.kernel_nodes
        assert gelu.op.epilogue == ("gelu_tanh",) and len(gelu.nodes) == 8
        assert graph.onnx_nodes == ()
    feeds = models.random_feeds(model)
    models.assert_close(Executor(graph).run(feeds), models.ort_run(model, feeds), [y])


def activation_model(tail: str, opset: int = 13) -> tuple[onnx.ModelProto, str]:
    """A 3x3 conv with bias whose outputs reach past 6 (weights of scale 1), then ``tail``:
    ``clip6`` / ``clip4`` (Clip(0, 6) / Clip(0, 4)), ``silu`` (Mul(t, Sigmoid(t))) or
    ``bn_silu`` (BatchNorm, then Mul(Sigmoid(t), t)). Returns the model and its output."""
    b = models.Builder(opset, seed=8)
    x = b.input("x", [1, 8, 10, 10])
    bias = b.const(np.linspace(-1, 1, 16, dtype=np.float32), "b")
    t = b.node("Conv", [x, b.weight(16, 8, 3, 3, scale=1.0), bias], name="conv",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if tail in ("clip6", "clip4"):
        y = b.clip(t, 0.0, 6.0 if tail == "clip6" else 4.0)
    elif tail == "silu":
        y = b.node("Mul", [t, b.node("Sigmoid", [t])])
    else:
        t = b.bn(t, 16)
        y = b.node("Mul", [b.node("Sigmoid", [t]), t])
    return b.model([y]), y


@pytest.mark.parametrize(("tail", "opset", "step"), [
    ("clip6", 13, "clip6"), ("clip6", 9, "clip6"), ("silu", 13, "silu"), ("bn_silu", 13, "silu")])
def test_relu6_and_silu_after_a_conv_are_its_epilogue(tail: str, opset: int, step: str,
                                                      tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    model, y = activation_model(tail, opset)
    graph = load_graph(model)
    [conv] = graph.kernel_nodes
    assert conv.op.kind == "conv2d" and conv.op.epilogue == ("bias", step)
    assert len(conv.nodes) == {"clip6": 2, "silu": 3, "bn_silu": 4}[tail]
    assert graph.onnx_nodes == () and conv.output == y
    compiled = models.compile_and_compare(model, tmp_path)
    assert [(e.op.kind, e.op.epilogue) for e in compiled.plan] == [("conv2d", ("bias", step))]
    feeds = models.random_feeds(model)
    [want] = models.ort_run(model, feeds)
    got = compiled.run(feeds)[y]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    if step == "clip6":
        assert (want == 0).any() and (want == 6).any()


def test_clip_to_other_bounds_is_not_a_conv_epilogue(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    model, _ = activation_model("clip4")
    graph = load_graph(model)
    [conv] = graph.kernel_nodes
    assert conv.op.epilogue == ("bias",)
    assert [s.op_type for s in graph.onnx_nodes] == ["Clip"]
    models.compile_and_compare(model, tmp_path)


@pytest.mark.parametrize("case", ["conv_output_is_graph_output", "sigmoid_is_graph_output",
                                  "sigmoid_read_twice", "mul_of_another_tensor"])
def test_silu_fuses_only_when_its_tensors_are_private(case: str) -> None:
    b = models.Builder(13, seed=9)
    x = b.input("x", [1, 4, 6, 6])
    t = b.conv(x, 4, 4, 3, bias=True, name="conv")
    s = b.node("Sigmoid", [t], name="sig")
    outputs = []
    if case == "mul_of_another_tensor":  # squeeze-excitation's gate: x * Sigmoid(t), not SiLU
        outputs.append(b.node("Mul", [x, s], name="mul"))
    else:
        outputs.append(b.node("Mul", [t, s], name="mul"))
    if case == "conv_output_is_graph_output":
        outputs.append(t)
    elif case == "sigmoid_is_graph_output":
        outputs.append(s)
    elif case == "sigmoid_read_twice":
        outputs.append(b.node("Relu", [s]))
    model = b.model(outputs)
    graph = load_graph(model)
    conv = kernels_by_name(graph)["conv"]
    assert conv.op.epilogue == ("bias",) and conv.nodes == ("conv",)
    feeds = models.random_feeds(model)
    models.assert_close(Executor(graph).run(feeds), models.ort_run(model, feeds), outputs)


def test_a_cast_to_the_same_type_is_elided() -> None:
    """A float32 -> float32 Cast (exporters write them around normalisations) is an alias,
    so the MatMul's bias Add and Relu still fuse through it; a Cast that converts stays."""
    b = models.Builder(17)
    x = b.input("x", [4, 6])
    same = b.node("Cast", [b.node("MatMul", [x, b.weight(6, 8)], name="mm")],
                  to=onnx.TensorProto.FLOAT)
    y = b.node("Relu", [b.node("Add", [same, b.weight(8)])])
    ints = b.node("Cast", [y], to=onnx.TensorProto.INT64)
    back = b.node("Cast", [ints], to=onnx.TensorProto.FLOAT)
    model = b.model([y, back])
    graph = load_graph(model)
    assert [s.attrs["to"] for s in graph.onnx_nodes if s.op_type == "Cast"] == [
        onnx.TensorProto.INT64, onnx.TensorProto.FLOAT]
    [mm] = graph.kernel_nodes
    assert mm.op.epilogue == ("bias", "relu")
    feeds = models.random_feeds(model)
    models.assert_close(Executor(graph).run(feeds), models.ort_run(model, feeds), [y, back])


def test_repeated_computations_are_computed_once() -> None:
    """Nodes repeating an earlier computation (same op and attributes, same inputs, small
    constants equal by value though named apart, as exporters write a mask per layer) are
    dropped and their readers read the first; a different constant, a random op, or a
    duplicate that is a graph output keep their nodes."""
    b = models.Builder(17)
    x = b.input("x", [4, 6])
    mask = b.node("Greater", [x, b.const(np.float32(0.0))])
    fills = [b.node("Where", [mask, b.const(np.float32(0.0)), b.const(np.float32(-1e4))])
             for _ in range(3)]
    other = b.node("Where", [mask, b.const(np.float32(0.0)), b.const(np.float32(-5.0))])
    outputs = [b.node("Add", [x, f]) for f in fills[:2]]
    model = b.model([*outputs, fills[2], other])
    graph = load_graph(model)
    wheres = [s for s in graph.onnx_nodes if s.op_type == "Where"]
    # fills[1] repeats fills[0]; fills[2] is a graph output, and other fills with -5
    assert [w.outputs[0] for w in wheres] == [fills[0], fills[2], other]
    readers = [s for s in graph.steps if fills[0] in s.inputs]
    assert len(readers) == 2  # both Adds read the first fill (as kernels or numpy steps)
    feeds = models.random_feeds(model)
    models.assert_close(Executor(graph).run(feeds), models.ort_run(model, feeds),
                        [*outputs, fills[2], other])


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_ceil_mode_pool_drops_a_window_past_the_input(op: str) -> None:
    """ONNX shape inference keeps a ceil-mode pool's last window when it would start past
    the input and its begin padding; onnxruntime drops it (32 columns padded by 2, stride
    2: 17 windows, not 18), and so must the loaded graph, or strict shape inference
    refuses the MatMul sized for 17 and the kernels after the pool read the wrong size
    (found by tests/test_fuzz_onnxruntime.py). onnxruntime accepts the model only with the
    pool's output declared at its true shape."""
    pytest.importorskip("onnxruntime")
    b = models.Builder(17)
    x = b.input("x", [1, 8, 1, 32])
    pooled = b.node(op, [x], name="pool", kernel_shape=[1, 3], strides=[2, 2],
                    pads=[0, 2, 0, 2], ceil_mode=1)
    y = b.node("MatMul", [pooled, b.weight(17, 2)])
    model = b.model([pooled, y])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(pooled, models.F32, [1, 8, 1, 17]))
    graph = load_graph(model)
    assert graph.tensors[pooled][0] == (1, 8, 1, 17)
    assert [n.op.kind for n in graph.kernel_nodes] == ["pool2d", "matmul"]
    feeds = models.random_feeds(model)
    models.assert_close(Executor(graph).run(feeds), models.ort_run(model, feeds), [pooled, y])
