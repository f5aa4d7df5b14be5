"""The bf16 attention on AMX tiles (``score=tiles``, issue 53): legal only for bf16 ops on a
CPU with bf16 matrix tiles, the tiler's candidates, every mask and layout against the float64
reference and, more tightly, against numpy computing with the same bfloat16 roundings; and the
precision policy choosing it. Checking schedules and generating code needs no AMX; running
the kernels does (skipped without)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from kernel_support import cached_kernel, poisoned_run_problem
from test_kind_attention import inputs_for

from tunecache.compiler.codegen import generate
from tunecache.compiler.elements import from_bfloat16, to_bfloat16
from tunecache.compiler.hardware import cpu_features, local_spec, runnable_isas
from tunecache.compiler.kinds.attention import AttentionSchedule, attention_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import default_schedule, problems
from tunecache.tuner.search.roller import candidates

HW = local_spec()
AMX_BF16 = {"amx_tile", "amx_bf16"} <= set(cpu_features())
needs_amx = pytest.mark.skipif(not AMX_BF16, reason="needs a CPU with AMX-BF16")
AVX512 = "avx512" in runnable_isas(HW)
TILED = replace(HW.with_isa("avx512") if AVX512 else HW, isa="avx512", vector_bits=512,
                features=("amx_bf16", "amx_tile", "avx512_bf16"))
UNTILED = replace(TILED, features=("avx512_bf16",))
BERT = attention_op(12, 128, 128, 64, mask="padding", mask_rows=1, heads=12, tokens="qkvy",
                    dtype="bf16")
CASES = [
    BERT,
    attention_op(12, 128, 128, 64, mask="padding", mask_rows=1, heads=12, tokens="qkvy",
                 dtype="bf16", narrow="q+k+v"),  # Q, K, V from bf16 projections
    attention_op(3, 37, 45, 40, Dv=24, mask="causal_padding", mask_rows=3, scale="input",
                 dtype="bf16"),
    attention_op(4, 1, 129, 64, mask="causal", dtype="bf16"),  # decoding after 128 tokens
    attention_op(4, 20, 20, 16, mask="full", mask_rows=2, dtype="bf16"),
    attention_op(2, 50, 70, 128, Dv=96, dtype="bf16"),
    attention_op(4, 17, 33, 64, mask="padding", mask_rows=2, heads=2, tokens="qy",
                 dtype="bf16"),
    attention_op(3, 37, 45, 40, Dv=24, mask="causal_padding", mask_rows=3, scale="input",
                 dtype="bf16", narrow="q+v"),
]


def _bf16(x: np.ndarray) -> np.ndarray:
    return from_bfloat16(to_bfloat16(x.astype(np.float32))).astype(np.float64)


def _narrowed(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """``inputs`` with the tensors ``op`` takes as bfloat16 rounded to it."""
    kinds = [a.dtype for a in op.arguments() if a.role == "input"]
    return tuple(to_bfloat16(x) if t == "bfloat16" else x
                 for x, t in zip(inputs, kinds, strict=True))


def _emulated(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The op as the tile kernel rounds it: Qs, K, V and P in bfloat16, everything else in
    float64 (a reference without tokens-major layouts or the full mask: the cases using
    them are checked against the float64 reference only)."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    scale = float(inputs[3][0]) if op.attr("scale") == "input" else 1 / np.sqrt(op.dim("D"))
    s = _bf16(q * np.float32(scale)) @ _bf16(k).transpose(0, 2, 1)
    if op.attr("mask") in ("padding", "causal_padding"):
        rows = op.dim("mask_rows")
        s.reshape(rows, -1, *s.shape[1:])[...] += inputs[-1][:, None, None, :]
    if op.attr("mask") in ("causal", "causal_padding"):
        m, n = s.shape[1:]
        s[:, np.arange(n)[None, :] > np.arange(m)[:, None] + (n - m)] = -np.inf
    p = np.exp(s - s.max(axis=2, keepdims=True))
    return (_bf16(p) @ _bf16(v)) / p.sum(axis=2, keepdims=True)


def test_tiles_are_for_bf16_ops_on_cpus_with_bf16_tiles() -> None:
    s = AttentionSchedule(q_block=32, k_block=32, score="tiles")
    assert default_schedule(BERT, TILED) == s
    assert problems(BERT, s, TILED) == []
    assert problems(BERT, s, UNTILED) == [
        f"a bf16 attention needs bf16 matrix tiles (AMX-BF16); {UNTILED.hw_id} has none"]
    float32 = replace(BERT, dtype="float32")
    assert problems(float32, s, TILED)[0].startswith("score=tiles is the bf16 attention's")
    assert problems(BERT, AttentionSchedule(q_block=8, k_block=128), TILED) == [
        "score=tiles is the bf16 attention's kernel, and a bf16 attention runs on score=tiles "
        "only; got dtype=bf16, score=outer",
        "score=tiles takes q_block in (16, 32) and k_block in (16, 32); got q_block=8, "
        "k_block=128"]
    one_row = attention_op(4, 1, 129, 64, mask="causal", dtype="bf16")
    assert default_schedule(one_row, TILED).q_block == 16
    assert problems(one_row, s, TILED) == [
        "q_block=32 is over twice M=1: q_block=16 already covers every query"]


def test_the_tiler_proposes_tile_schedules_for_bf16_attention() -> None:
    found = [c.schedule for c in candidates(BERT, TILED, k=10, threads=1)]
    assert found and all(isinstance(s, AttentionSchedule) and s.score == "tiles"
                         for s in found)
    assert all(problems(BERT, s, TILED) == [] for s in found)
    floats = [c.schedule for c in candidates(replace(BERT, dtype="float32"), TILED, k=50,
                                             threads=1)]
    assert floats and not any(s.score == "tiles" for s in floats)


def test_the_kernel_multiplies_on_tiles() -> None:
    source = generate(BERT, default_schedule(BERT, TILED), TILED).code
    assert "_tile_dpbf16ps" in source and "tc_needs_tiles" in source


@needs_amx
@pytest.mark.parametrize("op", CASES, ids=lambda op: op.text)
@pytest.mark.parametrize(("q_block", "k_block", "threads"),
                         [(16, 16, 1), (16, 32, 2), (32, 16, 2), (32, 32, 1)])
def test_every_mask_and_layout_matches_the_reference(op: OpSignature, q_block: int,
                                                      k_block: int, threads: int) -> None:
    s = AttentionSchedule(q_block=q_block, k_block=k_block, score="tiles",
                          threads=min(threads, HW.cores))
    if problems(op, s, HW):
        pytest.skip("; ".join(problems(op, s, HW)))
    inputs = _narrowed(op, inputs_for(op, q_block + k_block))
    assert poisoned_run_problem(cached_kernel(op, s, HW), op, inputs, offset=1) is None


@needs_amx
@pytest.mark.parametrize("op", [CASES[2], CASES[3], CASES[5]], ids=lambda op: op.text)
def test_the_kernel_rounds_as_it_says(op: OpSignature) -> None:
    """Against numpy rounding Qs, K, V and P to bfloat16 too: within the rounding of one P
    (2**-8 of max |V|) and float32 sums, far tighter than against float32."""
    inputs = inputs_for(op, 3, fill=-np.inf)
    y = cached_kernel(op, default_schedule(op, HW), HW)(*inputs).astype(np.float64)
    want = _emulated(op, inputs)
    assert np.abs(y - want).max() <= 2.0 ** -8 * np.abs(inputs[2]).max() + 1e-5


@needs_amx
def test_fully_masked_rows_give_zeros() -> None:
    op = CASES[2]
    q, k, v, scale, mask = inputs_for(op, 5)
    mask[0] = -np.inf
    y = cached_kernel(op, default_schedule(op, HW), HW)(q, k, v, scale, mask)
    assert np.all(y[0] == 0.0) and np.all(np.isfinite(y)) and np.any(y[1] != 0.0)


def test_bfloat16_inputs_are_the_signatures() -> None:
    op = CASES[1]
    assert op.text.endswith("tokens=qkvy,narrow=q+k+v,epilogue=none)")
    assert [a.dtype for a in op.arguments()][:3] == ["bfloat16"] * 3
    assert "narrow" not in BERT.text
    from tunecache.compiler.errors import OpSignatureError

    with pytest.raises(OpSignatureError, match="only a bf16 attention takes bfloat16 inputs"):
        attention_op(2, 4, 4, 8, narrow="q")


@needs_amx
def test_bfloat16_q_is_scaled_in_its_scores() -> None:
    """Q taken as bfloat16 is rounded before the scale, not after: within the same bound of
    the float32 op's reference, and of the op taking float32 Q."""
    op = CASES[-1]
    wide = attention_op(3, 37, 45, 40, Dv=24, mask="causal_padding", mask_rows=3,
                        scale="input", dtype="bf16")
    inputs = inputs_for(wide, 9)
    narrow = (to_bfloat16(inputs[0]), inputs[1], to_bfloat16(inputs[2]), *inputs[3:])
    y = cached_kernel(op, default_schedule(op, HW), HW)(*narrow)
    same = cached_kernel(wide, default_schedule(wide, HW), HW)(*inputs)
    assert np.abs(y - same).max() <= 2.0 ** -7 * np.abs(inputs[2]).max()
