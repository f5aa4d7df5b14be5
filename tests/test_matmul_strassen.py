"""One level of Strassen's algorithm as a matmul schedule (``strassen=1``): the product table
against numpy, real kernels against the float64 reference on every ISA level the machine runs
(odd shapes, every operand layout, epilogues, K blocks, C blocks, two threads, weights packed
once), the illegal schedules, stable schedule ids, and the tiler's and estimate's side."""

from __future__ import annotations

import json

import numpy as np
import pytest
from kernel_support import bound_weights_problem, build_all, cached_kernel, poisoned_run_problem, sampled

from tunecache.compiler.codegen import generate
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import MatmulSchedule, matmul_op
from tunecache.compiler.kinds.matmul.emit_strassen import PRODUCTS, products
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs
from tunecache.compiler.schedule import problems, schedule_from_json
from tunecache.costmodel.analytic import estimate
from tunecache.tuner.search.roller import candidates

HW = local_spec()
T2 = min(2, HW.cores)
Case = tuple[OpSignature, MatmulSchedule, HardwareSpec]


def _blocks(x: np.ndarray, grid: int) -> dict[tuple[int, int], np.ndarray]:
    """The ``grid`` x ``grid`` blocks of ``x``, sizes rounded up, zero-padded to equal size."""
    h0, h1 = -(-x.shape[0] // grid), -(-x.shape[1] // grid)
    padded = np.zeros((grid * h0, grid * h1), x.dtype)
    padded[:x.shape[0], :x.shape[1]] = x
    return {(i, j): padded[i * h0:(i + 1) * h0, j * h1:(j + 1) * h1]
            for i in range(grid) for j in range(grid)}


@pytest.mark.parametrize(("m", "n", "k", "levels"),
                         [(4, 6, 8, 1), (5, 7, 3, 1), (9, 2, 11, 1), (8, 12, 16, 2),
                          (13, 6, 9, 2)])
def test_the_products_make_the_product(m: int, n: int, k: int, levels: int) -> None:
    """The table the emitter follows, run in numpy: the block sums, 7 (one level) or 49 (two)
    products and their signed contributions give A @ B, odd dimensions included."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    grid = 2 ** levels
    qa, qb = _blocks(a, grid), _blocks(b, grid)
    c = {q: np.zeros((qa[0, 0].shape[0], qb[0, 0].shape[1])) for q in qa}
    table = products(levels)
    assert len(table) == 7 ** levels
    if levels == 1:
        assert table == PRODUCTS
    for product in table:
        left = sum(sign * qa[i, j] for i, j, sign in product.a)
        right = sum(sign * qb[i, j] for i, j, sign in product.b)
        for i, j, sign in product.c:
            c[i, j] += sign * (left @ right)
    whole = np.block([[c[i, j] for j in range(grid)] for i in range(grid)])[:m, :n]
    np.testing.assert_allclose(whole, a @ b, rtol=1e-12, atol=1e-12)


def _ops() -> list[OpSignature]:
    return [
        matmul_op(64, 96, 64),
        # Odd in every dimension: the second halves are one row / column short.
        matmul_op(37, 51, 29, epilogue="bias+relu"),
        matmul_op(33, 97, 64, trans_a=True, trans_b=True, epilogue="bias+gelu_tanh"),
        matmul_op(48, 70, 41, trans_b=True, epilogue="gelu_erf"),
        matmul_op(50, 33, 100, trans_a=True, epilogue="bias"),
        # Two levels: quarter blocks, the last one short in every dimension.
        matmul_op(70, 66, 45, epilogue="bias+relu"),
        matmul_op(64, 130, 96, trans_b=True, epilogue="bias"),
    ]


def _variants(hw: HardwareSpec) -> list[MatmulSchedule]:
    lanes = hw.lanes
    base = MatmulSchedule(mr=4, nr=2 * lanes, kc=512, mc=512, nc=4096, strassen=1)
    return [
        base,
        # K blocks: the half of K in several blocks, each product adding into its quadrants.
        base.replace(kc=7, unroll=4),
        # C blocks smaller than the half: several blocks of rows and of columns.
        base.replace(mr=3, nr=lanes, mc=6, nc=2 * lanes),
        base.replace(threads=T2, parallel="n", mr=5, kc=16, nc=lanes * 2),
        # Two levels: 49 products into a 4x4 grid of C blocks.
        base.replace(strassen=2),
        base.replace(strassen=2, kc=5, mr=3, nr=lanes, mc=6, nc=lanes),
        base.replace(strassen=2, threads=T2, parallel="n", kc=9, unroll=4),
    ]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for isa in runnable_isas(HW):
        hw = HW.with_isa(isa)
        for op in _ops():
            cases += [(op, s, hw) for s in _variants(hw) if not problems(op, s, hw)]
    return cases


def test_every_variant_matches_the_reference_and_prepacked_weights() -> None:
    """Per case: the result within the float32 tolerance of the float64 reference (output
    poisoned and misaligned), twice, and the seven B sums packed once giving the same bits."""
    cases = sampled(_cases())
    assert len(cases) >= 20
    assert {s.strassen for _, s, _ in cases} == {1, 2}
    # Blocks of several row tiles spread the next B panel's prefetch over k steps (change 86).
    assert any("prefetch_plan(next, lines" in generate(op, s, hw).code for op, s, hw in cases)
    build_all(cases)
    for i, (op, s, hw) in enumerate(cases):
        kernel = cached_kernel(op, s, hw)
        inputs = random_inputs(op, seed=5)
        problem = poisoned_run_problem(kernel, op, inputs, offset=i % 3)
        if problem is None:
            problem = bound_weights_problem(kernel, inputs, kernel(*inputs))
        assert problem is None, f"{hw.isa} {op.text} {s}: {problem}"


def test_illegal_strassen_schedules_are_refused() -> None:
    s = MatmulSchedule(mr=4, nr=HW.lanes, kc=64, mc=64, nc=4 * HW.lanes, strassen=1)
    assert any("batch_matmul" in p for p in problems(batch_matmul_op(2, 64, 64, 64), s, HW))
    assert any("at least 16" in p and "K=8" in p for p in problems(matmul_op(64, 64, 8), s, HW))
    op = matmul_op(64, 64, 64)
    assert any("pack_a=1" in p for p in problems(op, s.replace(pack_a=0), HW))
    assert any("loop_order=jpi" in p for p in problems(op, s.replace(loop_order="ipj"), HW))
    assert any("expected one of 0, 1, 2" in p for p in problems(op, s.replace(strassen=3), HW))
    two = s.replace(strassen=2)
    assert any("at least 32" in p and "N=31" in p
               for p in problems(matmul_op(64, 31, 64), two, HW))
    assert not problems(matmul_op(32, 32, 32), two, HW)
    if HW.cores > 1:
        assert any("parallel=n" in p
                   for p in problems(op, s.replace(threads=2, parallel="m"), HW))
    assert not problems(op, s, HW)


def test_schedules_stored_before_the_knob_keep_their_text_and_id() -> None:
    """``strassen`` is left out of a schedule's JSON while 0: every matmul schedule stored
    before it existed reads back equal, with the same id; 1 round-trips."""
    classic = MatmulSchedule(mr=6, nr=16, kc=256, mc=72, nc=512)
    stored = ('{"family":"matmul","kc":256,"loop_order":"jpi","mc":72,"mr":6,"nc":512,'
              '"nr":16,"pack_a":1,"pack_b":1,"parallel":"m","threads":1,"unroll":1}')
    assert classic.to_json() == stored
    assert schedule_from_json(stored) == classic
    fast = classic.replace(strassen=1)
    assert json.loads(fast.to_json())["strassen"] == 1
    assert schedule_from_json(fast.to_json()) == fast
    assert fast.schedule_id != classic.schedule_id
    assert str(fast).endswith("strassen1")
    two = classic.replace(strassen=2)
    assert schedule_from_json(two.to_json()) == two and two.schedule_id != fast.schedule_id


ZEN4 = HardwareSpec(arch="x86_64", isa="avx512", vector_bits=512, cores=2, l1d_bytes=32 << 10,
                    l2_bytes=1 << 20, l3_bytes=32 << 20, cpu_model="AMD EPYC 9B14",
                    l3_shared_by=2)
"""The AVX-512 Zen 4 VM, where one level of Strassen ran BERT's FFN 0.85-0.93x the plain
kernel's time (ARCHITECTURE change 69); a Xeon charges its weight stream and ranks it lower
(change 84, ``test_a_xeon_pays_for_streaming_weights_so_strassen_and_row_splits_lose_there``)."""


def test_the_tiler_proposes_strassen_where_it_saves_work() -> None:
    """A BERT-sized projection gets legal strassen candidates of both levels, the first
    estimated faster on Zen 4 than the same micro-tile without it; a matmul with a dimension
    under 128 gets one level only, a small one none."""
    big = matmul_op(128, 3072, 768, epilogue="bias")
    top = candidates(big, ZEN4, k=12, threads=1)
    fast = [c for c in top if c.schedule.strassen]
    assert {c.schedule.strassen for c in fast} == {1, 2}
    assert all(not problems(big, c.schedule, ZEN4) for c in fast)
    s = fast[0].schedule
    classic = s.replace(strassen=0, mc=128, nc=3072)
    assert estimate(big, s, ZEN4).seconds < estimate(big, classic, ZEN4).seconds
    mid = matmul_op(96, 768, 768)
    for hw in (ZEN4, HW):
        assert {c.schedule.strassen for c in candidates(mid, hw, k=50, threads=1)} == {0, 1}
    small = matmul_op(24, 32, 40)
    assert not any(c.schedule.strassen for c in candidates(small, HW, k=50, threads=1))


def _projection_model() -> object:
    """x[1, 96, 160] @ W[160, 200] + b, then a ReLU: a transformer projection, odd halves
    (48 x 100 x 80) included."""
    from onnx_support import Builder

    b = Builder(17, seed=3)
    x = b.input("x", [1, 96, 160])
    y = b.node("Add", [b.node("MatMul", [x, b.weight(160, 200)]), b.weight(200)])
    return b.model([b.node("Relu", [y])], "projection")


def test_a_strassen_schedule_served_from_the_store_runs_in_the_compiled_model(
        tmp_path) -> None:
    """The cache's best schedule for the projection is a measured strassen=1 one: the
    compile serves it, packs the seven B sums once, and the model equals onnxruntime."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx_support import assert_close, ort_run, random_feeds

    from tunecache.cache.store import Store
    from tunecache.tuner.deploy import compile_model
    from tunecache.tuner.measure.records import to_records
    from tunecache.tuner.measure.runner import Candidate, Runner, TimingConfig

    model = _projection_model()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    store = Store(tmp_path / "store")
    op = next(e.op for e in compile_model(path, store=store, policy="cache-only").plan
              if e.op.kind == "matmul")
    fast = MatmulSchedule(mr=4, nr=2 * HW.lanes, kc=64, mc=48, nc=4 * HW.lanes, strassen=1)
    with Runner(HW, TimingConfig(min_time_s=0.01, min_repeats=3)) as runner:
        results = runner.measure([Candidate(op, fast)])
    assert results[0].ok, results[0].error
    store.append(to_records(results, HW))
    store.publish(HW.hw_id)
    compiled = compile_model(path, store=store, policy="balanced")
    served = next(e for e in compiled.plan if e.op.kind == "matmul")
    assert served.action == "cache" and served.schedule == fast
    feeds = random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])


