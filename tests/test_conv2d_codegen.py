"""Generated conv2d kernels against the float64 numpy reference, on every runnable ISA.

Layer *configurations* of ResNet-50 and MobileNet-v2 (channels, kernel, stride, groups) run
at reduced spatial sizes; two real layers run at full size on the host ISA only. Outputs
start NaN-poisoned, so an unwritten element fails the check.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from kernel_support import assembly, bound_weights_problem, sampled

from tunecache.compiler.backends.cpu.build import Artifact, build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import KernelArgumentError, OpSignatureError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import conv2d_op, direct_plan
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, default_conv2d_schedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, load_kernel, random_inputs, reference
from tunecache.compiler.schedule import problems

HW = local_spec()
ISAS = runnable_isas(HW)
T2 = min(2, HW.cores)
conv = conv2d_op


def direct(nv: int, ow: int, ic: int, oh: int = 1, **kw: object) -> Callable[[HardwareSpec],
                                                                              Conv2dSchedule]:
    def make(hw: HardwareSpec) -> Conv2dSchedule:
        # Keep the tile inside the register file of the narrowest ISA (16 registers).
        n = nv if hw.vector_registers > 16 else 1
        w = ow if hw.vector_registers > 16 else min(ow, 6)
        h = oh if hw.vector_registers > 16 else 1
        return Conv2dSchedule(oc_block=n * hw.lanes, ow_block=w, oh_block=h, ic_block=ic,
                              **kw)  # type: ignore[arg-type]
    return make


def gemm(mr: int, nv: int, ic: int, **kw: object) -> Callable[[HardwareSpec], Conv2dSchedule]:
    def make(hw: HardwareSpec) -> Conv2dSchedule:
        n = nv if hw.vector_registers > 16 else min(nv, 2)
        m = mr if hw.vector_registers > 16 else min(mr, (16 - n - 1) // n)
        return Conv2dSchedule(oc_block=m, ow_block=n * hw.lanes, ic_block=ic, algorithm="gemm",
                              **kw)  # type: ignore[arg-type]
    return make


def plane(nv: int, oh: int, **kw: object) -> Callable[[HardwareSpec], Conv2dSchedule]:
    """The depthwise plane kernel: ``nv`` vectors of output columns x ``oh`` rows."""
    def make(hw: HardwareSpec) -> Conv2dSchedule:
        return Conv2dSchedule(oc_block=hw.lanes, ow_block=nv * hw.lanes, oh_block=oh,
                              ic_block=1, pack_w=0, **kw)  # type: ignore[arg-type]
    return make


Make = Callable[[HardwareSpec], Conv2dSchedule]
# (what it covers, op, schedules); each schedule builder spreads the knobs over the cases.
CASES: list[tuple[str, OpSignature, list[Make]]] = [
    ("resnet stem 7x7/2 pad 3", conv(1, 3, 23, 21, 64, 7, 7, stride=2, pads=3, epilogue="bias+relu"),
     [direct(2, 14, 3), direct(1, 7, 1, unroll_kw=1, threads=T2, parallel="pixel"),
      gemm(12, 2, 3, threads=T2, parallel="pixel")]),
    ("resnet 3x3 64", conv(1, 64, 9, 9, 64, 3, 3, pads=1, epilogue="bias+relu"),
     [direct(2, 5, 16, unroll_kw=1, loop_order="pf"), gemm(6, 4, 64, pack_w=0)]),
    ("resnet 1x1 256->64 residual", conv(1, 256, 7, 7, 64, 1, 1, epilogue="bias+add+relu"),
     [direct(1, 7, 64, oh=3, threads=T2, parallel="pixel"), gemm(12, 2, 100, threads=T2)]),
    ("resnet 3x3/2 128", conv(1, 128, 10, 10, 128, 3, 3, stride=2, pads=1, epilogue="bias"),
     [direct(2, 3, 48, threads=T2), gemm(5, 2, 128, pack_w=0, threads=T2, parallel="pixel")]),
    ("resnet downsample 1x1/2", conv(1, 256, 8, 8, 512, 1, 1, stride=2, epilogue="bias"),
     [direct(2, 4, 64), gemm(12, 2, 256, pack_w=0, threads=T2)]),
    ("mobilenet depthwise 3x3", conv(1, 144, 9, 9, 144, 3, 3, pads=1, groups=144,
                                     epilogue="bias+relu"),
     [direct(1, 9, 1, oh=2), direct(2, 4, 1, threads=T2, parallel="pixel", unroll_kw=1),
      plane(1, 2), plane(2, 4, threads=T2, unroll_kw=1)]),
    ("mobilenet depthwise 3x3/2", conv(1, 96, 11, 13, 96, 3, 3, stride=2, pads=1, groups=96,
                                       epilogue="bias+relu"),
     [direct(2, 6, 1, loop_order="pf", threads=T2), plane(1, 3), plane(2, 1, threads=T2)]),
    ("depthwise 5x3, stride (2,3), dilation (2,1), asymmetric pads, residual",
     conv(2, 5, 13, 11, 5, 5, 3, stride=(2, 3), pads=(1, 0, 2, 1), dilation=(2, 1), groups=5,
          epilogue="bias+add+relu"),
     [plane(1, 1), plane(3, 2, unroll_kw=1, threads=T2)]),
    ("mobilenet expand 1x1", conv(1, 24, 6, 6, 144, 1, 1, epilogue="bias+relu"),
     [direct(1, 6, 24, oh=2), gemm(6, 2, 8)]),
    ("mobilenet project 1x1 residual", conv(1, 144, 5, 5, 24, 1, 1, epilogue="bias+add"),
     [direct(2, 5, 144, oh=2, loop_order="pf"), gemm(4, 1, 144, threads=T2, parallel="oc")]),
    ("dilation 2", conv(1, 8, 12, 10, 16, 3, 3, pads=2, dilation=2, epilogue="relu"),
     [direct(1, 4, 3, oh=2), gemm(3, 1, 5)]),
    ("dilation (2,3) stride (2,1)", conv(2, 4, 13, 15, 6, 3, 2, stride=(2, 1), pads=(2, 1, 1, 2),
                                         dilation=(2, 3)),
     [direct(1, 5, 4, threads=T2, parallel="pixel"), gemm(2, 2, 1)]),
    ("groups 2", conv(1, 8, 7, 9, 12, 3, 3, pads=1, groups=2, epilogue="bias"),
     [direct(1, 4, 3), gemm(4, 1, 4, threads=T2, parallel="pixel")]),
    ("groups 4, asymmetric pads, stride 2", conv(2, 16, 9, 8, 8, 3, 3, stride=2,
                                                  pads=(0, 1, 1, 0), groups=4,
                                                  epilogue="bias+add+relu"),
     [direct(1, 3, 2, oh=2, threads=T2), gemm(2, 1, 4, pack_w=0)]),
    ("1x1 in place: several K chunks, channel and pixel tails, unpacked weights",
     conv(1, 40, 8, 9, 28, 1, 1, epilogue="bias+add+relu"),
     [gemm(12, 1, 16, pack_w=0, threads=T2, parallel="pixel"), gemm(5, 2, 40, pack_w=0),
      gemm(6, 2, 16, threads=T2)]),
    ("1x1 input, 3x3 padded kernel", conv(1, 32, 1, 1, 40, 3, 3, pads=1, epilogue="bias+relu"),
     [direct(2, 1, 32), gemm(12, 1, 32, pack_w=0)]),
    ("1x1 input, 1x1 kernel", conv(2, 17, 1, 1, 19, 1, 1, epilogue="add"),
     [direct(1, 1, 17, threads=T2), gemm(3, 1, 17)]),
    ("H != W, odd everything", conv(2, 5, 13, 4, 7, 2, 3, pads=(1, 0, 0, 2), epilogue="bias+relu"),
     [direct(1, 3, 2, oh=2, loop_order="pf"), gemm(5, 1, 3, threads=T2)]),
    ("reduction in chunks: 3x3 over 512 channels, row and column tails, residual",
     conv(1, 512, 6, 7, 24, 3, 3, pads=1, epilogue="bias+add+relu"),
     [direct(1, 4, 16, oh=2), direct(2, 3, 16, loop_order="pf", threads=T2, parallel="pixel")]),
    ("reduction in chunks: 1x1 over 2200 channels, a partial last block and chunk",
     conv(1, 2200, 5, 5, 20, 1, 1, epilogue="bias+relu"),
     [direct(2, 4, 16, threads=T2), direct(1, 6, 16, loop_order="pf")]),
    ("reduction in chunks: two groups of 512 channels",
     conv(1, 1024, 4, 5, 32, 3, 3, pads=1, groups=2, epilogue="bias"),
     [direct(1, 3, 16, threads=T2)]),
]

# Full-size layers (host ISA only): ResNet-50 layer4 3x3 and a MobileNet-v2 depthwise 3x3/2.
FULL: list[tuple[str, OpSignature, list[Make]]] = [
    ("resnet layer4 3x3 512 @7", conv(1, 512, 7, 7, 512, 3, 3, pads=1, epilogue="bias+relu"),
     [lambda hw: default_conv2d_schedule(conv(1, 512, 7, 7, 512, 3, 3, pads=1), hw, T2),
      gemm(12, 2, 128, pack_w=0)]),
    ("mobilenet depthwise 3x3/2 144 @56", conv(1, 144, 56, 56, 144, 3, 3, stride=2, pads=1,
                                               groups=144, epilogue="bias+relu"),
     [direct(1, 14, 1, threads=T2)]),
]

Case = tuple[str, OpSignature, Conv2dSchedule, HardwareSpec]


def _cases() -> list[Case]:
    out: list[Case] = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for what, op, makers in CASES + (FULL if isa == HW.isa else []):
            for make in makers:
                out.append((what, op, make(hw), hw))
    return out


CASES_ALL = _cases()


def _build_all(cases: list[Case]) -> list[Artifact]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: build(generate(c[1], c[2], c[3])), cases))


def _check(op: OpSignature, artifact: Artifact, s: Conv2dSchedule) -> str | None:
    kernel = load_kernel(op, artifact)
    inputs = random_inputs(op, seed=3)
    out = np.full(op.arguments()[-1].shape, np.nan, dtype=np.float32)
    kernel(*inputs, out=out)
    problem = check_result(op, inputs, out, reference(op, inputs))
    if problem:
        return problem
    again = kernel(*inputs)
    if not np.array_equal(again, out):
        return "second call differs from the first"
    if kernel.prepacks_weights != bool(s.pack_w):
        return f"prepacks_weights is {kernel.prepacks_weights}"
    return bound_weights_problem(kernel, inputs, out) if kernel.prepacks_weights else None


def test_every_case_is_legal() -> None:
    for what, op, s, hw in CASES_ALL:
        assert not problems(op, s, hw), (what, hw.isa, str(s), problems(op, s, hw))


def test_kernels_match_the_reference_on_every_isa() -> None:
    failures = []
    cases = sampled(CASES_ALL, hw_at=3)
    for (what, op, s, hw), art in zip(cases, _build_all(cases), strict=True):
        problem = _check(op, art, s)
        if problem:
            failures.append(f"{hw.isa} {what} {s}: {problem}")
    assert not failures, "\n".join(failures)


def test_random_shapes_and_schedules() -> None:
    rng = random.Random(4)
    cases: list[Case] = []
    while len(cases) < 16:
        hw = HW.with_isa(rng.choice(ISAS))
        g = rng.choice([1, 1, 2, 3])
        depthwise = rng.random() < 0.2
        c = rng.randint(1, 9) * g
        f = rng.randint(1, 9) * g
        if depthwise:
            g = c = f = rng.randint(1, 20)
        r, s_ = rng.randint(1, 4), rng.randint(1, 4)
        try:
            op = conv(rng.randint(1, 2), c, rng.randint(1, 12), rng.randint(1, 12), f, r, s_,
                      stride=(rng.randint(1, 3), rng.randint(1, 3)),
                      pads=tuple(rng.randint(0, 2) for _ in range(4)),  # type: ignore[arg-type]
                      dilation=(rng.randint(1, 2), rng.randint(1, 2)), groups=g,
                      epilogue=rng.choice(["none", "bias", "add+relu", "bias+add+relu"]))
        except ValueError:
            continue
        if depthwise and rng.random() < 0.5:
            sched = Conv2dSchedule(
                oc_block=hw.lanes, ow_block=hw.lanes * rng.randint(1, 3),
                oh_block=rng.randint(1, 3), ic_block=1, pack_w=0,
                unroll_kw=rng.randint(0, 1), threads=rng.randint(1, T2), parallel="oc")
        elif rng.random() < 0.5 and not depthwise:
            sched = Conv2dSchedule(
                oc_block=rng.randint(1, 6), ow_block=hw.lanes * rng.randint(1, 2),
                ic_block=rng.randint(1, 8), algorithm="gemm", pack_w=rng.randint(0, 1),
                threads=rng.randint(1, T2), parallel=rng.choice(["oc", "pixel"]))
        else:
            sched = Conv2dSchedule(
                oc_block=hw.lanes * rng.randint(1, 2), ow_block=rng.randint(1, 5),
                oh_block=rng.randint(1, 2), ic_block=rng.randint(1, 8),
                loop_order=rng.choice(["fp", "pf"]), unroll_kw=rng.randint(0, 1),
                threads=rng.randint(1, T2), parallel=rng.choice(["oc", "pixel"]))
        if not problems(op, sched, hw):
            cases.append((f"random {len(cases)}", op, sched, hw))
    _assert_all_match(cases)


def _assert_all_match(cases: list[Case]) -> None:
    """Build every case in one batch and check each against the reference."""
    failures = []
    for (what, op, s, hw), art in zip(cases, _build_all(cases), strict=True):
        problem = _check(op, art, s)
        if problem:
            failures.append(f"{hw.isa} {what} {op.text} {s}: {problem}")
    assert not failures, "\n".join(failures)


def test_plain_1x1_panels_read_the_input_in_place_only_when_they_fit_l1() -> None:
    """Full panels of a 1x1 stride-1 conv read X's rows in place (``ukr_x``) when a panel
    (kc rows x NR pixels) stays within L1; a wider or deeper panel, and any padded or strided
    conv, copies it. The results are checked by the cases above."""
    op = conv(1, 144, 56, 56, 24, 1, 1)

    def source(o: OpSignature, nv: int, ic: int) -> str:
        # Two channels per tile, so that four pixel vectors fit AVX2's 16 registers too.
        s = Conv2dSchedule(oc_block=2, ow_block=nv * HW.lanes, ic_block=ic, algorithm="gemm")
        return generate(o, s, HW).code

    assert "ukr_x(" in source(op, 1, 144)
    assert "ukr_x(" not in source(op, 4, 144)  # four vectors of 144 rows outgrow L1
    assert "ukr_x(" not in source(conv(1, 144, 56, 56, 24, 1, 1, stride=2), 1, 144)
    assert "ukr_x(" not in source(conv(1, 144, 56, 56, 24, 3, 3, pads=1), 1, 16)


def test_epilogue_order_is_bias_add_relu() -> None:
    op = conv(1, 4, 5, 5, 16, 3, 3, pads=1, epilogue="bias+add+relu")
    x, w, bias, add = random_inputs(op, seed=1)
    y = load_kernel(op, build(generate(op, default_conv2d_schedule(op, HW), HW)))(x, w, bias, add)
    plain = conv(1, 4, 5, 5, 16, 3, 3, pads=1)
    y0 = load_kernel(plain, build(generate(plain, default_conv2d_schedule(plain, HW), HW)))(x, w)
    expected = np.maximum(y0 + bias[None, :, None, None] + add, 0)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert (y == 0).any() and (y > 0).any()


ACTIVATION_EPILOGUES = ("bias+clip6", "bias+silu", "bias+add+clip6", "bias+gelu_erf",
                        "add+gelu_tanh")


def _activation_cases(hw: HardwareSpec, epilogues: tuple[str, ...]) -> list[Case]:
    """ReLU6, SiLU and GELU tails on every kernel path: direct (through the NCHW store loop),
    implicit GEMM (vector micro-kernel, scalar merge of the edge tiles), depthwise direct and
    plane kernels, and blocked layouts (vector sink, grouped scalar sink, depthwise)."""
    block = f"nchw{max(8, hw.lanes)}c"
    out: list[Case] = []
    for epi in epilogues:
        dense = conv(1, 16, 9, 10, 24, 3, 3, pads=1, epilogue=epi)
        dw = conv(1, 24, 11, 9, 24, 3, 3, stride=2, pads=1, groups=24, epilogue=epi)
        out += [(f"direct {epi}", dense, direct(2, 4, 8)(hw), hw),
                (f"gemm {epi}", dense, gemm(6, 2, 8)(hw), hw),
                (f"depthwise direct {epi}", dw, direct(1, 4, 1, oh=2)(hw), hw),
                (f"depthwise plane {epi}", dw, plane(1, 2)(hw), hw)]
        for what, op in (
                ("blocked", conv2d_op(1, 16, 7, 9, 40, 3, 3, pads=1, epilogue=epi,
                                      layout=block, out_layout=block)),
                ("blocked grouped", conv2d_op(1, 16, 6, 6, 24, 3, 3, pads=1, groups=2,
                                              epilogue=epi, layout=block, out_layout=block)),
                ("blocked depthwise", conv2d_op(1, 24, 8, 8, 24, 3, 3, pads=1, groups=24,
                                                epilogue=epi, layout=block, out_layout=block))):
            out.append((f"{what} {block} {epi}", op, default_conv2d_schedule(op, hw, T2), hw))
    return out


def test_relu6_silu_and_gelu_epilogues_on_every_kernel_path() -> None:
    """Every path on the host ISA; SiLU (VEXP in vectors, FEXP in scalar loops) and GELU
    (VERF, and the scalar helper FERF each kernel carrying it defines) on the lower ISA
    levels too."""
    cases = _activation_cases(HW, ACTIVATION_EPILOGUES)
    for isa in ISAS[1:]:
        cases += _activation_cases(HW.with_isa(isa), ("bias+silu", "bias+gelu_erf"))
    for what, op, s, hw in cases:
        assert not problems(op, s, hw), (what, hw.isa, problems(op, s, hw))
    _assert_all_match(cases)


def test_activation_tails_clamp_and_saturate() -> None:
    # Both clip6 bounds and SiLU's negative side are hit (the inputs' scale makes sure).
    op = conv(1, 8, 6, 6, 16, 3, 3, pads=1, epilogue="bias+clip6")
    inputs = random_inputs(op, seed=4)
    y = load_kernel(op, build(generate(op, default_conv2d_schedule(op, HW), HW)))(*inputs)
    assert (y == 0).any() and (y == 6).any() and ((y > 0) & (y < 6)).any()
    silu = conv(1, 8, 6, 6, 16, 3, 3, pads=1, epilogue="bias+silu")
    y = load_kernel(silu, build(generate(silu, default_conv2d_schedule(silu, HW), HW)))(*inputs)
    expected = reference(silu, inputs)
    assert (expected < -0.2).any() and (expected > 6).any()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", ["relu+clip6", "bias+clip6+silu", "add+relu+silu"])
def test_at_most_one_activation(epilogue: str) -> None:
    with pytest.raises(OpSignatureError, match=r"activations .*; at most one"):
        conv(1, 8, 6, 6, 16, 3, 3, epilogue=epilogue)


def test_layout_conversion_happens_inside_the_kernel() -> None:
    # The kernel takes plain NCHW / OIHW arrays and returns NCHW: no caller-side blocking.
    op = conv(1, 20, 6, 6, 24, 3, 3, pads=1)
    source = generate(op, default_conv2d_schedule(op, HW), HW).code
    assert "pack_input" in source and "pack_weights" in source and "tc_time" in source


@pytest.mark.skipif(HW.isa != "avx512", reason="checks the AVX-512 register tile")
def test_direct_tile_is_fully_unrolled_in_registers() -> None:
    op = conv(1, 64, 14, 14, 64, 3, 3, pads=1)
    s = Conv2dSchedule(oc_block=32, ow_block=14, ic_block=64)
    code = generate(op, s, HW).code
    # Count in the micro-kernel only: the prelude's math helpers use VFMA too.
    tile = code[code.index("ukr_full("):].split("\n}\n")[0]
    assert tile.count(" = VFMA(") == 28 and "a0_13_1" in tile


def test_a_stems_taps_run_as_one_loop_without_spills(tmp_path: Path) -> None:
    """A 7x7 stem on NCHW input (one channel a block) walks its 49 taps in one loop over a
    table of input offsets, and keeps its 28 accumulators in registers through it; a 3x3
    stem keeps the row and column loops (ARCHITECTURE change 70)."""
    stem = conv(1, 3, 40, 64, 64, 7, 7, stride=2, pads=3, epilogue="bias+relu")
    lanes = HW.lanes
    ow = 28 if HW.vector_registers > 16 else 12
    kernel = generate(stem, Conv2dSchedule(oc_block=lanes, ow_block=ow, ic_block=1), HW)
    tile = kernel.code[kernel.code.index("ukr_full("):].split("\n}\n")[0]
    assert "TAP_X[R * S]" in kernel.code and "for (long t = 0; t < R * S; t++)" in tile
    assert "for (long r = 0; r < R; r++)" not in tile
    small = conv(1, 3, 40, 64, 32, 3, 3, stride=2, pads=1)
    assert "TAP_X" not in generate(small, Conv2dSchedule(oc_block=lanes, ow_block=8,
                                                         ic_block=1), HW).code
    asm = assembly(kernel, tmp_path)
    if "vfmadd" not in asm:
        pytest.skip("the portable kernel's FMAs are not recognisable in this target's assembly")
    blocks = re.split(r"^\.L\w+:\s*$", asm, flags=re.MULTILINE)
    # The loop body: its block up to the branch back (the tile's stores follow it).
    loop = max(blocks, key=lambda b: len(re.findall(r"vfmadd", b))).split("\n\tj")[0]
    assert len(re.findall(r"vfmadd", loop)) == ow
    assert not re.findall(r"\((%rsp|%rbp)\)", loop), "the tap loop spills"


def test_a_1x1_tile_prefetches_the_next_blocks_weights_only_over_few_pixel_tiles() -> None:
    """A 1x1 layer at 5x5 (two pixel tiles an image) prefetches the next channel block's
    weights while it reduces; at 28x28 every tile would repeat them, so it does not
    (ARCHITECTURE change 71)."""
    lanes = HW.lanes
    small = conv(1, 256, 5, 5, 4 * lanes, 1, 1, epilogue="bias+relu")
    big = conv(1, 256, 28, 28, 4 * lanes, 1, 1, epilogue="bias+relu")
    s = Conv2dSchedule(oc_block=lanes, ow_block=13, ic_block=lanes)
    fetch = "__builtin_prefetch(wc + NCB * R * S * ICB * OCB + l, 0, 1)"
    assert fetch in generate(small, s, HW).code
    assert fetch not in generate(big, s, HW).code


def test_a_tile_over_many_weights_reduces_them_in_chunks_that_fit_l1() -> None:
    """A dense tile whose weights span several chunks of CHUNK_WEIGHT_BYTES reduces chunk by
    chunk over all its span's tiles, adding into their partial sums; one whose weights fit
    a few chunks, or a layer of two pixel tiles (which prefetches instead), reduces in one
    pass, and so does every tile at 16 registers (AVX2; ARCHITECTURE change 77). Code is
    generated for an AVX-512 spec on any machine; the chunked kernels run in the cases above
    where the machine has AVX-512."""
    avx512 = HW.with_isa("avx512")
    lanes = avx512.lanes
    s = Conv2dSchedule(oc_block=lanes, ow_block=7, ic_block=16)
    chunked = "for (long c0 = 0; c0 < NCB; c0 += KCB)"
    layer = conv(1, 512, 14, 14, 64, 3, 3, pads=1)
    many = generate(layer, s, avx512).code
    assert chunked in many and "int first)" in many
    blocks = direct_plan.CHUNK_WEIGHT_BYTES // (9 * 16 * lanes * 4)
    assert f"#define KCB {blocks}" in many
    few = conv(1, 16 * direct_plan.CHUNK_MIN_CHUNKS * blocks - 16, 14, 14, 64, 3, 3, pads=1)
    assert chunked not in generate(few, s, avx512).code
    two_tiles = conv(1, 4096, 3, 3, 64, 1, 1)
    assert chunked not in generate(two_tiles, s, avx512).code
    avx2 = HW.with_isa("avx2")
    assert chunked not in generate(layer, Conv2dSchedule(oc_block=8, ow_block=7, ic_block=16),
                                   avx2).code


def test_a_chunked_span_prefetches_the_next_chunk_spread_over_its_tiles() -> None:
    """While a chunk is reduced, each tile of the span asks for its own share of the next
    chunk's cache lines (its index in the span times the share), so the next chunk arrives
    in L2 once, spread over the chunk's work; a one-pass kernel does not prefetch so."""
    avx512 = HW.with_isa("avx512")
    spread = "__builtin_prefetch(next + l * 16, 0, 2)"
    layer = conv(1, 512, 14, 14, 64, 3, 3, pads=1)
    for order, index in (("fp", "(pb - pb_lo) * (qt_hi - qt_lo) + qt - qt_lo"),
                         ("pf", "qt - qt_lo")):
        code = generate(layer, Conv2dSchedule(oc_block=avx512.lanes, ow_block=7, ic_block=16,
                                              loop_order=order), avx512).code
        assert code.count(spread) == 1
        assert f"const long l0 = ({index}) * per" in code
        assert "const float *next = wb + ncb * (R * S * ICB * OCB);" in code
    one_pass = conv(1, 64, 14, 14, 64, 3, 3, pads=1)
    assert spread not in generate(one_pass, Conv2dSchedule(oc_block=avx512.lanes, ow_block=7,
                                                           ic_block=16), avx512).code


