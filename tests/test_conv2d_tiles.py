"""The int8 and bf16 conv2d on AMX tiles (``loop_order=amx``, issue 53): 64-byte pixel
blocks, every tile shape, rows narrower than a tile, strides, folded stems and residuals,
the same integers as the vector kernel; schedules refused where they cannot run. Generating
and checking needs no AMX; running does (skipped without)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tunecache.compiler.codegen import generate
from tunecache.compiler.hardware import cpu_features, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import Conv2dSchedule, conv2d_op
from tunecache.compiler.kinds.conv2d.lowp import bf16_variant, subsamples, tiles_plane
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, problems
from tunecache.tuner.search.roller import candidates

HW = local_spec()
AMX = {"amx_tile", "amx_int8", "amx_bf16"} <= set(cpu_features())
needs_amx = pytest.mark.skipif(not AMX, reason="needs a CPU with AMX-INT8 and AMX-BF16")
TILED = replace(HW.with_isa("avx512") if "avx512" in runnable_isas(HW) else HW, isa="avx512",
                vector_bits=512,
                features=("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni"))
UNTILED = replace(TILED, features=("avx512_bf16", "avx512_vnni"))
CASES = [  # (C, H, W, F, R, S, stride, pads, layout)
    (64, 9, 40, 48, 3, 3, 1, 1, "nchw16c"),   # a row of 40: a whole tile and an overlapped one
    (130, 7, 7, 33, 3, 3, 1, 1, "nchw"),      # rows narrower than a tile, channels past blocks
    (3, 20, 20, 64, 7, 7, 2, 3, "nchw"),      # an RGB stem: taps folded into the pixel
    (256, 6, 18, 64, 1, 1, 2, 0, "nchw16c"),  # strided 1x1
    (96, 7, 7, 40, 1, 1, 1, 0, "nchw16c"),    # 1x1: the image's pixels as one row
    (40, 5, 9, 24, 1, 1, 1, 0, "nchw"),       # the same on planes
    (3, 21, 19, 32, 3, 3, 2, 1, "nchw"),      # a 3x3 stem: bf16's 9 channels in half a row
    (64, 7, 9, 40, 1, 1, 2, 0, "nchw"),       # strided 1x1, plain: a 4x5 plane subsampled
    (96, 14, 13, 48, 1, 1, (2, 3), 0, "nchw16c"),  # and blocked, strides unequal: 7x5
]
SHAPES = [(32, 32), (16, 48), (16, 16)]


def _op(case: int, dtype: str) -> OpSignature:
    c, h, w, f, r, s, stride, pads, layout = CASES[case]
    epilogue = "dequant+bias+add+relu" if dtype == "int8" else "bias+add+relu"
    return conv2d_op(2, c, h, w, f, r, s, stride=stride, pads=pads, dtype=dtype,
                     epilogue=epilogue, layout=layout, out_layout=layout)


def _tiled(op: OpSignature, ow: int, oc: int) -> Conv2dSchedule:
    s = default_schedule(op, TILED, 2)
    assert isinstance(s, Conv2dSchedule) and s.loop_order == "amx"
    return s.replace(ow_block=ow, oc_block=oc)


@needs_amx
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize(("ow", "oc"), SHAPES)
def test_int8_tiles_give_the_vector_kernels_integers(case: int, ow: int, oc: int) -> None:
    op = _op(case, "int8")
    inputs = random_inputs(op, seed=case)
    tiled = compile_kernel(op, _tiled(op, ow, oc), HW)(*inputs)
    vectors = compile_kernel(op, default_schedule(op, UNTILED, 2), UNTILED)(*inputs)
    np.testing.assert_array_equal(tiled, vectors)
    assert check_result(op, inputs, tiled, reference(op, inputs)) is None


@needs_amx
@pytest.mark.parametrize("case", range(len(CASES)))
def test_bf16_tiles_accumulate_in_float32(case: int) -> None:
    op = _op(case, "bf16")
    inputs = random_inputs(op, seed=case)
    tiled = compile_kernel(op, _tiled(op, 32, 32), HW)(*inputs)
    assert check_result(op, inputs, tiled, reference(op, inputs)) is None


def test_the_kernel_uses_tiles_and_64_byte_pixels_where_the_spec_has_them() -> None:
    for dtype, dot, pixc in (("int8", "_tile_dpbusd", 64), ("bf16", "_tile_dpbf16ps", 32)):
        op = _op(0, dtype)
        s = default_schedule(op, TILED)
        assert isinstance(s, Conv2dSchedule) and s.ic_block == pixc
        code = generate(op, s, TILED).code
        assert dot in code and f"#define PIXC {pixc}" in code
        plain = generate(op, default_schedule(op, UNTILED), UNTILED).code
        assert "_tile_" not in plain and "#define PIXC 16" in plain


HALF_ROWS = [  # (C, H, W, F, narrow): bfloat16 X in 16-channel blocks, 1x1 of stride 1
    (16, 12, 12, 96, "x+y"),      # one half row of K
    (144, 7, 9, 24, "x+y+add"),   # nine, the residual bfloat16 too; F not whole tiles
    (48, 3, 3, 40, "x"),          # fewer pixels than a tile: packed, in half rows
]


@pytest.mark.parametrize("case", range(len(HALF_ROWS)))
def test_bf16_x_in_16_channel_blocks_takes_half_tile_rows(case: int) -> None:
    # tile_pixel_channels: K steps of 16 channels (32 bytes), the A tiles and B rows
    # configured so, X read where it lies
    c, h, w, f, narrow = HALF_ROWS[case]
    op = conv2d_op(2, c, h, w, f, 1, 1, dtype="bf16", epilogue="bias+add+relu",
                   layout="nchw16c", out_layout="nchw16c", narrow=narrow)
    s = default_schedule(op, TILED, 2)
    assert isinstance(s, Conv2dSchedule) and s.loop_order == "amx" and s.ic_block == 16
    code = generate(op, s, TILED).code
    assert "#define PIXC 16" in code and "TCONFIG_K(" in code
    assert ("#define IN_PLACE 1" in code) == (h * w >= s.ow_block)
    assert any("ic_block=16, not 32" in p for p in problems(op, s.replace(ic_block=32), TILED))
    if AMX:
        for ow, oc in SHAPES:
            inputs = random_inputs(op, seed=case)
            out = compile_kernel(op, s.replace(ow_block=ow, oc_block=oc), HW)(*inputs)
            assert check_result(op, inputs, out, reference(op, inputs)) is None


def test_a_bf16_stem_whose_folded_taps_fit_half_a_row_packs_half_rows() -> None:
    # 3 channels x 3 taps: 9 of 16 channels a packed pixel, not 9 of 32
    stems = {c[4]: i for i, c in enumerate(CASES) if c[0] == 3}  # by their taps
    for case, pixc in ((stems[3], 16), (stems[7], 32)):
        op = _op(case, "bf16")
        s = default_schedule(op, TILED, 2)
        assert isinstance(s, Conv2dSchedule) and s.ic_block == pixc
        assert (f"#define PIXC {pixc}" in generate(op, s, TILED).code)


def test_a_strided_1x1_on_tiles_convolves_the_plane_of_pixels_it_reads() -> None:
    # subsamples: packed densely (X read at h * XSH, w * XSW), then a stride-1 plane
    op = _op(len(CASES) - 1, "int8")
    assert subsamples(op) and tiles_plane(op) and not subsamples(_op(0, "int8"))
    code = generate(op, default_schedule(op, TILED), TILED).code
    for define in ("H 7", "W 5", "WP 5", "SH 1", "XH 14", "XW 13", "XSH 2", "XSW 3"):
        assert f"#define {define}L\n" in code, define


def test_tile_schedules_are_refused_where_they_cannot_run() -> None:
    op = _op(0, "int8")
    s = _tiled(op, 32, 32)
    assert any("needs int8 matrix tiles (AMX)" in p for p in problems(op, s, UNTILED))
    assert any("needs 9 tile registers" in p
               for p in problems(op, s.replace(ow_block=16, oc_block=64), TILED))
    assert any("ic_block=64, not 16" in p for p in problems(op, s.replace(ic_block=16), TILED))
    assert any("whole tiles of 16" in p for p in problems(op, s.replace(ow_block=14), TILED))
    assert any("loop_order='amx'" in p for p in problems(_float32(), s, TILED))


def test_the_tiler_proposes_tiles_first_where_there_are_tiles() -> None:
    op = _op(0, "int8")
    ranked = [c.schedule for c in candidates(op, TILED, k=8, threads=1)]
    assert isinstance(ranked[0], Conv2dSchedule) and ranked[0].loop_order == "amx"
    assert any(getattr(s, "loop_order", "") != "amx" for s in ranked)  # vectors compete
    assert all(getattr(c.schedule, "loop_order", "") != "amx"
               for c in candidates(op, UNTILED, k=8, threads=1))


def _float32() -> OpSignature:
    return conv2d_op(1, 64, 9, 40, 48, 3, 3, pads=1)


def test_bf16_takes_rgb_stems_only_on_tiles() -> None:
    stem = conv2d_op(1, 3, 224, 224, 64, 7, 7, stride=2, pads=3, epilogue="bias+relu")
    assert bf16_variant(stem, UNTILED) is None  # twice float32's work a cycle: no gain
    found = bf16_variant(stem, TILED)
    assert found is not None and found[0].dtype == "bf16"
