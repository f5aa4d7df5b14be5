"""Generated kernels against a float64 numpy reference, on every ISA level this machine runs."""

from __future__ import annotations

import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from kernel_support import assembly, bound_weights_problem, sampled

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, load_kernel, random_inputs, reference
from tunecache.compiler.schedule import problems

HW = local_spec()
ISAS = runnable_isas(HW)


def sched(hw: HardwareSpec, mr: int, nv: int, kc: int, mcm: int = 2, ncm: int = 2,
          **kw) -> MatmulSchedule:
    nr = nv * hw.lanes
    return MatmulSchedule(mr=mr, nr=nr, kc=kc, mc=mr * mcm, nc=nr * ncm, **kw)


M = matmul_op
BM = batch_matmul_op

# (op, schedule builder): spread over shapes (1s, primes, non-multiples), layouts, epilogues,
# packing, loop orders, unroll and threads.
CASES = [
    (M(1, 1, 1), lambda h: sched(h, 1, 1, 8)),
    (M(1, 1000, 64, epilogue="bias"), lambda h: sched(h, 1, 2, 512, pack_a=0, pack_b=0)),
    (M(13, 17, 19), lambda h: sched(h, 4, 1, 8)),
    (M(31, 37, 41, trans_a=True), lambda h: sched(h, 5, 2, 16, pack_a=0)),
    (M(29, 67, 23, trans_b=True, epilogue="relu"), lambda h: sched(h, 3, 1, 7, unroll=4)),
    (M(64, 48, 97, trans_a=True, trans_b=True, epilogue="bias+relu"),
     lambda h: sched(h, 6, 2, 32, loop_order="ipj")),
    (M(100, 130, 70, epilogue="bias+relu"),
     lambda h: sched(h, 4, 2, 33, pack_b=0, unroll=8)),
    (M(97, 61, 200), lambda h: sched(h, 2, 3, 64, pack_a=0, pack_b=0, loop_order="ipj")),
    (M(128, 128, 128, epilogue="bias"),
     lambda h: sched(h, 4, 2, 40, threads=2, parallel="m")),
    (M(37, 150, 53, trans_b=True, epilogue="relu"),
     lambda h: sched(h, 3, 1, 16, threads=2, parallel="n")),
    (M(70, 90, 45), lambda h: sched(h, 4, 1, 20, threads=2, parallel="n", loop_order="ipj",
                                     pack_a=0)),
    (M(66, 33, 77, trans_a=True), lambda h: sched(h, 4, 1, 30, threads=2, parallel="m",
                                                   loop_order="ipj", pack_b=0)),
    (BM(3, 17, 19, 23, epilogue="bias"), lambda h: sched(h, 4, 1, 8)),
    (BM(4, 9, 33, 12, shared="a", trans_b=True), lambda h: sched(h, 3, 2, 5, threads=2,
                                                                  parallel="batch")),
    (BM(2, 21, 5, 40, shared="b", trans_a=True, epilogue="relu"),
     lambda h: sched(h, 5, 1, 16, threads=2, parallel="n", pack_b=0)),
    (BM(5, 1, 1, 1), lambda h: sched(h, 1, 1, 1, threads=2, parallel="batch")),
    # loop_order=dot: C = A·Bᵀ as dot products along K (K not a multiple of the lanes).
    (M(1, 1000, 37, trans_b=True, epilogue="bias"),
     lambda h: sched(h, 1, 4, 8, pack_a=0, pack_b=0, loop_order="dot")),
    (M(7, 45, 70, trans_b=True, epilogue="bias+relu"),
     lambda h: sched(h, 3, 2, 8, pack_a=0, pack_b=0, loop_order="dot", threads=2, parallel="n")),
    (M(9, 13, 5, trans_b=True, epilogue="relu"),
     lambda h: sched(h, 2, 3, 8, pack_a=0, pack_b=0, loop_order="dot", threads=2, parallel="m",
                     unroll=4)),
    (BM(3, 5, 17, 33, trans_b=True, shared="b", epilogue="bias"),
     lambda h: sched(h, 2, 2, 8, pack_a=0, pack_b=0, loop_order="dot", threads=2,
                     parallel="batch")),
    # GELU in the epilogue (the FFN's, fused from an elementwise step): register tiles, the
    # scalar edge loops (FERF, FTANH) and the dot kernel's scalar epilogue.
    (M(29, 67, 23, epilogue="bias+gelu_erf"), lambda h: sched(h, 3, 1, 7, unroll=4)),
    (M(37, 150, 53, trans_a=True, epilogue="gelu_tanh"),
     lambda h: sched(h, 3, 1, 16, threads=2, parallel="n", pack_b=0)),
    (M(7, 45, 70, trans_b=True, epilogue="bias+gelu_tanh"),
     lambda h: sched(h, 3, 2, 8, pack_a=0, pack_b=0, loop_order="dot")),
    (BM(2, 21, 19, 12, epilogue="bias+gelu_erf"), lambda h: sched(h, 4, 1, 8)),
]