def test_depthwise_plane_tile_loads_each_input_vector_once(tmp_path: Path) -> None:
    """A 3x3 plane tile of 4 rows sweeps 6 input rows per kernel column, each loaded once
    and FMA'd into every output row it feeds, in registers (no memory-operand FMAs)."""
    op = conv(1, 16, 12, 16, 16, 3, 3, pads=1, groups=16)
    kernel = generate(op, plane(1, 4)(HW), HW)
    tile = kernel.code[kernel.code.index("plane_tile("):].split("\n}\n")[0]
    assert tile.count("VLOADU(base + ") == 6 and tile.count(" = VFMA(x, k") == 12
    asm = assembly(kernel, tmp_path)
    if "vfmadd" not in asm:
        pytest.skip("the portable kernel's FMAs are not recognisable in this target's assembly")
    assert not re.findall(r"vfmadd\w+ps\s+-?\d*\(", asm)


def test_weights_bind_only_where_the_kernel_packs_them() -> None:
    op = conv(1, 16, 6, 6, 24, 3, 3, pads=1, epilogue="bias")
    x, w, bias = random_inputs(op, seed=2)
    in_place = load_kernel(op, build(generate(op, gemm(4, 1, 16, pack_w=0)(HW), HW)))
    with pytest.raises(KernelArgumentError, match="reads its weights in place"):
        in_place.bind_weights(w)
    packs = load_kernel(op, build(generate(op, direct(1, 3, 8)(HW), HW)))
    with pytest.raises(KernelArgumentError, match="shape"):
        packs.bind_weights(w[:, :8])
    bound = packs.bind_weights(w)
    with pytest.raises(KernelArgumentError, match="bound weights takes 2 input"):
        bound(x, w, bias)
    np.testing.assert_array_equal(bound(x, bias), packs(x, w, bias))
