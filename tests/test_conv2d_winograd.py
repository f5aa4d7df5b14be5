"""Winograd F(m x m, 3 x 3) conv2d kernels: the transforms, the generated kernels on every
runnable ISA against the float64 reference (plain and pre-packed weights, one and two
threads, grouped convolutions, several chunks of tiles, blocked and NCHW layouts), legality,
and what the tiler proposes."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import bound_weights_problem, sampled

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import WINOGRAD_TILES, Conv2dSchedule
from tunecache.compiler.kinds.conv2d.winograd import transforms, winograd_plan
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, load_kernel, random_inputs, reference
from tunecache.compiler.schedule import problems
from tunecache.tuner.search.roller import candidates

HW = local_spec()
T2 = min(2, HW.cores)
conv = conv2d_op


def block(hw: HardwareSpec) -> int:
    """The channel block of the layouts: whole vectors on every ISA."""
    return max(8, hw.lanes)


def blocked(hw: HardwareSpec, n: int, c: int, h: int, w: int, f: int, pads: object = 1,
            epilogue: str = "bias+relu", groups: int = 1) -> OpSignature:
    layout = f"nchw{block(hw)}c"
    return conv(n, c, h, w, f, 3, 3, pads=pads, epilogue=epilogue,  # type: ignore[arg-type]
                groups=groups, layout=layout, out_layout=layout)


def plain(hw: HardwareSpec, n: int, c: int, h: int, w: int, f: int, pads: object = 1,
          epilogue: str = "bias+relu", groups: int = 1) -> OpSignature:
    """An NCHW layer (in and out): whole vectors of channels per group."""
    return conv(n, c, h, w, f, 3, 3, pads=pads, epilogue=epilogue,  # type: ignore[arg-type]
                groups=groups)


def wino(hw: HardwareSpec, m: int, nv: int, nt: int, threads: int = 1,
         nchw: bool = False) -> Conv2dSchedule:
    return Conv2dSchedule(oc_block=nv * hw.lanes, ow_block=nt, oh_block=m,
                          ic_block=hw.lanes if nchw else block(hw), algorithm="winograd",
                          threads=threads)


@pytest.mark.parametrize("m", WINOGRAD_TILES)
def test_transforms_compute_the_correlation_exactly(m: int) -> None:
    bt, g, at = (np.array(x, dtype=np.float64) for x in transforms(m))
    rng = np.random.default_rng(m)
    d = rng.standard_normal((m + 2, m + 2))
    w = rng.standard_normal((3, 3))
    got = at @ ((g @ w @ g.T) * (bt @ d @ bt.T)) @ at.T
    want = np.array([[np.sum(d[i:i + 3, j:j + 3] * w) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def _cases() -> list[tuple[str, OpSignature, HardwareSpec, Conv2dSchedule]]:
    out = []
    for isa in runnable_isas(HW):
        hw = HW.with_isa(isa)
        x, v = block(hw), hw.lanes
        nv2 = 2 if hw.vector_registers >= 16 else 1
        out += [
            ("residual block, odd map", blocked(hw, 1, 2 * x, 9, 11, 3 * x, epilogue="bias+add+relu"),
             hw, wino(hw, 2, 1, 6)),
            ("m=4, two vectors, F not a multiple of them", blocked(hw, 1, 2 * x, 9, 11, 3 * x),
             hw, wino(hw, 4, nv2, 4, threads=T2)),
            ("batch 2, no padding", blocked(hw, 2, x, 7, 6, 2 * x, pads=0, epilogue="none"),
             hw, wino(hw, 4, 1, 5)),
            ("asymmetric pads", blocked(hw, 1, x, 6, 8, x, pads=(0, 1, 2, 1), epilogue="bias"),
             hw, wino(hw, 2, 1, 3, threads=T2)),
            ("groups 2 (AlexNet), residual", blocked(hw, 1, 4 * x, 7, 9, 2 * x, groups=2,
                                                     epilogue="bias+add+relu"),
             hw, wino(hw, 4, 1, 5, threads=T2)),
            ("groups 3, two vectors over one-block groups", blocked(hw, 1, 3 * x, 6, 6, 3 * x,
                                                                   groups=3),
             hw, wino(hw, 2, nv2, 3)),
            ("nchw residual block, odd map", plain(hw, 1, 2 * v, 9, 11, 3 * v,
                                                   epilogue="bias+add+relu"),
             hw, wino(hw, 4, nv2, 4, threads=T2, nchw=True)),
            ("nchw batch 2, no padding", plain(hw, 2, v, 7, 6, 2 * v, pads=0, epilogue="none"),
             hw, wino(hw, 2, 1, 5, nchw=True)),
            ("nchw groups 2, asymmetric pads", plain(hw, 1, 2 * v, 6, 8, 4 * v, groups=2,
                                                     pads=(0, 1, 2, 1), epilogue="bias"),
             hw, wino(hw, 2, 1, 3, threads=T2, nchw=True)),
            ("several chunks of tiles", blocked(hw, 1, 256, 20, 20, 256), hw,
             wino(hw, 2, 1, 7, threads=T2)),
        ]
    return out


CASES = _cases()


def test_several_chunks_case_really_has_several() -> None:
    _, op, _, s = CASES[-1]
    plan = winograd_plan(op, s)
    assert plan.tiles > plan.chunk
    assert plan.tiles % plan.chunk  # and a partial last chunk


def test_kernels_match_the_reference_on_every_isa() -> None:
    cases = sampled(CASES, hw_at=2)
    failures = []
    for what, op, hw, s in cases:
        assert not problems(op, s, hw), (what, problems(op, s, hw))
        kernel = load_kernel(op, build(generate(op, s, hw)))
        inputs = random_inputs(op, seed=5)
        out = np.full(op.arguments()[-1].shape, np.nan, dtype=np.float32)
        kernel(*inputs, out=out)
        problem = check_result(op, inputs, out, reference(op, inputs))
        problem = problem or bound_weights_problem(kernel, inputs, out)
        if problem:
            failures.append(f"{hw.isa} {what} {op.text} {s}: {problem}")
    assert not failures, "\n".join(failures)


def test_illegal_uses_are_refused_with_the_reason() -> None:
    hw = HW
    ok = blocked(hw, 1, 2 * block(hw), 14, 14, 2 * block(hw))
    assert not problems(ok, wino(hw, 4, 1, 8), hw)
    layout = f"nchw{block(hw)}c"
    stride2 = conv(1, 16, 14, 14, 16, 3, 3, stride=2, pads=1, layout=layout, out_layout=layout)
    assert any("stride 1" in p for p in problems(stride2, wino(hw, 2, 1, 4), hw))
    depthwise = conv(1, 16, 14, 14, 16, 3, 3, pads=1, groups=16, layout=layout,
                     out_layout=layout)
    assert any("not depthwise" in p for p in problems(depthwise, wino(hw, 2, 1, 4), hw))
    x = block(hw)
    odd_groups = conv(1, 2 * x, 14, 14, 2 * x, 3, 3, pads=1, groups=4, layout=layout,
                      out_layout=layout)
    assert any("each group's C and F" in p
               for p in problems(odd_groups, wino(hw, 2, 1, 4), hw))
    one_by_one = conv(1, 16, 14, 14, 16, 1, 1, layout=layout, out_layout=layout)
    assert any("3x3" in p for p in problems(one_by_one, wino(hw, 2, 1, 4), hw))
    v = hw.lanes
    odd_channels = plain(hw, 1, v + 1, 14, 14, v)
    assert any("nchw" in p for p in problems(odd_channels, wino(hw, 2, 1, 4, nchw=True), hw))
    mixed = conv(1, x, 14, 14, x, 3, 3, pads=1, layout="nchw", out_layout=layout)
    assert any("nchw" in p for p in problems(mixed, wino(hw, 2, 1, 4, nchw=True), hw))
    assert not problems(plain(hw, 1, v, 14, 14, v), wino(hw, 2, 1, 4, nchw=True), hw)
    assert any("ic_block" in p for p in problems(plain(hw, 1, 2 * v, 14, 14, v),
                                                 wino(hw, 2, 1, 4).replace(ic_block=2 * v), hw))
    assert any("oh_block=3" in p for p in problems(ok, wino(hw, 2, 1, 4).replace(oh_block=3), hw))
    too_tall = wino(hw, 2, 1, hw.vector_registers)
    assert any("vector registers" in p for p in problems(ok, too_tall, hw))
    assert any("loop_order" in p
               for p in problems(ok, wino(hw, 2, 1, 4).replace(loop_order="pf"), hw))


def test_tiler_proposes_winograd_for_3x3_stride_1_blocked_or_nchw() -> None:
    hw = HW
    layer = blocked(hw, 1, 256, 14, 14, 256)
    found = candidates(layer, hw, k=8, threads=1)
    assert any(c.schedule.algorithm == "winograd" for c in found)
    assert all(not problems(layer, c.schedule, hw) for c in found)
    layout = f"nchw{block(hw)}c"
    strided = conv(1, 256, 14, 14, 256, 3, 3, stride=2, pads=1, layout=layout,
                   out_layout=layout)
    assert all(c.schedule.algorithm != "winograd" for c in candidates(strided, hw, k=8))
    nchw = plain(hw, 1, 256, 14, 14, 256)
    found = candidates(nchw, hw, k=8, threads=1)
    assert any(c.schedule.algorithm == "winograd" for c in found)
    assert all(not problems(nchw, c.schedule, hw) for c in found)
    odd = plain(hw, 1, 3, 32, 32, 64)  # an RGB input: no whole vectors of channels
    assert all(c.schedule.algorithm != "winograd" for c in candidates(odd, hw, k=8))


def test_avx512_kernels_compile() -> None:
    # Not runnable on every host; gcc still checks the AVX-512 spelling (16 lanes, 32
    # registers, grouped and plain, both tile sizes).
    hw = HW.with_isa("avx512")
    op = blocked(hw, 1, 64, 14, 14, 64, groups=2, epilogue="bias+add+relu")
    for m, nv, nt in ((4, 2, 12), (2, 1, 28)):
        s = wino(hw, m, nv, nt, threads=T2)
        assert not problems(op, s, hw)
        assert build(generate(op, s, hw)).path.exists()
    nchw = plain(hw, 1, 64, 14, 14, 64, epilogue="bias+add+relu")
    s = wino(hw, 4, 2, 12, threads=T2, nchw=True)
    assert not problems(nchw, s, hw)
    assert build(generate(nchw, s, hw)).path.exists()


def test_the_pool_holds_short_four_vector_tiles_where_the_layer_has_the_channels() -> None:
    from tunecache.tuner.kinds.conv2d import KIND

    hw = HW
    wide = blocked(hw, 1, 64, 56, 56, 64)
    pool = [s for s in KIND.pool(wide, hw, 1) if s.algorithm == "winograd"]
    assert all(not problems(wide, s, hw) for s in pool)
    four = [s for s in pool if s.oc_block == 4 * hw.lanes]
    assert four and all(s.ow_block * 4 + 4 + 1 <= hw.vector_registers for s in four)
    narrow = blocked(hw, 1, 64, 56, 56, 2 * hw.lanes)
    assert all(s.oc_block <= 2 * hw.lanes for s in KIND.pool(narrow, hw, 1)
               if s.algorithm == "winograd")
