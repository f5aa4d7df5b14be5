"""Conv2d schedules: JSON round trip, ids, validation against (op, hardware), defaults."""

from __future__ import annotations

import dataclasses

import pytest

from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import ScheduleError
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, default_conv2d_schedule
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json, validate
from tunecache.costmodel.analytic import estimate
from tunecache.datasets.suites import SUITES

HW = local_spec()
AVX512 = HW.with_isa("avx512") if HW.isa == "avx512" else None
CONV = conv2d_op(1, 64, 14, 14, 64, 3, 3, pads=1, epilogue="bias+relu")
DW = conv2d_op(1, 32, 14, 14, 32, 3, 3, pads=1, groups=32)


def test_json_round_trip_and_id() -> None:
    s = Conv2dSchedule(oc_block=32, ow_block=14, ic_block=64, oh_block=2, algorithm="direct",
                       loop_order="pf", unroll_kw=1, threads=2, parallel="pixel")
    text = s.to_json()
    assert '"family":"conv2d"' in text
    back = schedule_from_json(text)
    assert back == s and isinstance(back, Conv2dSchedule) and back.schedule_id == s.schedule_id
    assert s.replace(threads=1).schedule_id != s.schedule_id
    with pytest.raises(ScheduleError, match="unknown conv2d knob"):
        s.replace(mr=4)
    with pytest.raises(ScheduleError, match="missing knob"):
        schedule_from_json('{"family":"conv2d","oc_block":16}')
    with pytest.raises(ScheduleError, match="must be an integer"):
        schedule_from_json('{"family":"conv2d","oc_block":"16","ow_block":4,"ic_block":4}')


def test_families_do_not_mix() -> None:
    mm = MatmulSchedule(mr=4, nr=HW.lanes, kc=32, mc=8, nc=HW.lanes)
    assert problems(CONV, mm, HW) == ["a matmul schedule cannot drive a conv2d op"]
    conv = default_conv2d_schedule(CONV, HW)
    assert problems(matmul_op(8, 8, 8), conv, HW) == [
        "a conv2d schedule cannot drive a matmul op"]


@pytest.mark.skipif(AVX512 is None, reason="needs an AVX-512 machine for its register count")
def test_every_problem_is_listed() -> None:
    assert AVX512 is not None
    s = Conv2dSchedule(oc_block=20, ow_block=40, ic_block=0, oh_block=9, algorithm="direct",
                       loop_order="xy", unroll_kw=2, pack_w=0, threads=99, parallel="m")
    found = " | ".join(problems(CONV, s, AVX512))
    for part in ("oc_block=20 must be a positive multiple of 16", "ow_block=40 out of range",
                 "oh_block=9 out of range", "ic_block=0 out of range", "loop_order='xy'",
                 "unroll_kw=2", "pack_w=0 with algorithm=direct is the plane kernel of depthwise",
                 "threads=99",
                 "parallel='m'"):
        assert part in found
    with pytest.raises(ScheduleError, match="illegal schedule for conv2d"):
        validate(CONV, s, AVX512)


@pytest.mark.skipif(AVX512 is None, reason="needs an AVX-512 machine for its register count")
def test_register_budget_and_algorithm_rules() -> None:
    assert AVX512 is not None
    ok = Conv2dSchedule(oc_block=32, ow_block=14, ic_block=64)  # 28 acc + 2 + 1 = 31
    assert problems(CONV, ok, AVX512) == []
    too_many = ok.replace(ow_block=7, oh_block=3)  # 42 accumulators
    assert "needs 45 vector registers" in " ".join(problems(CONV, too_many, AVX512))
    gemm = Conv2dSchedule(oc_block=12, ow_block=32, ic_block=64, algorithm="gemm", pack_w=0)
    assert problems(CONV, gemm, AVX512) == []
    assert "ow_block=24 must be a positive multiple of 16" in " ".join(
        problems(CONV, gemm.replace(ow_block=24), AVX512))
    assert "oh_block must be 1 for algorithm=gemm" in " ".join(
        problems(CONV, gemm.replace(oh_block=2), AVX512))
    assert "unroll_kw applies to algorithm=direct only" in " ".join(
        problems(CONV, gemm.replace(unroll_kw=1), AVX512))
    assert "does not apply to depthwise" in " ".join(problems(DW, gemm, AVX512))
    assert "algorithm='fft'; expected one of direct, gemm, winograd" in " ".join(
        problems(CONV, gemm.replace(algorithm="fft"), AVX512))
    # Winograd is an algorithm now (ARCHITECTURE change 34), with rules of its own: on an
    # NCHW conv it blocks the input by the vector lanes, and takes whole vectors of channels.
    wino = Conv2dSchedule(oc_block=32, ow_block=8, oh_block=4, ic_block=16, algorithm="winograd")
    assert problems(CONV, wino, AVX512) == []
    assert "ic_block=64 must be 16" in " ".join(
        problems(CONV, wino.replace(ic_block=64), AVX512))
    odd = conv2d_op(1, 60, 14, 14, 64, 3, 3, pads=1)
    assert "reads and writes nchw, or one blocked layout" in " ".join(
        problems(odd, wino, AVX512))
    # AVX2 has 16 registers and 8 lanes: the AVX-512 tile no longer fits.
    assert problems(CONV, ok, AVX512.with_isa("avx2"))


