"""Channel-blocked activation layouts (``nchw{x}c``): conv2d, pool2d and reorder kernels on
blocked inputs and outputs against the float64 references, chains of blocked kernels against
the NCHW chain, the signatures' text (old op texts unchanged), the schedules blocked layouts
refuse, and AVX-512 code for a pinned spec compiled by gcc.

Kernels run on the host ISA, with NaN-poisoned, misaligned outputs (an unwritten element,
padding lanes included, fails the check)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
from kernel_support import (
    FULL,
    bound_weights_problem,
    build_all,
    cached_kernel,
    poisoned_run_problem,
)

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.hardware import HardwareSpec, isa_levels, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import conv2d_op, nchw_conv2d
from tunecache.compiler.kinds.conv2d.direct_plan import CHUNK_MIN_REGISTERS
from tunecache.compiler.kinds.conv2d.space import (
    Conv2dSchedule,
    default_conv2d_schedule,
    direct_tile,
    flat_pixels,
    pixel_grid,
)
from tunecache.compiler.kinds.layouts import (
    from_blocked,
    layout_problems,
    random_tensor,
    tensor_shape,
    to_blocked,
)
from tunecache.compiler.kinds.pool2d import Pool2dSchedule, global_pool2d_op, pool2d_op
from tunecache.compiler.kinds.reorder import reorder_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs, reference
from tunecache.compiler.schedule import ScheduleData, default_schedule, problems
from tunecache.costmodel.analytic import estimate
from tunecache.tuner.kinds import tuner_kind

HW = local_spec()
T2 = min(2, HW.cores)
# Blocks this machine's kernels can use: a whole number of vectors (8 and 16 on AVX2).
BLOCKS = [x for x in (8, 16) if x % HW.lanes == 0]
Case = tuple[OpSignature, ScheduleData, HardwareSpec]


def _layouts(x: int) -> list[tuple[str, str]]:
    b = f"nchw{x}c"
    return [(b, b), ("nchw", b), (b, "nchw")]


def _sampled(cases: list[Case], x: int) -> list[Case]:
    """All cases for the block of one vector; one in six for wider blocks (the same loops
    over more vectors), unless ``TUNECACHE_TEST_FULL=1``."""
    return cases if FULL or x == HW.lanes else cases[::6]


def _check(cases: list[Case]) -> None:
    build_all(cases)
    for i, (op, s, hw) in enumerate(cases):
        kernel = cached_kernel(op, s, hw)
        inputs = random_inputs(op, seed=5)
        problem = poisoned_run_problem(kernel, op, inputs, offset=i % 3)
        if problem is None and kernel.prepacks_weights:
            problem = bound_weights_problem(kernel, inputs, kernel(*inputs))
        assert problem is None, f"{hw.isa} {op.text} {s}: {problem}"


# -- layouts and signatures ---------------------------------------------------------------


def test_to_and_from_blocked_round_trip_with_zero_padding() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 21, 3, 5))
    b = to_blocked(x, 8)
    assert b.shape == (2, 3, 3, 5, 8) == tensor_shape(2, 21, 3, 5, "nchw8c")
    assert b[0, 1, 2, 4, 3] == x[0, 11, 2, 4]
    assert not b[:, 2, :, :, 5:].any()  # channels 21..23
    np.testing.assert_array_equal(from_blocked(b, 21), x)
    assert tensor_shape(2, 21, 3, 5, "nchw") == (2, 21, 3, 5)
    # nchw draws exactly what every kind's default draw gives, blocked ones pad with zeros
    assert np.array_equal(random_tensor(np.random.default_rng(1), 1, 3, 2, 2, "nchw"),
                          np.random.default_rng(1).standard_normal((1, 3, 2, 2), dtype=np.float32))
    assert not random_tensor(rng, 1, 3, 2, 2, "nchw16c")[..., 3:].any()


def test_old_op_texts_print_and_hash_unchanged() -> None:
    conv = OpSignature.parse("conv2d(N=1,C=64,H=56,W=56,F=64,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,"
                             "pad_r=1,epilogue=bias+relu)")
    assert conv.text.endswith(",dtype=float32,layout=nchw,epilogue=bias+relu)")
    assert conv.op_id == "ea0be8a807da03da"  # the op id before layouts existed
    pool = OpSignature.parse("pool2d(N=1,C=64,H=112,W=112,R=3,S=3,mode=max)")
    assert "layout" not in pool.text and pool.attr("layout") == "nchw"
    blocked = conv2d_op(1, 64, 56, 56, 64, 3, 3, pads=1, layout="nchw8c", out_layout="nchw8c")
    assert "layout=nchw8c,out_layout=nchw8c," in blocked.text
    assert OpSignature.parse(blocked.text) == blocked and blocked.op_id != conv.op_id
    assert [a.shape for a in blocked.arguments()] == [(1, 8, 56, 56, 8), (64, 64, 3, 3),
                                                     (1, 8, 56, 56, 8)]
    assert nchw_conv2d(blocked) == conv2d_op(1, 64, 56, 56, 64, 3, 3, pads=1)
    stem = conv2d_op(1, 3, 9, 9, 36, 3, 3, out_layout="nchw16c", epilogue="add")
    assert [a.shape for a in stem.arguments()] == [(1, 3, 9, 9), (36, 3, 3, 3),
                                                  (1, 3, 7, 7, 16), (1, 3, 7, 7, 16)]
    pool_b = pool2d_op(1, 20, 8, 8, 2, 2, layout="nchw16c")
    assert pool_b.text.endswith("mode=max,layout=nchw16c,epilogue=none)")
    assert pool_b.arguments()[-1].shape == (1, 2, 7, 7, 16)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: conv2d_op(1, 8, 4, 4, 8, 1, 1, layout="nchw8c", out_layout="nchw16c"),
     "block channels differently"),
    (lambda: conv2d_op(1, 8, 4, 4, 8, 1, 1, layout="nchw4c"), "expected one of nchw, nchw8c"),
    (lambda: reorder_op(1, 8, 4, 4, src="nchw8c", dst="nchw8c"), "src and dst are both"),
    (lambda: OpSignature.parse("reorder(N=1,C=3,H=4,W=4)"), "src and dst are both nchw"),
])
def test_bad_layouts_are_refused(make: Callable[[], OpSignature], message: str) -> None:
    with pytest.raises(OpSignatureError, match=message):
        make()


def test_schedules_blocked_layouts_refuse() -> None:
    hw = HW.with_isa("avx2")
    op = conv2d_op(1, 32, 8, 8, 32, 3, 3, pads=1, layout="nchw8c", out_layout="nchw8c")
    gemm = Conv2dSchedule(oc_block=6, ow_block=16, ic_block=8, algorithm="gemm")
    assert any("algorithm=gemm reads and writes nchw only" in m for m in problems(op, gemm, hw))
    wrong_ic = default_conv2d_schedule(op, hw).replace(ic_block=16)
    assert problems(op, wrong_ic, hw) == [
        "ic_block=16 must be 8, the channel block of layout=nchw8c (the input is read in place)"]
    dw = conv2d_op(1, 32, 8, 8, 32, 3, 3, pads=1, groups=32, layout="nchw8c")
    plane = Conv2dSchedule(oc_block=8, ow_block=8, ic_block=1, pack_w=0)
    assert any("plane kernel (pack_w=0) reads and writes nchw" in m
               for m in problems(dw, plane, hw))
    wide = Conv2dSchedule(oc_block=16, ow_block=4, ic_block=1)
    assert any("oc_block=16 must divide the 8-channel blocks" in m for m in problems(dw, wide, hw))
    avx512 = HW.with_isa("avx512")
    assert layout_problems(("nchw8c",), avx512) == [
        "layout nchw8c needs avx512 vectors that divide its 8-channel blocks (16 lanes do not); "
        "use nchw16c on avx512"]
    assert problems(op, default_conv2d_schedule(op, avx512), avx512)
    pool = pool2d_op(1, 16, 8, 8, 3, 3, layout="nchw8c")
    found = problems(pool, Pool2dSchedule(ow_block=16, rows=4, nt=1), hw)
    assert len(found) == 3 and all("does not apply to layout=nchw8c" in m for m in found)
    for bad in (op, dw, pool):
        assert not problems(bad, default_schedule(bad, hw, 2), hw)


# -- kernels ----------------------------------------------------------------------------------


def _conv_ops(x: int) -> list[OpSignature]:
    ops = []
    for layout, out in _layouts(x):
        conv = partial(conv2d_op, layout=layout, out_layout=out)
        ops += [
            conv(1, 16, 10, 9, 16, 3, 3, pads=1, epilogue="bias+relu"),  # 3x3 pad 1
            conv(2, 16, 11, 10, 24, 3, 3, stride=2, pads=1, epilogue="bias"),
            conv(1, 32, 7, 7, 24, 1, 1, epilogue="bias+add+relu"),  # 1x1 with a residual
            conv(1, 24, 9, 11, 36, 3, 3, pads=1, epilogue="bias+add+relu"),  # C, F % x != 0
            conv(1, 40, 9, 9, 40, 3, 3, pads=1, groups=40, epilogue="bias+relu"),  # depthwise
            conv(1, 24, 12, 12, 24, 3, 3, stride=2, pads=(1, 0, 1, 1), groups=24,
                 epilogue="bias+add"),  # depthwise, asymmetric padding
            conv(2, 24, 11, 10, 24, 3, 3, stride=2, pads=2, dilation=2, groups=24,
                 epilogue="bias"),  # depthwise, two images, dilated
            conv(1, 24, 8, 8, 36, 3, 3, pads=1, groups=2, epilogue="bias+add+relu"),  # grouped
            conv(1, 32, 8, 8, 48, 3, 3, pads=1, groups=2, epilogue="bias"),  # groups on blocks
            conv(1, 32, 6, 6, 32, 1, 1, groups=2, epilogue="relu"),  # ... read in place
        ]
    # the stem: an NCHW image with 3 channels into blocked activations
    ops.append(conv2d_op(1, 3, 23, 23, 20, 7, 7, stride=2, pads=3, epilogue="bias+relu",
                         out_layout=f"nchw{x}c"))
    ops.append(conv2d_op(1, 3, 12, 12, 20, 3, 3, pads=1, layout=f"nchw{x}c"))  # C < x
    return ops


@pytest.mark.parametrize("x", BLOCKS)
def test_conv2d_blocked_default_schedules(x: int) -> None:
    _check(_sampled([(op, default_conv2d_schedule(op, HW, t), HW)
                     for op in _conv_ops(x) for t in sorted({1, T2})], x))


@pytest.mark.parametrize("x", BLOCKS)
def test_conv2d_blocked_tiles(x: int) -> None:
    """Tiles of one and two vectors (wider and narrower than a block), tail tiles in both
    directions, both loop orders, the kernel-width loop unrolled, threads over pixels."""
    cases: list[Case] = []
    for i, op in enumerate(_conv_ops(x)):
        base = default_conv2d_schedule(op, HW, T2)
        for nv, ow, oh in ((1, 4, 2), (2, 3, 1)):
            s = base.replace(oc_block=nv * HW.lanes, ow_block=ow, oh_block=oh,
                             loop_order="pf" if i % 2 else "fp", unroll_kw=i % 2,
                             parallel="pixel" if i % 3 == 0 else "oc")
            if not problems(op, s, HW):
                cases.append((op, s, HW))
    assert len(cases) > len(_conv_ops(x))
    _check(_sampled(cases, x))


def test_1x1_tiles_run_along_the_flat_run_of_pixels() -> None:
    """A 1x1 stride-1 unpadded conv's tiles take oh x ow consecutive pixels of the image, so
    they cross rows: every layout pair, tiles wider than a row and not dividing it, both
    thread splits (a split by pixels then splits the tiles), checked against the reference;
    and the tiler proposes one-row tiles for it."""
    x = HW.lanes
    cases: list[Case] = []
    for layout, out_layout in _layouts(x):
        op = conv2d_op(1, 3 * x, 5, 7, 2 * x + 3, 1, 1, epilogue="bias+add+relu",
                       layout=layout, out_layout=out_layout)
        assert flat_pixels(op) and pixel_grid(op) == (1, 35)
        for nv, ow, oh, par in ((1, 4, 2, "pixel"), (2, 3, 1, "oc"), (1, 9, 1, "pixel")):
            s = Conv2dSchedule(oc_block=nv * x, ow_block=ow, oh_block=oh,
                               ic_block=x if layout != "nchw" else 8, threads=T2, parallel=par)
            assert not problems(op, s, HW), (op.text, str(s))
            assert direct_tile(op, s) == (1, ow * oh)
            cases.append((op, s, HW))
    _check(cases)
    flat = conv2d_op(1, 96, 7, 7, 32, 1, 1, layout=f"nchw{x}c", out_layout=f"nchw{x}c")
    pool = [s for s in tuner_kind("conv2d").pool(flat, HW, 2) if s.algorithm == "direct"]
    assert pool and all(s.oh_block == 1 for s in pool)
    assert not flat_pixels(conv2d_op(1, 96, 7, 7, 32, 1, 1, pads=1))
    assert not flat_pixels(conv2d_op(1, 96, 7, 7, 32, 1, 1, stride=2))


def test_depthwise_bands_packed_as_the_tiles_need_them() -> None:
    """A padded depthwise layer on a blocked input copies the padded rows of a few row tiles
    into its thread's small band buffer just before those tiles: on every ISA (an AVX2 vector
    is half a 16-channel block, so two channel tiles read one band), two images, both loop
    orders, threads split by channels and by pixels, row tiles with tails, and bands of one
    tile, of a whole plane and of several tiles but not all (a wide image)."""
    cases: list[Case] = []
    band_tiles: set[str] = set()
    for isa in runnable_isas(HW):
        hw = HW.with_isa(isa)
        for op in (conv2d_op(2, 48, 13, 11, 48, 3, 3, stride=2, pads=1, groups=48,
                             layout="nchw16c", out_layout="nchw16c", epilogue="bias+relu"),
                   conv2d_op(1, 40, 9, 12, 40, 5, 5, pads=(2, 1, 2, 3), groups=40,
                             layout="nchw16c", out_layout="nchw16c"),
                   conv2d_op(1, 16, 40, 100, 16, 3, 3, pads=1, groups=16,
                             layout="nchw16c", out_layout="nchw16c", epilogue="bias")):
            base = default_conv2d_schedule(op, hw, 1)
            for threads, parallel in ((1, "oc"), (T2, "oc"), (T2, "pixel")):
                for order, oh in (("fp", 1), ("fp", 3), ("pf", 3)):
                    sched = base.replace(oc_block=hw.lanes, ow_block=4, oh_block=oh,
                                         loop_order=order, threads=threads, parallel=parallel)
                    if problems(op, sched, hw):
                        continue
                    code = generate(op, sched, hw).code
                    assert "pack_band(" in code, (isa, str(sched))
                    band_tiles.add(_define(code, "BAND_TILES") + "/" + _define(code, "NPB"))
                    cases.append((op, sched, hw))
    assert len(cases) >= 18
    assert {"1/", "whole", "part"} <= {_band_kind(b) for b in band_tiles}, band_tiles
    _check(cases)


def test_dense_pf_bands_copy_each_row_tiles_rows_of_every_block() -> None:
    """A dense pf kernel on a padded blocked input copies the padded rows one row tile
    reads, of every channel block, into its thread's band just before that row's tiles
    (instead of the whole padded input per call) where a tile's rows overlap the next
    tile's little: stride-2 one-row tiles and stride-1 tiles of four rows; reductions in
    one pass and in chunks, asymmetric pads, two images, threads split by channels and by
    pixels, on every ISA. ``fp`` kernels and stride-1 one-row tiles (three rows read to
    advance one) copy the whole input."""
    cases: list[Case] = []
    for isa in runnable_isas(HW):
        hw = HW.with_isa(isa)
        x = hw.lanes
        if x not in (8, 16):
            continue  # the portable kernels' 4 lanes make no blocked layout
        layout = f"nchw{x}c"
        for op, oh in ((conv2d_op(2, 3 * x, 13, 11, 2 * x, 3, 3, stride=2, pads=1,
                                  layout=layout, out_layout=layout, epilogue="bias+relu"), 1),
                       (conv2d_op(1, 2 * x, 11, 9, 3 * x, 3, 3, pads=(1, 2, 0, 1),
                                  layout=layout, out_layout=layout, epilogue="bias+add"), 4),
                       (conv2d_op(1, 48 * x, 7, 7, 2 * x, 3, 3, pads=1, layout=layout,
                                  out_layout=layout, epilogue="bias"), 4)):
            for threads, parallel in ((1, "oc"), (T2, "oc"), (T2, "pixel")):
                s = Conv2dSchedule(oc_block=x, ow_block=3, oh_block=oh, ic_block=x,
                                   loop_order="pf", unroll_kw=1, threads=threads,
                                   parallel=parallel)
                assert not problems(op, s, hw), (isa, op.text, str(s))
                code = generate(op, s, hw).code
                assert "pack_band(X, band, n, p0 * SH" in code, (isa, op.text, str(s))
                assert "pack_input(" not in code
                cases.append((op, s, hw))
                whole = generate(op, s.replace(loop_order="fp"), hw).code
                assert "pack_input(" in whole and "pack_band(" not in whole
        one_row = conv2d_op(1, 2 * x, 9, 9, 2 * x, 3, 3, pads=1, layout=layout,
                            out_layout=layout)
        assert "pack_band(" not in generate(one_row, Conv2dSchedule(
            oc_block=x, ow_block=4, ic_block=x, loop_order="pf"), hw).code
    # Chunked reductions need CHUNK_MIN_REGISTERS (AVX-512's 32); AVX2 never chunks.
    chunking = [c for c in cases if isa_levels()[c[2].isa].vector_registers
                >= CHUNK_MIN_REGISTERS]
    assert not chunking or any("c0 += KCB" in generate(*c).code for c in chunking)
    _check(cases)


def _define(code: str, name: str) -> str:
    return code.split(f"#define {name} ", 1)[1].split(None, 1)[0]


def _band_kind(tiles_of: str) -> str:
    """``1/`` (a band per row tile), ``whole`` (a band for every row tile) or ``part``."""
    tiles, npb = (int(v.strip("()L")) for v in tiles_of.split("/"))
    return "1/" if tiles == 1 else "whole" if tiles >= npb else "part"


def _pool_ops(x: int) -> list[OpSignature]:
    b = f"nchw{x}c"
    return [
        pool2d_op(1, 20, 15, 15, 3, 3, stride=2, pads=1, layout=b),  # ResNet's stem pool
        pool2d_op(2, 24, 9, 11, 3, 3, pads=1, mode="avg", epilogue="relu", layout=b),
        pool2d_op(1, 9, 9, 11, 3, 3, stride=2, pads=1, mode="avg", count_include_pad=True,
                  ceil_mode=True, layout=b),
        pool2d_op(1, 17, 11, 10, 3, 2, stride=(1, 2), pads=(2, 1, 0, 1), dilation=2, layout=b),
        pool2d_op(1, 8, 7, 7, 2, 2, stride=2, ceil_mode=True, layout=b),
        global_pool2d_op(2, 37, 7, 7, layout=b),
        global_pool2d_op(1, 20, 5, 3, mode="max", epilogue="relu", layout=b),
    ]


@pytest.mark.parametrize("x", BLOCKS)
def test_pool2d_blocked(x: int) -> None:
    cases: list[Case] = []
    for i, op in enumerate(_pool_ops(x)):
        for vec in (1, 2, 4):
            threads = 1 + (i + vec) % T2
            cases.append((op, Pool2dSchedule(ow_block=HW.lanes, vec=vec, unroll=vec,
                                             threads=threads), HW))
    _check(cases)


def test_reorder_between_every_pair_of_layouts() -> None:
    layouts = ["nchw", *(f"nchw{x}c" for x in (8, 16))]
    cases: list[Case] = []
    for src in layouts:
        for dst in layouts:
            if src != dst:
                for shape in ((1, 3, 5, 7), (2, 33, 3, 4)):
                    op = reorder_op(*shape, src=src, dst=dst)
                    cases.append((op, default_schedule(op, HW, T2), HW))
    _check(cases)


def _run(op: OpSignature, *inputs: np.ndarray) -> np.ndarray:
    kernel = cached_kernel(op, default_schedule(op, HW, 1), HW)
    return kernel(*inputs)


@pytest.mark.parametrize("x", BLOCKS)
def test_blocked_chain_equals_the_nchw_chain(x: int) -> None:
    """A ResNet-style chain kept blocked from the stem to the last conv (with a depthwise
    layer, a pool and a residual add on the way) computes what the NCHW chain computes."""
    b = f"nchw{x}c"
    rng = np.random.default_rng(7)

    def weights(f: int, c: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        return (rng.standard_normal((f, c, k, k), dtype=np.float32) * np.float32(0.2),
                rng.standard_normal(f, dtype=np.float32))

    image = rng.standard_normal((1, 3, 20, 20), dtype=np.float32)
    w1, b1 = weights(24, 3, 3)
    w2, b2 = weights(24, 1, 3)
    w3, b3 = weights(36, 24, 1)
    w4, b4 = weights(36, 36, 3)

    def chain(layout: str) -> np.ndarray:
        stem = conv2d_op(1, 3, 20, 20, 24, 3, 3, stride=2, pads=1, epilogue="bias+relu",
                         out_layout=layout)
        y1 = _run(stem, image, w1, b1)
        pool = pool2d_op(1, 24, 10, 10, 3, 3, pads=1, layout=layout)
        y2 = _run(pool, y1)
        dw = conv2d_op(1, 24, 10, 10, 24, 3, 3, pads=1, groups=24, epilogue="bias+relu",
                       layout=layout, out_layout=layout)
        y3 = _run(dw, y2, w2, b2)
        pw = conv2d_op(1, 24, 10, 10, 36, 1, 1, epilogue="bias", layout=layout,
                       out_layout=layout)
        y4 = _run(pw, y3, w3, b3)
        last = conv2d_op(1, 36, 10, 10, 36, 3, 3, pads=1, epilogue="bias+add+relu",
                         layout=layout, out_layout=layout)
        y5 = _run(last, y4, w4, b4, y4)
        if layout == "nchw":
            return y5
        return _run(reorder_op(1, 36, 10, 10, src=layout, dst="nchw"), y5)

    plain, blocked = chain("nchw"), chain(b)
    assert plain.shape == blocked.shape == (1, 36, 10, 10)
    np.testing.assert_allclose(blocked, plain, rtol=1e-4, atol=1e-4)


def test_blocked_kernels_skip_the_layout_conversions() -> None:
    hw = HW.with_isa("avx2")

    def code(op: OpSignature) -> str:
        return generate(op, default_schedule(op, hw, 1), hw).code

    blocked_conv = partial(conv2d_op, layout="nchw8c", out_layout="nchw8c")
    in_place = code(blocked_conv(1, 32, 8, 8, 32, 1, 1))
    assert "const float *Xb = X;" in in_place and "pack_input" not in in_place
    bordered = code(blocked_conv(1, 32, 8, 8, 32, 3, 3, pads=1))
    assert "memcpy(dst + PL * XI, X + (nb * H + ih) * (W * XI)" in bordered
    depthwise = code(blocked_conv(1, 32, 8, 8, 32, 3, 3, groups=32))
    assert "pack_input" not in depthwise and "VLOADU(xr + (0 * SH * WP + 0 * SW) * XI" in depthwise
    for blocked in (in_place, bordered, depthwise):  # whole vectors into Y, no transposition
        assert "TY_STORE(y + (i * Q + j) * XO + 0, t)" in blocked
        assert "#define TY_STORE(p, v) VSTOREU((p), (v))" in blocked  # float32 Y
        assert "y[j] = TY(v);" not in blocked
    plain = code(conv2d_op(1, 32, 8, 8, 32, 1, 1))
    assert "pack_input(X, Xb, lo, hi, xq)" in plain and "y[j] = TY(v);" in plain


def test_blocked_input_skips_the_copy_in_the_estimate() -> None:
    plain = conv2d_op(1, 64, 56, 56, 64, 1, 1)
    blocked = conv2d_op(1, 64, 56, 56, 64, 1, 1, layout="nchw8c", out_layout="nchw8c")
    hw = HW.with_isa("avx2")
    s = default_conv2d_schedule(plain, hw)
    assert estimate(blocked, s, hw).seconds < estimate(plain, s, hw).seconds


# -- other ISAs: generated and compiled, not run --------------------------------------------


def test_avx512_blocked_kernels_compile() -> None:
    hw = HW.with_isa("avx512")
    b = "nchw16c"
    ops = [
        conv2d_op(1, 24, 9, 11, 36, 3, 3, pads=1, epilogue="bias+add+relu", layout=b,
                  out_layout=b),  # row copies in, vector stores out
        conv2d_op(1, 32, 7, 7, 24, 1, 1, epilogue="bias+add", layout=b, out_layout=b),  # in place
        conv2d_op(1, 40, 9, 9, 40, 3, 3, stride=2, pads=1, groups=40, epilogue="bias",
                  layout=b, out_layout=b),
        conv2d_op(1, 24, 8, 8, 36, 3, 3, pads=1, groups=2, epilogue="bias+relu", layout=b,
                  out_layout=b),  # gathered input, scalar stores
        conv2d_op(1, 3, 23, 23, 20, 7, 7, stride=2, pads=3, out_layout=b),
        pool2d_op(1, 20, 15, 15, 3, 3, stride=2, pads=1, mode="avg", layout=b),
        global_pool2d_op(1, 37, 7, 7, layout=b),
        reorder_op(1, 20, 5, 7, src="nchw", dst=b),
    ]
    for op in ops:
        s = default_schedule(op, hw, T2)
        assert not problems(op, s, hw), (op.text, problems(op, s, hw))
        assert build(generate(op, s, hw)).path.exists()
    wide = ops[0]
    s = default_conv2d_schedule(wide, hw).replace(oc_block=32, ow_block=6)
    assert not problems(wide, s, hw)
    assert build(generate(wide, s, hw)).path.exists()


def test_reference_is_the_nchw_reference_in_blocked_form() -> None:
    op = conv2d_op(1, 5, 6, 6, 7, 3, 3, pads=1, epilogue="bias+add+relu", layout="nchw8c",
                   out_layout="nchw8c")
    plain = nchw_conv2d(op)
    x, w, bias, add = random_inputs(op, seed=2)
    expected = reference(plain, (from_blocked(x, 5), w, bias, from_blocked(add, 7)))
    got = reference(op, (x, w, bias, add))
    np.testing.assert_array_equal(from_blocked(got, 7), expected)
    assert not got[..., 7:].any()
