"""Layout planning (compiler/layout_plan.py): which activations stay channel-blocked
between kernels, where plain copies are made, and that compiled models planned that way
still equal onnxruntime (real kernels)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_support import Builder, assert_close, ort_run, random_feeds  # noqa: E402

from tunecache.cache.store import Store  # noqa: E402
from tunecache.compiler.frontend import kernel_ops, load_graph  # noqa: E402
from tunecache.compiler.graph import Graph, KernelNode  # noqa: E402
from tunecache.compiler.hardware import HardwareSpec, local_spec  # noqa: E402
from tunecache.compiler.layout_plan import blocked_layout, plan_layouts  # noqa: E402
from tunecache.tuner.deploy import compile_model  # noqa: E402
from tunecache.tuner.jobs import model_workloads  # noqa: E402

AVX2 = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=2, l1d_bytes=32 << 10,
                    l2_bytes=512 << 10, l3_bytes=32 << 20, cpu_model="test")
LOCAL = local_spec()
C = 16
"""Channels filling whole blocks on every ISA with a blocked layout (8 or 16 lanes)."""


def _layouts(graph: Graph) -> dict[str, tuple[str, ...]]:
    """Each kernel node's layout attributes, by node name."""
    return {n.name: tuple(v for k, v in n.op.attrs if v.startswith("nchw"))
            for n in graph.kernel_nodes}


