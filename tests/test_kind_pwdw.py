"""The ``pwdw`` kind (a 1x1 conv fused with the depthwise conv reading it) and the pair fusion
that forms it in compiled models: real kernels against the float64 reference, the weights
packed once, every schedule variant on every ISA level the machine runs, the illegal
schedules, and whole models against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import (
    bound_weights_problem,
    build_all,
    cached_kernel,
    poisoned_run_problem,
    sampled,
)

from tunecache.compiler.fusion import fuse_pairs, fused_op
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.pwdw import (
    PwdwSchedule,
    default_pwdw_schedule,
    depthwise_part,
    pointwise_part,
    pwdw_op,
    pwdw_problems,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs
from tunecache.costmodel.analytic import estimate
from tunecache.tuner.search.roller import candidates

HW = local_spec()
T2 = min(2, HW.cores)
Case = tuple[OpSignature, PwdwSchedule, HardwareSpec]


def _ops(x: int) -> list[OpSignature]:
    b = f"nchw{x}c"
    return [
        # MobileNet-v2's stride-2 expansion, small: blocked input, bias + ReLU6 on both halves.
        pwdw_op(1, 16, 13, 17, 3 * x, 3, 3, stride=2, pads=1, pw_epilogue="bias+clip6",
                epilogue="bias+clip6", layout=b, out_layout=b),
        # A plain input of channels that are not whole blocks, two images, stride 1.
        pwdw_op(2, 5, 9, 11, 2 * x, 3, 3, pads=1, pw_epilogue="relu", epilogue="bias",
                layout="nchw", out_layout=b),
        # A blocked input whose last block is partial, a 5x5 window with asymmetric pads.
        pwdw_op(1, x + 3, 8, 7, x, 5, 5, pads=(2, 1, 2, 3), pw_epilogue="none",
                epilogue="silu", layout=b, out_layout=b),
        # Dilation, a stride that differs by axis, no padding.
        pwdw_op(1, 4, 12, 10, x, 3, 3, stride=(1, 2), dilation=2, pw_epilogue="bias+silu",
                layout="nchw", out_layout=b),
    ]


def _variants(op: OpSignature, hw: HardwareSpec) -> list[PwdwSchedule]:
    base = default_pwdw_schedule(op, hw, 1)
    return [base,
            base.replace(threads=T2, parallel="pixel", band_tiles=1),
            base.replace(threads=T2, parallel="oc", band_tiles=2, oh_block=2, ow_block=3,
                         pw_block=4),
            base.replace(band_tiles=3, ow_block=2, pw_block=3),
            # Two of Y's channel blocks per band (legal where F is a whole number of them).
            base.replace(band_blocks=2, ow_block=2, oh_block=2, pw_block=3, band_tiles=2),
            base.replace(band_blocks=2, ow_block=3, oh_block=1, pw_block=2, band_tiles=1,
                         threads=T2, parallel="pixel")]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for isa in runnable_isas(HW):
        hw = HW.with_isa(isa)
        for x in (8, 16):
            if x % hw.lanes:
                continue
            for op in _ops(x):
                cases += [(op, s, hw) for s in _variants(op, hw) if not pwdw_problems(op, s, hw)]
    return cases


def test_every_variant_matches_the_reference_and_prepacked_weights() -> None:
    """Per case: the result within the float32 tolerance of the float64 reference (with
    poisoned output and workspace), and W1 packed once giving the same bits."""
    cases = sampled(_cases())
    assert len(cases) >= 16
    assert any(s.band_blocks == 2 for _, s, _ in _cases())
    build_all(cases)
    for i, (op, s, hw) in enumerate(cases):
        kernel = cached_kernel(op, s, hw)
        inputs = random_inputs(op, seed=11)
        problem = poisoned_run_problem(kernel, op, inputs, offset=i % 3)
        if problem is None:
            problem = bound_weights_problem(kernel, inputs, kernel(*inputs))
        assert problem is None, f"{hw.isa} {op.text} {s}: {problem}"


def test_the_fused_op_equals_its_two_convolutions() -> None:
    """The reference is the 1x1 conv then the depthwise conv, each as conv2d computes it."""
    from tunecache.compiler.runtime import reference

    op = _ops(16)[1]
    x, w1, w2, b2 = (a.astype(np.float64) for a in random_inputs(op, seed=2))
    expanded = reference(pointwise_part(op), (x, w1))
    want = reference(depthwise_part(op), (expanded, w2, b2))
    np.testing.assert_allclose(reference(op, (x, w1, w2, b2)), want, rtol=1e-12)


def test_illegal_schedules_and_signatures_are_refused() -> None:
    op = _ops(16)[0]
    hw = HW.with_isa("avx2") if "avx2" in runnable_isas(HW) else HW
    found = pwdw_problems(op, PwdwSchedule(ow_block=30, oh_block=2, pw_block=40, band_tiles=1,
                                           parallel="rows"), hw)
    assert any("depthwise tile" in f for f in found)
    assert any("pointwise tile" in f for f in found)
    assert any("parallel='rows'" in f for f in found)
    # F = 48 is three 16-channel blocks: not a whole number of two-block bands.
    pair = PwdwSchedule(ow_block=2, oh_block=1, pw_block=2, band_blocks=2)
    assert any("whole number of bands of 32" in f for f in pwdw_problems(op, pair, hw))
    assert any("band_blocks must be at least 1" in f
               for f in pwdw_problems(op, pair.replace(band_blocks=0), hw))
    big = pwdw_op(1, 8, 8, 4000, 16, 3, 3, pads=1, layout="nchw16c", out_layout="nchw16c")
    assert any("band" in f for f in pwdw_problems(big, PwdwSchedule(4, 4, band_tiles=8), hw))
    with pytest.raises(ValueError, match="whole 16-channel blocks"):
        pwdw_op(1, 8, 8, 8, 24, 3, 3, layout="nchw", out_layout="nchw16c")
    with pytest.raises(ValueError, match="block channels differently"):
        pwdw_op(1, 8, 8, 8, 16, 3, 3, layout="nchw8c", out_layout="nchw16c")


def test_signature_errors_and_layouts_it_cannot_take() -> None:
    with pytest.raises(ValueError, match="more than one activation"):
        pwdw_op(1, 8, 8, 8, 16, 3, 3, epilogue="relu+clip6", layout="nchw16c")
    with pytest.raises(ValueError, match="dilated to 5"):
        pwdw_op(1, 8, 3, 8, 16, 3, 3, dilation=2, layout="nchw16c")
    with pytest.raises(ValueError, match="expected one of nchw16c, nchw8c"):
        pwdw_op(1, 8, 8, 8, 16, 3, 3, out_layout="nchw")
    from tunecache.compiler.kinds import op_kind

    relayout = op_kind("pwdw").relayout
    assert relayout is not None
    op = _ops(16)[0]
    assert relayout(op, "nchw", "nchw") is None  # the output must be blocked
    assert relayout(op, "nchw8c", "nchw16c") is None  # one block size
    assert relayout(op, "nchw", "nchw16c") == pwdw_op(
        1, 16, 13, 17, 48, 3, 3, stride=2, pads=1, pw_epilogue="bias+clip6",
        epilogue="bias+clip6", layout="nchw", out_layout="nchw16c")


def test_the_tiler_proposes_legal_candidates_with_distinct_estimates() -> None:
    block = f"nchw{HW.lanes}c" if HW.lanes in (8, 16) else "nchw16c"  # as a model plans it
    op = pwdw_op(1, 16, 112, 112, 96, 3, 3, stride=2, pads=1, pw_epilogue="bias+clip6",
                 epilogue="bias+clip6", layout=block, out_layout=block)
    top = candidates(op, HW, k=10, threads=1)
    assert len(top) >= 5 and all(not pwdw_problems(op, c.schedule, HW) for c in top)
    crowded = PwdwSchedule(ow_block=14, oh_block=2, pw_block=14, band_tiles=4)
    if HW.vector_registers == 32:  # 28 accumulators crowd 32 registers, not 16 of 16
        assert estimate(op, crowded, HW).seconds > top[0].estimate.seconds


# -- the pair fusion ---------------------------------------------------------------------------


def test_the_pair_rule_fuses_only_a_plain_1x1_into_a_depthwise_reader() -> None:
    b = "nchw16c"
    pw = conv2d_op(1, 24, 14, 14, 96, 1, 1, epilogue="bias+clip6", layout="nchw", out_layout=b)
    dw = conv2d_op(1, 96, 14, 14, 96, 3, 3, stride=2, pads=1, groups=96, epilogue="bias",
                   layout=b, out_layout=b)
    assert fused_op(pw, dw) == pwdw_op(1, 24, 14, 14, 96, 3, 3, stride=2, pads=1,
                                       pw_epilogue="bias+clip6", epilogue="bias",
                                       layout="nchw", out_layout=b)
    strided = conv2d_op(1, 24, 14, 14, 96, 1, 1, stride=2, out_layout=b)
    residual = conv2d_op(1, 24, 14, 14, 96, 1, 1, epilogue="add", out_layout=b)
    plain_out = conv2d_op(1, 24, 14, 14, 96, 1, 1)
    dense = conv2d_op(1, 96, 14, 14, 96, 3, 3, pads=1, layout=b, out_layout=b)
    for first, second in ((strided, dw), (residual, dw), (plain_out, dw), (pw, dense),
                          (dw, dw)):
        assert fused_op(first, second) is None


def _inverted_residual(shared: bool) -> object:
    """stem 3x3 -> expand 1x1 + ReLU6 -> depthwise 3x3/2 + ReLU6 -> project 1x1; with
    ``shared`` the expanded tensor is also a graph output (then it must be stored)."""
    from onnx_support import Builder

    b = Builder(13, seed=4)
    x = b.input("x", [1, 3, 15, 14])
    s = b.node("Relu", [b.conv(x, 3, 16, 3, bias=True, name="stem")], name="stem_relu")
    e = b.clip(b.conv(s, 16, 48, 1, pad=0, bias=True, name="expand"), 0.0, 6.0)
    t = b.clip(b.conv(e, 48, 48, 3, stride=2, groups=48, bias=True, name="dw"), 0.0, 6.0)
    y = b.conv(t, 48, 16, 1, pad=0, name="project")
    return b.model([y, e] if shared else [y], "inverted_residual")


@pytest.mark.parametrize("shared", [False, True])
def test_compiled_models_fuse_the_pair_and_equal_onnxruntime(tmp_path, shared: bool) -> None:
    pytest.importorskip("onnxruntime")
    from onnx_support import compile_and_compare

    compiled = compile_and_compare(_inverted_residual(shared), tmp_path)
    kinds = [e.op.kind for e in compiled.plan]
    if compiled.graph.kernel_nodes[0].op.attr("out_layout") == "nchw":
        pytest.skip("no blocked layout on this machine: nothing to fuse")
    assert kinds.count("pwdw") == (0 if shared else 1), kinds
    if not shared:
        fused = next(e for e in compiled.plan if e.op.kind == "pwdw")
        assert fused.node == "expand+dw"


@pytest.mark.parametrize("isa", [i for i in runnable_isas(HW) if i in ("avx2", "avx512")])
def test_every_blocked_isa_runs_the_fused_model(isa: str, tmp_path) -> None:
    """Compiled for each ISA level with a blocked layout (nchw8c on AVX2, nchw16c on
    AVX-512), the model has its pwdw node and equals onnxruntime."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx_support import assert_close, ort_run, random_feeds

    from tunecache.cache.store import Store
    from tunecache.tuner.deploy import compile_model

    model = _inverted_residual(False)
    onnx.save(model, str(tmp_path / "m.onnx"))
    compiled = compile_model(tmp_path / "m.onnx", store=Store(tmp_path / "store"),
                             policy="analytic", hw=HW.with_isa(isa))
    [fused] = [e for e in compiled.plan if e.op.kind == "pwdw"]
    assert fused.op.attr("out_layout") == f"nchw{HW.with_isa(isa).lanes}c"
    feeds = random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])


def test_fuse_pairs_leaves_a_graph_without_pairs_alone() -> None:
    from tunecache.compiler.frontend import load_graph
    from tunecache.compiler.layout_plan import plan_layouts

    graph = plan_layouts(load_graph(_inverted_residual(True)), HW).graph
    fused, count = fuse_pairs(graph)
    assert count == 0 and fused is graph