@pytest.mark.skipif(AVX512 is None, reason="needs an AVX-512 machine for its register count")
def test_plane_kernel_rules() -> None:
    assert AVX512 is not None
    plane = Conv2dSchedule(oc_block=16, ow_block=32, oh_block=4, ic_block=1, pack_w=0,
                           threads=2, parallel="oc")
    assert problems(DW, plane, AVX512) == []
    found = " | ".join(problems(DW, plane.replace(ow_block=24, parallel="pixel"), AVX512))
    assert "ow_block=24 must be a positive multiple of 16" in found
    assert "splits channels over threads: use parallel='oc'" in found
    assert "needs 34 vector registers" in " ".join(
        problems(DW, plane.replace(ow_block=64, oh_block=8), AVX512))
    # Only depthwise convolutions have a plane kernel.
    assert "plane kernel of depthwise convolutions only" in " ".join(
        problems(CONV, plane, AVX512))


def test_generate_refuses_an_illegal_schedule() -> None:
    with pytest.raises(ScheduleError):
        generate(CONV, Conv2dSchedule(oc_block=3, ow_block=4, ic_block=4), HW)


def test_defaults_are_legal_for_every_suite_conv_on_every_isa() -> None:
    ops = [w.op for suite in SUITES.values() for w in suite.workloads if w.op.kind == "conv2d"]
    ops += [CONV, DW, conv2d_op(2, 6, 1, 1, 10, 3, 3, pads=1, groups=2),
            conv2d_op(1, 5, 13, 4, 7, 2, 3, pads=(1, 0, 0, 2))]
    assert len(ops) > 40
    for isa in ("avx512", "avx2", "generic"):
        hw = dataclasses.replace(HW.with_isa(isa), cores=2)
        for op in ops:
            for threads in (1, 2):
                for algorithm in ("direct", "gemm"):
                    s = default_conv2d_schedule(op, hw, threads, algorithm)
                    found = problems(op, s, hw)
                    if algorithm == "gemm" and "does not apply to depthwise" in " ".join(found):
                        continue
                    assert not found, (isa, op.text, s, found)
        assert isinstance(default_schedule(CONV, hw), Conv2dSchedule)


@pytest.mark.parametrize("groups", [1, 32])
def test_analytic_estimate_charges_silu_not_the_cheap_steps(groups: int) -> None:
    from tunecache.costmodel.analytic import estimate

    def ms(epilogue: str) -> float:
        op = conv2d_op(1, 32, 28, 28, 32, 3, 3, pads=1, groups=groups, epilogue=epilogue)
        return estimate(op, default_conv2d_schedule(op, HW), HW).ms

    assert ms("bias") == ms("bias+relu") == ms("bias+clip6") < ms("bias+silu")


def test_blocked_tiles_are_charged_for_streaming_their_weights_from_l2() -> None:
    """On a blocked input whose weight panel outgrows L1, a tile's pixels amortise the
    weights it streams: a 14-pixel tile of one vector beats a 4-pixel tile of two (measured
    73 vs 39 GFLOP/s on a 512-channel 3x3 conv at 7x7, AVX2), on NCHW input the two stay
    close (within 10%), so the charge is the blocked layout's alone."""
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.costmodel.analytic import estimate

    avx2 = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=1,
                        l1d_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20,
                        cpu_model="test")
    text = ("conv2d(N=1,C=512,H=7,W=7,F=512,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,"
            "layout={0},out_layout={0},epilogue=bias+relu)")
    tall = Conv2dSchedule(oc_block=8, ow_block=7, oh_block=2, ic_block=8, unroll_kw=1)
    wide = Conv2dSchedule(oc_block=16, ow_block=4, oh_block=1, ic_block=8, unroll_kw=1)
    blocked = OpSignature.parse(text.format("nchw8c"))
    assert estimate(blocked, tall, avx2).seconds < 0.8 * estimate(blocked, wide, avx2).seconds
    plain = OpSignature.parse(text.format("nchw"))
    tall, wide = (dataclasses.replace(s, ic_block=256) for s in (tall, wide))
    ratio = estimate(plain, tall, avx2).seconds / estimate(plain, wide, avx2).seconds
    assert 0.8 < ratio < 1.25


