"""The low-precision matmul on AMX tiles (``loop_order=amx``, issue 53): exact int8 and
float32-accumulated bf16 on every tile shape, the same answers as the vector kernels, the
loader's request for the tile state, and the schedules refused where there are no tiles.
Generating and checking schedules needs no AMX; running the kernels does (skipped without)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tunecache.compiler.backends.cpu import tiles
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import HardwareError
from tunecache.compiler.hardware import cpu_features, local_spec, runnable_isas
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, problems
from tunecache.tuner.measure.runner import Candidate, Runner, TimingConfig
from tunecache.tuner.search.roller import candidates

HW = local_spec()
AMX = {"amx_tile", "amx_int8", "amx_bf16"} <= set(cpu_features())
needs_amx = pytest.mark.skipif(not AMX, reason="needs a CPU with AMX-INT8 and AMX-BF16")
AVX512 = "avx512" in runnable_isas(HW)
# A spec with tiles, for generating and checking schedules (any machine), and one without.
TILED = replace(HW.with_isa("avx512") if AVX512 else HW, isa="avx512", vector_bits=512,
                features=("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni"))
UNTILED = replace(TILED, features=("avx512_bf16", "avx512_vnni"))
SHAPES = [(1, 1, 1), (33, 40, 17), (7, 129, 64), (64, 48, 200), (100, 70, 300)]
TILE_SHAPES = [(32, 32), (16, 48), (16, 16), (32, 16)]


def _tiled(op: OpSignature, mr: int, nr: int, threads: int) -> MatmulSchedule:
    s = default_schedule(op, TILED, threads)
    assert isinstance(s, MatmulSchedule) and s.loop_order == "amx"
    return s.replace(mr=mr, nr=nr, mc=mr, nc=s.nc // nr * nr or nr)


@needs_amx
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("mr", "nr"), TILE_SHAPES)
def test_int8_tiles_are_exact(m: int, n: int, k: int, mr: int, nr: int) -> None:
    op = matmul_op(m, n, k, dtype="int8")
    a, b = random_inputs(op, seed=k)
    out = compile_kernel(op, _tiled(op, mr, nr, 2), HW)(a, b)
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize(("m", "n", "k", "threads", "split"), [
    (128, 3072, 768, 2, "n"),  # 2.4 MB of int8 weights: more than L2, each thread a share
    (128, 768, 768, 2, "m"),   # 0.6 MB: row tiles
    (1, 768, 768, 2, "n"),     # one row tile for two threads
    (128, 3072, 768, 1, "m"),
])
def test_tile_matmuls_split_by_columns_where_the_weights_outgrow_l2(
        m: int, n: int, k: int, threads: int, split: str) -> None:
    op = matmul_op(m, n, k, dtype="int8")
    s = default_schedule(op, replace(TILED, l2_bytes=2 << 20), threads)  # an AMX Xeon's L2
    assert isinstance(s, MatmulSchedule) and s.loop_order == "amx" and s.parallel == split


@needs_amx
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_int8_tiles_split_by_columns_are_exact(m: int, n: int, k: int) -> None:
    op = matmul_op(m, n, k, dtype="int8")
    a, b = random_inputs(op, seed=k)
    out = compile_kernel(op, _tiled(op, 32, 32, 2).replace(parallel="n"), HW)(a, b)
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


@needs_amx
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_bf16_tiles_match_the_vector_kernel(m: int, n: int, k: int) -> None:
    op = matmul_op(m, n, k, dtype="bf16", a_type="float32", epilogue="bias+gelu_tanh")
    inputs = random_inputs(op, seed=n)
    tiled = compile_kernel(op, _tiled(op, 32, 32, 1), HW)(*inputs)
    assert check_result(op, inputs, tiled, reference(op, inputs)) is None
    vectors = compile_kernel(op, default_schedule(op, UNTILED, 1), UNTILED)(*inputs)
    np.testing.assert_allclose(tiled, vectors, rtol=1e-5, atol=1e-5 * np.abs(vectors).max())


@needs_amx
@pytest.mark.parametrize("a_type", ["float32", "dynamic"])
def test_int8_tiles_quantize_a_and_dequantize_like_the_vector_kernel(a_type: str) -> None:
    op = matmul_op(45, 70, 130, dtype="int8", a_type=a_type, epilogue="dequant+bias+relu")
    inputs = random_inputs(op, seed=9)
    tiled = compile_kernel(op, _tiled(op, 32, 32, 2), HW)(*inputs)
    vectors = compile_kernel(op, default_schedule(op, UNTILED, 2), UNTILED)(*inputs)
    np.testing.assert_array_equal(tiled, vectors)  # the same integers, the same epilogue


@needs_amx
def test_packed_weights_and_the_measurement_worker_run_tiles() -> None:
    op = matmul_op(19, 70, 45, dtype="int8")
    a, b = random_inputs(op, seed=7)
    kernel = compile_kernel(op, default_schedule(op, HW, 2), HW)
    bound = kernel.bind_weights(b)
    np.testing.assert_array_equal(bound(a), a.astype(np.int64) @ b.astype(np.int64))
    timing = TimingConfig(repeat_s=0.001, min_repeats=2, max_repeats=3, min_time_s=0.0)
    with Runner(HW, timing) as runner:  # another process: it asks for the tile state itself
        [result] = runner.measure([Candidate(op, default_schedule(op, HW))])
    assert result.status == "ok", result.error


def test_the_kernel_uses_tiles_where_the_spec_has_them() -> None:
    for dtype, dot in (("int8", "_tile_dpbusd"), ("bf16", "_tile_dpbf16ps")):
        op = matmul_op(64, 64, 128, dtype=dtype)
        code = generate(op, default_schedule(op, TILED), TILED).code
        assert dot in code and "tc_needs_tiles" in code
        plain = generate(op, default_schedule(op, UNTILED), UNTILED).code
        assert "_tile_" not in plain and "tc_needs_tiles" not in plain


def test_tile_schedules_are_refused_where_they_cannot_run() -> None:
    int8 = matmul_op(64, 64, 128, dtype="int8")
    tiled = default_schedule(int8, TILED)
    assert any("needs int8 matrix tiles (AMX)" in p for p in problems(int8, tiled, UNTILED))
    assert any("needs 9 tile registers" in p
               for p in problems(int8, tiled.replace(mr=16, nr=64, mc=16, nc=64), TILED))
    assert any("whole tiles of 16" in p
               for p in problems(int8, tiled.replace(mr=8, mc=8), TILED))
    fp32 = matmul_op(64, 64, 128)
    assert any("for int8 and bf16 matmuls" in p for p in problems(fp32, tiled, TILED))


def test_the_tiler_proposes_tiles_first_where_there_are_tiles() -> None:
    op = matmul_op(128, 3072, 768, dtype="int8", a_type="float32", epilogue="dequant+bias")
    ranked = [c.schedule for c in candidates(op, TILED, k=8, threads=1)]
    assert ranked[0].loop_order == "amx" and (ranked[0].mr, ranked[0].nr) == (32, 32)
    assert {s.loop_order for s in ranked} >= {"amx", "jpi"}  # the vector kernel competes
    assert all(s.loop_order != "amx" for s in
               (c.schedule for c in candidates(op, UNTILED, k=8, threads=1)))


def test_a_refused_tile_state_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiles, "_granted", False)
    monkeypatch.setattr(tiles, "_request", lambda: "arch_prctl(ARCH_REQ_XCOMP_PERM): "
                                                   "Invalid argument")
    with pytest.raises(HardwareError, match=r"refused this process AMX tile state .*Invalid"):
        tiles.request_tile_state()
    monkeypatch.setattr(tiles, "_request", lambda: "")
    tiles.request_tile_state()
    assert tiles._granted