def _matches_onnxruntime(model: onnx.ModelProto, tmp_path: Path) -> None:
    """Compile ``model`` (analytic schedules, planned layouts) and compare with onnxruntime."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic",
                             record_wanted=False)
    feeds = random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])


def _chain() -> onnx.ModelProto:
    """conv -> relu -> maxpool -> conv (+ residual) -> relu -> global pool -> flatten -> gemm."""
    b = Builder(13, seed=3)
    x = b.input("x", [1, 3, 12, 12])
    y = b.node("Relu", [b.conv(x, 3, C, 3, name="stem")], name="stem_relu")
    y = b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2], name="pool")
    t = b.node("Relu", [b.conv(y, C, C, 3, name="c1")], name="c1_relu")
    t = b.conv(t, C, C, 1, pad=0, name="c2")
    y = b.node("Relu", [b.node("Add", [t, y], name="res")], name="res_relu")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y], name="gap")], axis=1)
    logits = b.node("Gemm", [y, b.weight(5, C), b.const(np.zeros(5, np.float32))], transB=1,
                    name="fc")
    return b.model([logits], "chain")


def test_a_conv_chain_stays_blocked_from_the_stem_to_the_pool() -> None:
    graph = load_graph(_chain())
    plan = plan_layouts(graph, AVX2)
    layouts = _layouts(plan.graph)
    assert plan.layout == "nchw8c" and plan.reorders == 0
    assert layouts["stem"] == ("nchw", "nchw8c")  # the image is read plain, written blocked
    assert layouts["pool"] == ("nchw8c",)
    assert layouts["c1"] == layouts["c2"] == ("nchw8c", "nchw8c")
    assert layouts["gap"] == ("nchw8c",)  # one pixel per channel: Flatten reads it as is
    assert layouts["fc"] == ()
    # the graph is otherwise the same: one kernel per node, the same tensors
    assert [n.name for n in plan.graph.kernel_nodes] == [n.name for n in graph.kernel_nodes]
    assert [n.output for n in plan.graph.kernel_nodes] == [n.output for n in graph.kernel_nodes]


def test_a_plain_reader_gets_one_reorder_and_a_4d_output_is_converted_back(
        tmp_path: Path) -> None:
    b = Builder(13, seed=4)
    x = b.input("x", [1, C, 8, 8])
    y = b.node("Relu", [b.conv(x, C, C, 3, name="a")], name="a_relu")
    # two kinds of plain reader: a numpy op (Sin; LeakyRelu, once one, is now a kernel) and
    # a graph output
    side = b.node("Sin", [y], name="sine")
    z = b.conv(y, C, C, 3, name="b")
    model = b.model([side, z, y], "readers")
    plan = plan_layouts(load_graph(model), AVX2)
    reorders = [n for n in plan.graph.kernel_nodes if n.op.kind == "reorder"]
    # one copy of a's output serves both plain readers; b, read by nothing blocked, writes
    # its output plain itself
    assert plan.reorders == len(reorders) == 1
    assert reorders[0].output == "a_relu_out" and reorders[0].inputs == ("a_relu_out@nchw8c",)
    assert _layouts(plan.graph)["b"] == ("nchw8c", "nchw")

    _matches_onnxruntime(model, tmp_path)


def test_a_conv_after_a_narrow_grouped_conv_reads_a_blocked_copy(tmp_path: Path) -> None:
    """ResNeXt's layer 1: the grouped conv's groups (4 channels) are narrower than a block,
    so it writes plain; the 1x1 conv after it reads a blocked copy made by one reorder
    rather than gathering channels a plane apart."""
    b = Builder(13, seed=5)
    x = b.input("x", [1, C, 24, 24])  # 36 KiB: past BLOCKED_COPY_MIN_BYTES
    a = b.node("Relu", [b.conv(x, C, C, 1, pad=0, name="a")], name="a_relu")
    g = b.node("Relu", [b.conv(a, C, C, 3, groups=C // 4, name="grouped")], name="g_relu")
    model = b.model([b.conv(g, C, C, 1, pad=0, name="after")], "narrow_groups")
    plan = plan_layouts(load_graph(model), AVX2)
    layouts = _layouts(plan.graph)
    assert layouts["grouped"] == ("nchw", "nchw") and layouts["after"] == ("nchw8c", "nchw")
    (copy,) = [n for n in plan.graph.kernel_nodes if n.op.kind == "reorder"]
    assert (copy.op.attr("src"), copy.op.attr("dst")) == ("nchw", "nchw8c")
    assert copy.inputs == ("g_relu_out",)
    assert plan.graph.kernel_nodes[-1].inputs[0] == copy.output
    _matches_onnxruntime(model, tmp_path)


def test_channels_that_do_not_fill_blocks_stay_plain() -> None:
    b = Builder(13)
    x = b.input("x", [1, 3, 8, 8])
    y = b.conv(b.node("Relu", [b.conv(x, 3, 12, 3, name="a")]), 12, 12, 3, name="b")
    plan = plan_layouts(load_graph(b.model([y])), AVX2)
    assert not plan.blocked and plan.reorders == 0
    assert set(_layouts(plan.graph).values()) == {("nchw", "nchw")}


def test_a_channel_concat_of_blocked_branches_stays_blocked(tmp_path: Path) -> None:
    b = Builder(13, seed=5)
    x = b.input("x", [1, 3, 10, 10])
    y = b.node("Relu", [b.conv(x, 3, C, 3, name="stem")])
    left = b.conv(y, C, C, 1, pad=0, name="left")
    right = b.conv(y, C, 2 * C, 3, name="right")
    cat = b.node("Concat", [left, right], axis=1, name="cat")
    out = b.conv(cat, 3 * C, C, 1, pad=0, name="after")
    model = b.model([out], "fire")
    plan = plan_layouts(load_graph(model), LOCAL)
    if blocked_layout(LOCAL) is None:
        pytest.skip("this machine's vectors have no blocked layout")
    layouts = _layouts(plan.graph)
    assert layouts["left"][1] == layouts["right"][1] == layouts["after"][0] == plan.layout
    assert "cat_out" in plan.blocked
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic",
                             record_wanted=False)
    feeds = random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [out])


def _gated(b: Builder, operand: np.ndarray) -> str:
    x = b.input("x", [1, C, 8, 8])
    y = b.conv(x, C, C, 3, name="a")
    y = b.node("Mul", [y, b.const(operand)], name="scale")
    return b.conv(y, C, C, 3, name="b")


def test_a_per_channel_elementwise_op_reads_blocked_tensors(tmp_path: Path) -> None:
    """A Mul by a [1, C, 1, 1] tensor (a squeeze-excitation gate) is a column operand: on
    blocked activations it becomes a ``col8`` operand, so nothing is converted around it;
    compiled, the model still equals onnxruntime."""
    b = Builder(13)
    scale = np.arange(1, C + 1, dtype=np.float32).reshape(1, C, 1, 1)
    model = b.model([_gated(b, scale)])
    plan = plan_layouts(load_graph(model), AVX2)
    layouts = _layouts(plan.graph)
    assert layouts["a"] == ("nchw", "nchw8c") and layouts["b"][0] == "nchw8c"
    assert plan.reorders == 0
    gate = next(n.op for n in plan.graph.kernel_nodes if n.op.kind == "elementwise")
    assert gate.attr("operand") == "col8" and gate.dims_dict == {"M": C // 8, "N": 64 * 8}
    path = tmp_path / "gated.onnx"
    onnx.save(model, path)
    feeds = random_feeds(model)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic",
                             record_wanted=False)
    assert any(n.op.kind == "elementwise" and n.op.attr("operand").startswith("col")
               and n.op.attr("operand") != "col" for n in compiled.graph.kernel_nodes) == bool(
        blocked_layout(LOCAL))
    assert_close(compiled.run(feeds), ort_run(model, feeds), [model.graph.output[0].name])


def test_a_per_width_elementwise_op_keeps_its_tensors_plain() -> None:
    """A Mul by a [1, 1, 1, W] tensor broadcasts along rows of the plain [N*C, H*W] view,
    which a blocked tensor does not have: its input is written plain rather than converted."""
    b = Builder(13)
    scale = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 1, 8)
    plan = plan_layouts(load_graph(b.model([_gated(b, scale)])), AVX2)
    assert _layouts(plan.graph)["a"] == ("nchw", "nchw") and plan.reorders == 0


def test_no_blocked_layout_without_whole_vector_blocks() -> None:
    generic = replace(AVX2, isa="generic", vector_bits=128)
    graph = load_graph(_chain())
    assert blocked_layout(generic) is None
    assert plan_layouts(graph, generic).graph is graph


def test_the_compiled_chain_equals_onnxruntime_in_both_layouts(tmp_path: Path) -> None:
    model = _chain()
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    feeds = random_feeds(model)
    expected = ort_run(model, feeds)
    ops = {}
    for blocked in (True, False):
        compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic",
                                 record_wanted=False, blocked_layouts=blocked)
        assert_close(compiled.run(feeds), expected, ["fc_out"])
        ops[blocked] = {e.op.text for e in compiled.plan}
    assert not any("nchw8c" in t or "nchw16c" in t for t in ops[False])
    if blocked_layout(LOCAL) is not None:
        assert any(blocked_layout(LOCAL) in t for t in ops[True])


def test_a_model_at_two_threads_splits_each_direct_conv_as_its_data_lies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled for two threads, every dense direct conv on a blocked activation runs the
    thread split ``local_axis`` names, whatever split the served or guessed schedule had
    (here the policy's decisions come with the other split, as a cached entry tuned before
    the rule could), and the model still equals onnxruntime."""
    from tunecache.compiler.kinds.conv2d.space import local_axis
    from tunecache.tuner.deploy import compile as compile_module

    decide = compile_module.Policy.decide

    def other_split(self, op, *args, **kwargs):  # type: ignore[no-untyped-def]
        decision = decide(self, op, *args, **kwargs)
        s = decision.schedule
        if local_axis(op, 2) and s is not None and s.algorithm == "direct":
            s = s.replace(parallel="oc" if s.parallel == "pixel" else "pixel")
        return replace(decision, schedule=s)

    monkeypatch.setattr(compile_module.Policy, "decide", other_split)

    b = Builder(13, seed=4)
    x = b.input("x", [1, 3, 56, 56])
    y = b.node("Relu", [b.conv(x, 3, 4 * C, 3, name="stem")], name="stem_relu")
    y = b.node("Relu", [b.conv(y, 4 * C, 4 * C, 1, pad=0, name="wide")], name="wide_relu")
    model = b.model([b.conv(y, 4 * C, 4 * C, 3, name="out")], "wide")
    path = tmp_path / "wide.onnx"
    onnx.save(model, path)
    feeds = random_feeds(model)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic",
                             record_wanted=False, hw=replace(LOCAL, cores=2))
    assert_close(compiled.run(feeds), ort_run(model, feeds), [model.graph.output[0].name])
    placed = [(e.op, e.schedule) for e in compiled.plan
              if e.op.kind == "conv2d" and e.schedule is not None
              and e.schedule.algorithm == "direct" and e.schedule.threads == 2]
    for op, s in placed:
        assert local_axis(op, 2) in (None, s.parallel)
    if blocked_layout(LOCAL) is not None:
        assert any(local_axis(op, 2) for op, _ in placed)
        assert any("as it runs in a model" in e.reason for e in compiled.plan)


def test_tuning_a_model_tunes_the_ops_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(_chain(), path)
    planned = {op for op, _, _ in kernel_ops(path, hw=AVX2)}
    assert planned == {n.op for n in plan_layouts(load_graph(path), AVX2).graph.kernel_nodes}
    assert {w.op for w in model_workloads(path, AVX2)} == planned
    assert planned != {op for op, _, _ in kernel_ops(path)}  # without hw: the plain ops


def test_planned_kernel_nodes_keep_their_logical_shapes() -> None:
    plan = plan_layouts(load_graph(_chain()), AVX2)
    for node in plan.graph.kernel_nodes:
        assert isinstance(node, KernelNode)
        produced = next(a.shape for a in node.op.arguments() if a.role == "output")
        assert np.prod(produced) == np.prod(node.output_shape)