def test_the_loop_order_pays_for_what_it_streams_again() -> None:
    """``fp`` walks a thread's pixels once per output-channel block: on a 56x56 input of 256
    channels (3.2 MB, past half of L2) it reads the input again per block and ``pf`` wins;
    on a 512-channel 3x3 at 7x7 the weights (9.4 MB) are what ``pf`` re-reads, so ``fp``
    wins."""
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.costmodel.analytic import estimate

    avx2 = HardwareSpec(arch="x86_64", isa="avx2", vector_bits=256, cores=2,
                        l1d_bytes=32 << 10, l2_bytes=512 << 10, l3_bytes=32 << 20,
                        cpu_model="test")
    wide = OpSignature.parse("conv2d(N=1,C=256,H=56,W=56,F=64,R=1,S=1,layout=nchw8c,"
                             "out_layout=nchw8c,epilogue=bias+relu)")
    s = Conv2dSchedule(oc_block=8, ow_block=14, oh_block=1, ic_block=8, threads=2,
                       parallel="pixel")
    fp, pf = (dataclasses.replace(s, loop_order=o) for o in ("fp", "pf"))
    assert estimate(wide, pf, avx2).seconds < estimate(wide, fp, avx2).seconds
    deep = OpSignature.parse("conv2d(N=1,C=512,H=7,W=7,F=512,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,"
                             "pad_r=1,layout=nchw8c,out_layout=nchw8c,epilogue=bias+relu)")
    s = Conv2dSchedule(oc_block=8, ow_block=7, oh_block=2, ic_block=8, threads=2)
    fp, pf = (dataclasses.replace(s, loop_order=o) for o in ("fp", "pf"))
    assert estimate(deep, fp, avx2).seconds < estimate(deep, pf, avx2).seconds


def _spec(isa: str) -> HardwareSpec:
    return HardwareSpec(arch="x86_64", isa=isa, vector_bits=512 if isa == "avx512" else 256,
                        cores=2, l1d_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20,
                        cpu_model="test", l3_shared_by=2)


RESNET_1X1 = conv2d_op(1, 64, 56, 56, 64, 1, 1, epilogue="bias+relu")


def test_a_gemm_1x1_panel_costs_its_read_and_a_split_by_channels_packs_every_panel() -> None:
    """On ResNet-50's 56x56 64->64 1x1 layer, implicit-GEMM tiles (an L1 panel per step)
    measured 120-143 us against 163-217 us for direct tiles (a blocked copy of the whole
    input), and splitting the GEMM by output channels makes every thread pack every panel."""
    from tunecache.costmodel.analytic import estimate

    hw = _spec("avx512")
    gemm = Conv2dSchedule(oc_block=8, ow_block=16, ic_block=64, algorithm="gemm", pack_w=1,
                          threads=2, parallel="pixel")
    direct = Conv2dSchedule(oc_block=16, ow_block=14, ic_block=64, threads=2, parallel="pixel")
    assert estimate(RESNET_1X1, gemm, hw).memory_s < estimate(RESNET_1X1, direct, hw).memory_s
    by_oc = dataclasses.replace(gemm, parallel="oc")
    assert estimate(RESNET_1X1, gemm, hw).seconds < estimate(RESNET_1X1, by_oc, hw).seconds