def _cases() -> list[tuple[OpSignature, MatmulSchedule, HardwareSpec]]:
    out = []
    for isa in ISAS:
        hw = HW.with_isa(isa)
        for op, make in CASES:
            s = make(hw)
            if s.threads > hw.cores:
                s = s.replace(threads=hw.cores)
            out.append((op, s, hw))
    return out


def _build_all(cases):
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: build(generate(*c)), cases))


def _check(op: OpSignature, artifact, s: MatmulSchedule) -> str | None:
    kernel = load_kernel(op, artifact)
    inputs = random_inputs(op, seed=7)
    out = np.full(op.arguments()[-1].shape, np.nan, dtype=np.float32)
    kernel(*inputs, out=out)
    first = check_result(op, inputs, out, reference(op, inputs))
    if first:
        return first
    # A second call must give the same answer (workspace reuse, no stale state).
    again = kernel(*inputs)
    if not np.array_equal(again, out):
        return "second call differs from the first"
    shares_b = op.kind == "matmul" or op.shared == "b" or op.batch == 1
    expect = bool(s.pack_b) and s.loop_order != "dot" and shares_b
    if kernel.prepacks_weights != expect:
        return f"prepacks_weights is {kernel.prepacks_weights}, expected {expect}"
    return bound_weights_problem(kernel, inputs, out) if expect else None


def _assert_all_correct(cases) -> None:  # type: ignore[no-untyped-def]
    failures = []
    for (op, s, hw), art in zip(cases, _build_all(cases), strict=True):
        problem = _check(op, art, s)
        if problem:
            failures.append(f"{hw.isa} {op.text} {s}: {problem}")
    assert not failures, "\n".join(failures)


def test_every_case_is_legal() -> None:
    for op, s, hw in _cases():
        assert not problems(op, s, hw), (op, s, hw.isa)


def test_kernels_match_numpy_on_every_isa() -> None:
    cases = sampled(_cases())
    _assert_all_correct(cases)


def test_random_schedules_and_shapes() -> None:
    rng = random.Random(20261122)
    cases = []
    while len(cases) < 24:
        hw = HW.with_isa(rng.choice(ISAS))
        dims = [rng.choice([1, 2, 3, 7, 16, 31, 33, 64, 97]) for _ in range(3)]
        kw = dict(trans_a=rng.random() < 0.5, trans_b=rng.random() < 0.5,
                  epilogue=rng.choice(["none", "bias", "relu", "bias+relu"]))
        op = (M(*dims, **kw) if rng.random() < 0.6 else
              BM(rng.choice([1, 3]), *dims, shared=rng.choice(["none", "a", "b"]), **kw))
        nv, mr = rng.randint(1, 3), rng.randint(1, 8)
        s = MatmulSchedule(
            mr=mr, nr=nv * hw.lanes, kc=rng.choice([1, 5, 16, 64]), mc=mr * rng.randint(1, 3),
            nc=nv * hw.lanes * rng.randint(1, 3), pack_a=rng.randint(0, 1),
            pack_b=rng.randint(0, 1), loop_order=rng.choice(["jpi", "ipj"]),
            unroll=rng.choice([1, 2, 4]), threads=rng.randint(1, min(2, hw.cores)),
            parallel=rng.choice(["m", "n", "batch"]),
        )
        if not problems(op, s, hw):
            cases.append((op, s, hw))
    _assert_all_correct(cases)


def test_source_is_deterministic_and_carries_provenance() -> None:
    op, make = CASES[5]
    a, b = generate(op, make(HW), HW), generate(op, make(HW), HW)
    assert a.code == b.code and a.source_hash == b.source_hash
    assert op.text in a.code and "codegen v" in a.code
    assert "-ffast-math" not in a.flags
    assert "-ffp-contract=fast" in a.flags and "-std=gnu11" in a.flags
    assert "-falign-loops=64" in a.flags