def test_refinement_switches_strassen_only_where_the_tiler_proposes_it() -> None:
    from tunecache.tuner.kinds import tuner_kind

    neighbours = tuner_kind("matmul").neighbours
    classic = MatmulSchedule(mr=4, nr=2 * HW.lanes, kc=256, mc=64, nc=4 * HW.lanes)
    big = matmul_op(128, 768, 768, epilogue="bias")
    assert classic.replace(strassen=1) in neighbours(big, classic, HW)
    assert classic.replace(strassen=2) in neighbours(big, classic, HW)
    assert classic in neighbours(big, classic.replace(strassen=1), HW)
    assert classic.replace(strassen=1) in neighbours(big, classic.replace(strassen=2), HW)
    mid = matmul_op(96, 768, 768)
    assert {s.strassen for s in neighbours(mid, classic, HW)} == {0, 1}
    small = matmul_op(32, 48, 40)
    assert not any(s.strassen for s in neighbours(small, classic, HW))


def test_two_levels_are_not_proposed_for_weights_too_large_to_triple() -> None:
    """GPT-2's LM head (154 MB of weights): one level only, since two would take 3.06x."""
    head = matmul_op(128, 50257, 768, trans_b=True)
    assert {c.schedule.strassen for c in candidates(head, HW, k=60, threads=1)} == {0, 1}