@pytest.mark.parametrize(("isa", "tile"), [("avx2", (4, 24)), ("avx512", (8, 16))])
def test_gemm_tiles_hide_the_fma_latency_of_the_isa(isa: str, tile: tuple[int, int]) -> None:
    """Implicit-GEMM tiles take the matmul's latency margin over the FMAs in flight: at AVX2
    (two 256-bit FMAs per cycle) a 12-accumulator 4 x 3 tile beats 8 x 1 (127 vs 158 us
    measured at two threads on the layer above, Zen 4), and the tiler's top-10 holds it; at
    AVX-512 on Zen 4 (one 512-bit FMA per cycle) 8 x 1 is not latency bound and stays in."""
    from tunecache.costmodel.analytic import estimate
    from tunecache.tuner.search.roller import candidates

    hw = _spec(isa)
    lanes = 16 if isa == "avx512" else 8
    base = Conv2dSchedule(oc_block=8, ow_block=lanes, ic_block=64, algorithm="gemm",
                          pack_w=1, threads=2, parallel="pixel")
    best = dataclasses.replace(base, oc_block=tile[0], ow_block=tile[1])
    assert estimate(RESNET_1X1, best, hw).seconds <= estimate(RESNET_1X1, base, hw).seconds
    if isa == "avx2":
        assert estimate(RESNET_1X1, best, hw).seconds < estimate(RESNET_1X1, base, hw).seconds
    top = {(c.schedule.algorithm, c.schedule.oc_block, c.schedule.ow_block)
           for c in candidates(RESNET_1X1, hw, k=10)}
    assert ("gemm", *tile) in top


def test_a_strided_1x1_walks_the_input_half_it_reads_and_one_vector_tiles_lose_at_avx2() -> None:
    """ResNet-50's 1024->2048 1x1 stride-2 layer, blocked, on the AVX2 Zen 3 VM at one
    thread: walking the input once per channel block (``fp``; the stride reads half of its
    rows, which stay in L2) ran 3.2-3.4 ms against 7.9-13 ms for walking the 8 MB of weights
    once per row block (``pf``); and a one-vector 14-pixel tile, a broadcast per FMA without
    AVX-512's embedded broadcast, lost to two- and three-vector tiles. At AVX-512 the
    one-vector tile keeps its rating."""
    from tunecache.costmodel.analytic import constants, micro_efficiency

    avx2 = dataclasses.replace(_spec("avx2"), cores=1, l2_bytes=512 << 10)
    op = OpSignature.parse("conv2d(N=1,C=1024,H=14,W=14,F=2048,R=1,S=1,stride_h=2,stride_w=2,"
                           "layout=nchw8c,out_layout=nchw8c,epilogue=bias)")
    s = Conv2dSchedule(oc_block=24, ow_block=4, ic_block=8, threads=1)
    fp, pf = (dataclasses.replace(s, loop_order=o) for o in ("fp", "pf"))
    assert estimate(op, fp, avx2).seconds < estimate(op, pf, avx2).seconds
    one = Conv2dSchedule(oc_block=8, ow_block=14, ic_block=8, threads=1, loop_order="fp")
    assert estimate(op, fp, avx2).compute_s < estimate(op, one, avx2).compute_s
    avx512 = constants(_spec("avx512"))
    assert micro_efficiency(14, 1, avx512) == micro_efficiency(7, 2, avx512)
    assert micro_efficiency(14, 1, constants(avx2)) < micro_efficiency(7, 2, constants(avx2))