def test_micro_kernel_loop_starts_on_a_cache_line(tmp_path) -> None:
    """The k loop of the local ISA's widest register tile is aligned to 64 bytes, so the
    kernel's speed does not depend on the code placed before it (ARCHITECTURE change 64),
    and its tile prefetches the C rows it adds to."""
    lanes = HW.lanes
    mr, nv = {"avx512": (14, 2), "avx2": (6, 2)}.get(HW.isa, (6, 2))
    kernel = generate(M(256, 256, 256), MatmulSchedule(mr=mr, nr=nv * lanes, kc=128,
                                                      mc=mr * 8, nc=256), HW)
    # Every 64-byte line of each C row, plus the row's last float (its start may be unaligned).
    assert kernel.code.count("__builtin_prefetch(c + ") == mr * (nv * lanes // 16 + 1)
    asm = assembly(kernel, tmp_path)
    if "vfmadd" not in asm:
        pytest.skip("the portable kernel's FMAs are not recognisable in this target's assembly")
    # Each block is its label's body preceded by the directives before the label.
    pieces = re.split(r"^(\.L\w+):\s*$", asm, flags=re.MULTILINE)
    loops = [(pieces[i - 1], pieces[i + 1]) for i in range(1, len(pieces) - 1, 2)
             if len(re.findall(r"vfmadd\w+", pieces[i + 1])) >= mr * nv]
    assert loops, f"no k loop with {mr * nv} FMAs found"
    for before, _ in loops:
        assert re.search(r"\.p2align 6\s*(\.p2align \d+\s*)?$", before), before[-80:]


_PLAN_HARNESS = """\
#include <string.h>
#define MIN(a, b) ((a) < (b) ? (a) : (b))
static const float *base_;
static long *hits_, *early_, step_;
static void mark(const void *p) {
  long l = ((const float *)p - base_) / 16;
  if (l >= 0 && l < 8192) { hits_[l]++; if (step_ < 0) early_[l]++; }
}
#define __builtin_prefetch(addr, rw, locality) mark(addr)
%s
/* What a row tile's micro-kernel does with its plan: n tiles, k steps each. */
void cover(long lines, long n, long k, long *hits, long *early) {
  static float panel[8192 * 16];
  base_ = panel; hits_ = hits; early_ = early;
  for (long ir = 0; ir < n; ir++) {
    long npf, pfs;
    step_ = -1;
    const float *pf = prefetch_plan(panel, lines, ir, n, k, &npf, &pfs);
    for (long p = 0; p < npf; p++) { step_ = p; %s }
  }
}
"""


def test_the_prefetch_plan_covers_the_next_panel_spread_over_the_k_steps(tmp_path) -> None:
    """The row tiles of a block, together, prefetch every line of the next B micro-panel
    and nothing past it; each spreads its share over its k steps, and only a share of more
    lines than steps is partly prefetched up front (ARCHITECTURE change 86)."""
    from tunecache.compiler.backends.cpu.clib import compile_library
    from tunecache.compiler.kinds.matmul import emit

    cover = compile_library(_PLAN_HARNESS % (emit.PREFETCH_PLAN, emit.SPREAD_STEP),
                            ("-O1",)).function("cover", ("long",) * 3 + ("ptr", "ptr"), "void")
    for nr_lines, k, tiles in [(2, 256, 8), (3, 128, 8), (2, 384, 16), (6, 384, 32),
                               (6, 256, 2), (4, 7, 3), (1, 1, 1), (2, 5, 9)]:
        lines = nr_lines * k  # an NR-wide panel k deep: NR/16 lines a step
        hits, early = np.zeros(8192, np.int64), np.zeros(8192, np.int64)
        cover(lines, tiles, k, hits, early)
        case = (nr_lines, k, tiles)
        assert (hits[:lines] > 0).all(), case
        assert not hits[lines + 1:].any(), case  # the last step may reach one line on
        share = -(-lines // tiles)
        if share <= k:
            assert not early.any(), case
        else:
            assert early.sum() <= tiles * (share - k), case


@pytest.mark.skipif("avx512" not in ISAS, reason="needs an AVX-512 machine")
def test_avx512_micro_kernel_is_fma_dense_without_spills(tmp_path) -> None:
    """The 14x32 micro-kernel's k loop: 28 zmm FMAs and no vector register spills."""
    op = M(512, 512, 512)
    kernel = generate(op, MatmulSchedule(mr=14, nr=32, kc=256, mc=224, nc=512), HW)
    asm = assembly(kernel, tmp_path)
    # Basic blocks start at local labels; the k loop is the block with the FMAs.
    blocks = re.split(r"^\.L\w+:\s*$", asm, flags=re.MULTILINE)
    dense = [b for b in blocks if len(re.findall(r"vfmadd\w+\s[^\n]*%zmm", b)) >= 28]
    assert dense, "no k loop with 28 zmm FMAs found"
    spills = [line for b in dense for line in b.splitlines()
              if "%zmm" in line and ("(%rsp)" in line or "(%rbp)" in line)]
    assert not spills, f"vector registers spilled in the k loop: {spills[:3]}"


@pytest.mark.parametrize(("order", "threads", "parallel", "pack_a"),
                         [("jpi", 1, "m", 1), ("jpi", 2, "n", 1), ("jpi", 2, "n", 0),
                          ("jpi", 2, "m", 1), ("ipj", 2, "n", 1)])
def test_packed_b_blocks_prefetch_the_next_panel_and_stay_right(
        order: str, threads: int, parallel: str, pack_a: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row tile of a packed-B block prefetches its share of the next B micro-panel
    (the next block's, across block edges with pre-packed weights; ARCHITECTURE change 81),
    spread over its k steps by every micro-kernel variant it calls (change 86);
    over several column blocks a split stays static (a balanced one has its own test).
    Over several column and K blocks, edge panels and every thread split, the kernel run on
    weights packed once matches the reference."""
    from tunecache.compiler.kinds.matmul import emit
    from tunecache.compiler.kinds.matmul.emit import dynamic_split
    from tunecache.compiler.runtime import compile_kernel

    op = M(45, 3 * HW.lanes * 4 + 5, 70, epilogue="bias")
    s = sched(HW, 4, 2, 16, mcm=3, ncm=2, loop_order=order, threads=threads,
              parallel=parallel, pack_a=pack_a)
    assert not problems(op, s, HW)
    code = generate(op, s, HW).code
    assert code.count("prefetch_plan(next, lines, ir, mp, k_cur, &npf, &pfs)") == 1
    assert code.count(emit.SPREAD_STEP) == (1 if pack_a else 2) and "b_after" in code
    assert not dynamic_split(op, s)  # several column blocks: the split stays static
    assert "claim_other(" not in code
    in_place = generate(op, MatmulSchedule(mr=4, nr=2 * HW.lanes, kc=16, mc=12,
                                           nc=4 * HW.lanes, pack_b=0), HW).code
    assert "prefetch_plan" not in in_place and emit.SPREAD_STEP not in in_place
    # One row tile per block (a decode step's M=1): the weights stream through it alone, and
    # nothing prefetches them (M=1 matmuls ran 1.06-1.14x as long with it).
    row = generate(M(1, op.dim("N"), op.dim("K"), epilogue="bias"), s.replace(mr=1, mc=1),
                   HW).code
    assert "prefetch_plan" not in row and emit.SPREAD_STEP not in row
    kernel = compile_kernel(op, s, HW)
    a, b, bias = random_inputs(op)
    np.testing.assert_allclose(kernel.bind_weights(b)(a, bias), reference(op, (a, b, bias)),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(kernel(a, b, bias), reference(op, (a, b, bias)), rtol=1e-4,
                               atol=1e-4)


def test_a_dynamic_split_needs_one_column_block_and_a_small_a_block(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A column split over pre-packed weights is balanced at run time when the weights are
    one column block and a K block of op(A) fits ``DYNAMIC_A_MAX_BYTES`` (or A is read in
    place); otherwise, and with ``DYNAMIC_SPLIT`` off, it stays static."""
    from tunecache.compiler.kinds.matmul import emit
    from tunecache.compiler.kinds.matmul.emit import DYNAMIC_A_MAX_BYTES, dynamic_split

    s = MatmulSchedule(mr=2, nr=32, kc=128, mc=128, nc=768, threads=2, parallel="n")  # legal on AVX2 too
    rows = DYNAMIC_A_MAX_BYTES // (4 * 128)
    assert dynamic_split(M(rows, 768, 512), s)
    assert "claim_other(" in generate(M(rows, 768, 512), s, HW).code
    assert not dynamic_split(M(rows + 8, 768, 512), s)
    assert dynamic_split(M(rows + 8, 768, 512), s.replace(pack_a=0))
    assert not dynamic_split(M(128, 816, 512), s)  # two column blocks
    assert "claim_other(" not in generate(M(128, 816, 512), s, HW).code
    assert not dynamic_split(M(128, 768, 512), s.replace(threads=1, parallel="m"))
    monkeypatch.setattr(emit, "DYNAMIC_SPLIT", False)
    assert not dynamic_split(M(128, 768, 512), s)


@pytest.mark.timeout(300, method="thread")  # a claim waiting in C for a thread that never comes
@pytest.mark.parametrize(("pack_a", "batch", "kc"), [(1, 1, 16), (0, 1, 16), (1, 3, 16),
                                                    (1, 3, 128)])
def test_a_balanced_split_stays_right_over_many_calls(pack_a: int, batch: int,
                                                      kc: int) -> None:
    """Over pre-packed weights in one column block, two threads run their static shares
    through the first K blocks and hand out the last K block's units (ARCHITECTURE change
    87); with edge panels, partial tiles and an epilogue, one K block or several, one batch
    item or several sharing the weights, every one of many calls (each a different
    interleaving of the claims) matches the reference."""
    from tunecache.compiler.kinds.matmul.emit import dynamic_split
    from tunecache.compiler.runtime import compile_kernel

    n = 5 * HW.lanes + 3
    op = (M(45, n, 70, epilogue="bias+relu") if batch == 1
          else BM(batch, 45, n, 70, shared="b", epilogue="bias+relu"))
    s = sched(HW, 4, 1, kc, mcm=3, ncm=8, threads=2, parallel="n", pack_a=pack_a)
    assert not problems(op, s, HW) and dynamic_split(op, s)
    kernel = compile_kernel(op, s, HW)
    a, b, bias = random_inputs(op)
    expected = reference(op, (a, b, bias))
    bound = kernel.bind_weights(b)
    for _ in range(40):
        np.testing.assert_allclose(bound(a, bias), expected, rtol=1e-4, atol=1e-4)


_CLAIM_HARNESS = """\
#include <omp.h>
%s
/* Claim as a thread of the team does: its own units from the front, then others'. */
long drain(long *slots, const long *progress, long ready, int tid, int nth, long *units) {
  long n = 0, u;
  for (;;) {
    if (!claim_own(&slots[tid], &u) && !claim_other(slots, progress, ready, tid, nth, &u))
      return n;
    units[n++] = u;
  }
}
/* Two threads, the second slower before it reports progress: returns the rounds in which
   a unit was claimed other than once, or taken before its owner was ready. */
long race(long units, long rounds) {
  long slots[2], progress[2], count[256], bad = 0;
  for (long r = 0; r < rounds; r++) {
    for (long u = 0; u < units; u++) count[u] = 0;
    long early = 0;
    #pragma omp parallel num_threads(2)
    {
      int tid = omp_get_thread_num();
      long lo = tid ? units / 2 : 0, hi = tid ? units : units / 2, u;
      __atomic_store_n(&slots[tid], RANGE(lo, hi), __ATOMIC_RELEASE);
      __atomic_store_n(&progress[tid], 0L, __ATOMIC_RELEASE);
      #pragma omp barrier
      for (volatile long i = 0; i < (tid ? 20000 * (r %% 4) : 0); i++) {}
      __atomic_store_n(&progress[tid], 1L, __ATOMIC_RELEASE);
      for (;;) {
        int own = claim_own(&slots[tid], &u);
        if (!own && !claim_other(slots, progress, 1, tid, 2, &u)) break;
        if (!own && __atomic_load_n(&progress[1 - tid], __ATOMIC_ACQUIRE) < 1)
          __atomic_fetch_add(&early, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&count[u], 1, __ATOMIC_RELAXED);
      }
    }
    for (long u = 0; u < units; u++) early += count[u] != 1;
    bad += early != 0;
  }
  return bad;
}
"""


@pytest.mark.timeout(300, method="thread")
def test_the_balanced_split_claims_own_units_first_then_the_back_of_the_fullest(
        tmp_path: Path) -> None:
    """The claims behind change 87: a thread takes its own units front first, then others'
    from the back, the fullest range first, and none from an owner not yet done with the
    earlier K blocks; raced by two OpenMP threads, every unit goes exactly once."""
    from tunecache.compiler.backends.cpu.clib import compile_library
    from tunecache.compiler.kinds.matmul import emit

    lib = compile_library(_CLAIM_HARNESS % emit.STEAL_CLAIM, ("-O2", "-fopenmp"))
    drain = lib.function("drain", ("ptr", "ptr", "long", "int", "int", "ptr"), "long")
    race = lib.function("race", ("long", "long"), "long")
    ranges = [(0, 4), (4, 6), (6, 12)]
    slots = np.array([lo << 32 | hi for lo, hi in ranges], np.int64)
    progress = np.array([1, 1, 1], np.int64)
    units = np.zeros(16, np.int64)
    n = drain(slots, progress, 1, 0, 3, units)
    taken = [int(u) for u in units[:n]]
    assert sorted(taken) == list(range(12))
    assert taken[:5] == [0, 1, 2, 3, 11]  # own front first, then the fullest range's back
    for lo, hi in ranges[1:]:
        theirs = [u for u in taken if lo <= u < hi]
        assert theirs == sorted(theirs, reverse=True)
    assert race(64, 400) == 0