def estimate_s(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> float:
    return estimate(op, s, hw).seconds


MOBILENET_STEM = OpSignature.parse(
    "conv2d(N=1,C=3,H=224,W=224,F=32,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
    "pad_r=1,epilogue=bias+relu)")


def test_a_stems_short_reduction_overlaps_tiles_and_one_channel_blocks_copy_rows() -> None:
    """MobileNet-v2's 3x3 stem (3 channels, 27 reduction steps) on the AVX2 Zen 3 VM, two
    threads: a 4-accumulator tile (8 channels x 4 pixels) ran it fastest, 0.26-0.29 ms, where
    the estimate had rated it 4x slower than 12-accumulator tiles (latency and load limits
    multiplied, no overlap between tiles). The tiler now offers one channel per block, whose
    copy is a row copy, and its top-k spends no slot on a variant tied with one it kept."""
    from tunecache.costmodel.analytic import constants, micro_efficiency
    from tunecache.tuner.search import candidates

    avx2 = _spec("avx2")
    c = constants(avx2)
    # A short reduction overlaps the next tile's chains; a long one does not.
    assert micro_efficiency(4, 1, c, steps=27) > micro_efficiency(4, 1, c)
    assert micro_efficiency(4, 1, c, steps=4096) == pytest.approx(micro_efficiency(4, 1, c),
                                                                  rel=0.01)
    # Latency-bound tiles leave load slots free: the limits do not compound.
    assert micro_efficiency(4, 1, c) == pytest.approx(0.92 * 4 / (c.fma_in_flight * 1.5))
    small = Conv2dSchedule(oc_block=8, ow_block=4, ic_block=1, threads=2, parallel="pixel")
    big = dataclasses.replace(small, oc_block=16, ow_block=6)
    ratio = estimate_s(MOBILENET_STEM, small, avx2) / estimate_s(MOBILENET_STEM, big, avx2)
    assert ratio < 2.0
    one, all3 = (dataclasses.replace(big, ic_block=b) for b in (1, 3))
    assert estimate_s(MOBILENET_STEM, one, avx2) < estimate_s(MOBILENET_STEM, all3, avx2)
    top = candidates(MOBILENET_STEM, avx2, k=10)
    assert any(t.schedule.ic_block == 1 for t in top)
    tiles = [(t.schedule.algorithm, t.schedule.oc_block, t.schedule.ow_block,
              t.schedule.oh_block, t.schedule.threads, round(t.estimate.seconds, 9)) for t in top]
    assert len(set(tiles)) == len(tiles)
    assert len({t[:4] for t in tiles}) >= 6


def test_a_blocked_3x3_prefers_its_kernel_width_loop_unrolled() -> None:
    """ResNet-50's blocked 3x3 layers on the AVX2 Zen 3 VM, one thread: the unrolled
    kernel-width loop ran faster in 24 of 28 (layer, tile) pairs, by 1.3-2.8x; on NCHW input
    with 64-channel blocks neither won, and the estimate keeps them equal there."""
    avx2 = dataclasses.replace(_spec("avx2"), cores=1)
    blocked = OpSignature.parse(
        "conv2d(N=1,C=128,H=56,W=56,F=128,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,"
        "pad_b=1,pad_r=1,layout=nchw8c,out_layout=nchw8c,epilogue=bias+relu)")
    s = Conv2dSchedule(oc_block=16, ow_block=6, ic_block=8, threads=1, loop_order="fp")
    rolled, unrolled = (dataclasses.replace(s, unroll_kw=u) for u in (0, 1))
    assert estimate_s(blocked, unrolled, avx2) < 0.8 * estimate_s(blocked, rolled, avx2)
    nchw = conv2d_op(1, 64, 56, 56, 64, 3, 3, pads=1, epilogue="bias+relu")
    rolled, unrolled = (dataclasses.replace(s, ic_block=64, unroll_kw=u) for u in (0, 1))
    assert estimate_s(nchw, unrolled, avx2) == estimate_s(nchw, rolled, avx2)


def test_xeons_with_two_fma512_units_price_a_broadcast_as_a_load() -> None:
    """On the AVX-512 Xeon VM (two 512-bit FMA units: 167 GFLOP/s per core at AVX-512, 80
    at AVX2) ResNet-50's five 256-channel 14x14 layers ran 0.87-0.93x as long with Winograd
    tiles of 8 tiles x 2 vectors as with 16 x 1, the pick under Zen 4's constants, where
    one 512-bit FMA a cycle leaves room for a broadcast per FMA."""
    from tunecache.compiler.backends.cpu import two_fma512_units
    from tunecache.costmodel.analytic import constants, estimate

    zen4 = _spec("avx512")
    xeon = dataclasses.replace(zen4, cpu_model="Intel(R) Xeon(R) Processor")
    assert two_fma512_units(xeon) and not two_fma512_units(zen4)
    assert not two_fma512_units(xeon.with_isa("avx2"))
    assert (constants(xeon).fma_in_flight, constants(zen4).fma_in_flight) == (8, 4)
    assert constants(xeon.with_isa("avx2")) == constants(zen4.with_isa("avx2"))
    op = OpSignature.parse("conv2d(N=1,C=256,H=14,W=14,F=256,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,"
                           "pad_r=1,layout=nchw16c,out_layout=nchw16c,epilogue=bias+relu)")
    tall = Conv2dSchedule(oc_block=16, ow_block=16, oh_block=4, ic_block=16,
                          algorithm="winograd", loop_order="fp")
    wide = dataclasses.replace(tall, oc_block=32, ow_block=8)
    assert estimate(op, wide, xeon).seconds < estimate(op, tall, xeon).seconds
    assert estimate(op, tall, zen4).seconds <= estimate(op, wide, zen4).seconds
