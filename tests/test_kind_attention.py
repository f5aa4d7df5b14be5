"""The ``attention`` kind: signature, reference semantics (masks, causal alignment, fully
masked rows), legal space, and generated kernels against the float64 reference on avx2 and
generic (whichever this CPU runs). Outputs start NaN-poisoned, so an unwritten element fails."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import scipy.special
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_support import build_all, cached_kernel, examples, poisoned_run_problem, sampled

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import OpSignatureError, ScheduleError
from tunecache.compiler.hardware import HardwareSpec, isa_level, local_spec, runnable_isas
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.attention import (
    MASKS,
    AttentionSchedule,
    attention_op,
    balanced_chunks,
    causal_keep,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, random_inputs, reference
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json, validate

HW = local_spec()
TESTED_ISAS = tuple(isa for isa in ("avx2", "generic") if isa in runnable_isas(HW))
T2 = min(2, HW.cores)
ADDITIVE = ("padding", "causal_padding", "full")
SLOW = settings(max_examples=examples(20), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def inputs_for(op: OpSignature, seed: int, fill: float = -1e4) -> tuple[np.ndarray, ...]:
    """Random inputs; additive masks give each mask row (each query row of a full mask) a
    valid prefix of at least one key and ``fill`` after it, plus a few ``-inf`` and small
    values inside the prefix."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in op.arguments():
        if arg.role != "input":
            continue
        if arg.name == "scale":
            out.append(np.array([rng.uniform(0.05, 0.5)], np.float32))
        elif arg.name == "mask":
            n = arg.shape[-1]
            mask = (0.5 * rng.standard_normal(arg.shape)).astype(np.float32)
            mask[rng.random(arg.shape) < 0.1] = -np.inf
            valid = rng.integers(1, n + 1, size=arg.shape[:-1])
            mask[np.arange(n) >= valid[..., None]] = fill
            mask[..., 0] = 0.0
            out.append(mask)
        else:
            out.append(rng.standard_normal(arg.shape, dtype=np.float32))
    return tuple(out)


def run_problem(op: OpSignature, s: AttentionSchedule, hw: HardwareSpec, seed: int = 0,
                inputs: tuple[np.ndarray, ...] | None = None) -> str | None:
    inputs = inputs_for(op, seed) if inputs is None else inputs
    problem = poisoned_run_problem(cached_kernel(op, s, hw), op, inputs, offset=seed % 3)
    return f"{hw.isa} {op.text} {s}: {problem}" if problem else None


def spec(isa: str, cores: int | None = None) -> HardwareSpec:
    """This machine's spec at another ISA level (and core count): legality and builds only."""
    return dataclasses.replace(HW, isa=isa, vector_bits=isa_level(isa).vector_bits,
                               cores=cores or HW.cores)


# -- signature ----------------------------------------------------------------------------------


@st.composite
def ops(draw: st.DrawFn, max_size: int = 70) -> OpSignature:
    mask = draw(st.sampled_from(MASKS))
    n = draw(st.integers(1, max_size))
    m = draw(st.integers(1, n if "causal" in mask else max_size))
    b = draw(st.integers(1, 6))
    d = draw(st.sampled_from([1, 3, 8, 13, 16, 40, 64]))
    dv = draw(st.sampled_from([None, 5, 24, 64]))
    rows = draw(st.sampled_from([r for r in range(1, b + 1) if b % r == 0])) \
        if mask in ADDITIVE else None
    return attention_op(b, m, n, d, Dv=dv, mask=mask, mask_rows=rows,
                        scale=draw(st.sampled_from(["default", "input"])))


@given(ops())
@settings(max_examples=60, deadline=None)
def test_text_round_trips(op: OpSignature) -> None:
    assert OpSignature.parse(op.text) == op
    assert OpSignature.parse(op.text).op_id == op.op_id


def test_text_form_arguments_and_flops() -> None:
    op = attention_op(12, 128, 128, 64, mask="padding", mask_rows=1)
    assert op.text == ("attention(B=12,M=128,N=128,D=64,Dv=0,mask_rows=1,dtype=float32,"
                       "mask=padding,scale=default,epilogue=none)")
    assert OpSignature.parse("attention(B=12,M=128,N=128,D=64,mask_rows=1,mask=padding)") == op
    assert [(a.name, a.shape) for a in op.arguments()] == [
        ("Q", (12, 128, 64)), ("K", (12, 128, 64)), ("V", (12, 128, 64)), ("mask", (1, 128)),
        ("Y", (12, 128, 64))]
    full = attention_op(4, 3, 9, 40, Dv=24, mask="causal_padding", mask_rows=2, scale="input")
    assert [(a.name, a.shape) for a in full.arguments()] == [
        ("Q", (4, 3, 40)), ("K", (4, 9, 40)), ("V", (4, 9, 24)), ("scale", (1,)),
        ("mask", (2, 9)), ("Y", (4, 3, 24))]
    assert attention_op(2, 5, 7, 8, Dv=8) == attention_op(2, 5, 7, 8)  # Dv = D is Dv=0
    # per visible (query, key) pair: 2D + 2Dv multiply-adds and the softmax's 5 (+1 mask)
    assert op.flops == 12 * 128 * 128 * (4 * 64 + 6)
    causal = attention_op(1, 4, 6, 8, mask="causal")  # rows see 3, 4, 5, 6 keys
    assert causal.flops == (3 + 4 + 5 + 6) * (4 * 8 + 5)
    # a full mask: one additive row per query, per group of B // mask_rows items
    per_query = attention_op(4, 3, 9, 8, mask="full", mask_rows=2)
    assert per_query.text == ("attention(B=4,M=3,N=9,D=8,Dv=0,mask_rows=2,dtype=float32,"
                              "mask=full,scale=default,epilogue=none)")
    assert [(a.name, a.shape) for a in per_query.arguments()][3] == ("mask", (2, 3, 9))
    assert per_query.flops == 4 * 3 * 9 * (4 * 8 + 6)


@pytest.mark.parametrize(("text", "message"), [
    ("attention(B=2,M=3,N=4,D=8,Dv=8)", "Dv=8 equals D; write Dv=0"),
    ("attention(B=2,M=3,N=4,D=8,mask=padding)", "mask=padding needs mask_rows >= 1"),
    ("attention(B=2,M=3,N=4,D=8,mask=full)", "mask=full needs mask_rows >= 1"),
    ("attention(B=6,M=3,N=4,D=8,mask_rows=4,mask=full)", "mask_rows=4 does not divide B=6"),
    ("attention(B=6,M=3,N=4,D=8,mask_rows=4,mask=causal_padding)", "mask_rows=4 does not divide B=6"),
    ("attention(B=2,M=3,N=4,D=8,mask_rows=2,mask=causal)", "mask_rows=2 applies to the padding"),
    ("attention(B=2,M=5,N=4,D=8,mask=causal)", "mask=causal needs M <= N"),
    ("attention(B=2,M=3,N=4,D=8,mask=alibi)", "mask='alibi' is not supported"),
    ("attention(B=2,M=3,N=4,D=8,scale=half)", "scale='half' is not supported"),
    ("attention(B=2,M=3,N=4,D=0)", "dim D"),
])
def test_bad_signatures_are_refused(text: str, message: str) -> None:
    with pytest.raises(OpSignatureError, match=message.replace("(", r"\(")):
        OpSignature.parse(text)


# -- reference ----------------------------------------------------------------------------------


def _naive(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """Row by row, written independently of the kind's reference: the documented semantics."""
    q, k, v = (x.astype(np.float64) for x in inputs[:3])
    d = op.dims_dict
    b_, m, n = d["B"], d["M"], d["N"]
    scale = float(inputs[3][0]) if op.attr("scale") == "input" else d["D"] ** -0.5
    mask = inputs[-1].astype(np.float64) if op.attr("mask") in ADDITIVE else None
    out = np.zeros((b_, m, v.shape[2]))
    for b in range(b_):
        for i in range(m):
            z = q[b, i] @ k[b].T * scale
            if mask is not None:
                row = mask[b // (b_ // d["mask_rows"])]
                z = z + (row[i] if op.attr("mask") == "full" else row)
            if "causal" in op.attr("mask"):
                z[np.arange(n) > i + n - m] = -np.inf
            if np.all(z == -np.inf):
                continue  # every key masked: zeros
            out[b, i] = scipy.special.softmax(z) @ v[b]
    return out


@pytest.mark.parametrize("mask", MASKS)
def test_reference_semantics(mask: str) -> None:
    op = attention_op(6, 4, 7, 5, Dv=3, mask=mask, mask_rows=3 if mask in ADDITIVE else None,
                      scale="input")
    inputs = inputs_for(op, 1)
    got = op_kind("attention").reference(op, tuple(x.astype(np.float64) for x in inputs))
    np.testing.assert_allclose(got, _naive(op, inputs), rtol=1e-12, atol=1e-14)


def test_causal_mask_is_aligned_bottom_right() -> None:
    """Query i sees keys j <= i + N - M: with a key/value cache of N - M past tokens."""
    assert causal_keep(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_keep(3, 3).tolist() == np.tril(np.ones((3, 3), bool)).tolist()
    op = attention_op(1, 2, 4, 1, mask="causal")
    q = np.zeros((1, 2, 1))  # equal scores: the output is the mean of the visible values
    v = np.arange(4.0).reshape(1, 4, 1)
    got = op_kind("attention").reference(op, (q, q.repeat(2, axis=1), v))
    assert got.ravel().tolist() == [1.0, 1.5]


def test_fully_masked_rows() -> None:
    """-inf on every key: zeros; finfo.min on every key: the mean of V (every score rounds to
    the same value); -1e4 on every key: the softmax of the scores (shift invariance)."""
    op = attention_op(3, 2, 5, 4, mask="padding", mask_rows=3)
    q, k, v, _ = inputs_for(op, 2)
    mask = np.zeros((3, 5), np.float32)
    mask[0] = -np.inf
    mask[1] = np.finfo(np.float32).min
    mask[2] = -1e4
    got = op_kind("attention").reference(op, tuple(x.astype(np.float64) for x in (q, k, v, mask)))
    assert np.all(got[0] == 0.0)
    np.testing.assert_allclose(got[1], np.broadcast_to(v[1].astype(np.float64).mean(axis=0), (2, 4)),
                               rtol=1e-12)
    plain = attention_op(3, 2, 5, 4)
    np.testing.assert_allclose(got[2], reference(plain, (q, k, v))[2], rtol=1e-9)


@given(ops(max_size=40), st.integers(0, 2**16))
@SLOW
def test_float32_reference_matches_float64(op: OpSignature, seed: int) -> None:
    inputs = inputs_for(op, seed)
    got = op_kind("attention").reference(op, inputs)
    assert got.dtype == np.float32
    assert check_result(op, inputs, got, reference(op, inputs)) is None


# -- schedules ------------------------------------------------------------------------------------


def test_illegal_schedules_name_every_problem() -> None:
    op = attention_op(2, 5, 40, 64)
    hw = HW.with_isa("avx2")
    found = problems(op, AttentionSchedule(q_block=9, k_block=48, score="cubes", threads=0), hw)
    assert "q_block=9 out of range 1..8" in found
    assert "k_block=48; expected one of 16, 32, 64, 128, 256" in found
    assert "score='cubes'; expected one of outer, dot, tiles" in found
    assert any(p.startswith("threads=0 out of range") for p in found)
    assert problems(op, AttentionSchedule(q_block=6), hw) == [
        "q_block=6 exceeds the op's M=5 query rows"]
    assert problems(op, AttentionSchedule(q_block=4, k_block=128), hw) == [
        "k_block=128 is over twice N=40: k_block=64 already covers every key"]
    assert problems(op, AttentionSchedule(q_block=4, k_block=64), hw) == []
    assert problems(attention_op(1, 1, 3, 8), AttentionSchedule(q_block=1, k_block=16), hw) == []
    long = attention_op(1, 4, 1 << 20, 128)
    assert problems(long, AttentionSchedule(q_block=4, k_block=64, score="outer"), hw) == [
        "workspace of 512 MiB exceeds 256 MiB (score=outer packs D x N floats of K^T per "
        "thread; use score=dot)"]
    assert problems(long, AttentionSchedule(q_block=4, k_block=64, score="dot"), hw) == []
    with pytest.raises(ScheduleError, match="illegal schedule for attention"):
        validate(op, AttentionSchedule(q_block=6), hw)
    from tunecache.compiler.kinds.softmax import SoftmaxSchedule

    assert problems(op, SoftmaxSchedule(), hw) == [
        "a softmax schedule cannot drive a attention op"]


@given(ops(max_size=5000), st.sampled_from(["avx512", "avx2", "generic"]), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_default_schedule_is_legal(op: OpSignature, isa: str, threads: int) -> None:
    hw = spec(isa, cores=4)
    s = default_schedule(op, hw, threads)
    assert isinstance(s, AttentionSchedule) and s.threads == threads
    assert problems(op, s, hw) == []
    assert schedule_from_json(s.to_json(), kind="attention") == s


def test_default_schedules_of_typical_shapes() -> None:
    avx2, avx512 = spec("avx2"), spec("avx512")
    bert = attention_op(12, 128, 128, 64, mask="padding")
    decode = attention_op(12, 1, 129, 64, mask="causal")
    assert default_schedule(bert, avx2) == AttentionSchedule(q_block=6, k_block=128)
    assert default_schedule(bert, avx512) == AttentionSchedule(q_block=8, k_block=128)
    assert default_schedule(decode, avx2) == AttentionSchedule(q_block=1, k_block=128,
                                                               score="dot")
    assert balanced_chunks(8, 3) == [3, 3, 2] and balanced_chunks(0, 3) == []


# -- kernels ----------------------------------------------------------------------------------------

# M and N are not multiples of any query or key block; D=40 is 5 AVX2 vectors and 2.5 AVX-512
# ones; D=13 and Dv=7 leave partial vectors everywhere.
FULL_OP = attention_op(4, 19, 45, 40, Dv=24, mask="causal_padding", mask_rows=2, scale="input")
MODE_OPS = [attention_op(3, 19, 45, d, mask=mask, mask_rows=3 if mask in ADDITIVE else None)
            for mask in MASKS for d in (64, 40)]
ODD_OP = attention_op(2, 7, 33, 13, Dv=7, mask="padding", mask_rows=2)


def _variant_cases() -> list[tuple[OpSignature, AttentionSchedule, HardwareSpec]]:
    cases = []
    spread = list(itertools.product(range(1, 9), ("outer", "dot")))
    for isa in TESTED_ISAS:
        hw = HW.with_isa(isa)
        # Every query block (the remainder block differs for each) with both score forms.
        for i, (q, score) in enumerate(spread):
            s = AttentionSchedule(q_block=q, k_block=(16, 32, 64)[i % 3], score=score,
                                  threads=1 + i % T2)
            cases.append((FULL_OP, s, hw))
        for j, op in enumerate(MODE_OPS):
            for q, k, score in ((1 + j % 8, 16, "outer"), (3, 32, "dot"), (6, 64, "outer")):
                cases.append((op, AttentionSchedule(q_block=q, k_block=k, score=score,
                                                    threads=1 + j % T2), hw))
        for q, score in itertools.product((1, 4, 7), ("outer", "dot")):
            cases.append((ODD_OP, AttentionSchedule(q_block=q, k_block=16, score=score), hw))
    return cases


def test_every_mask_mode_and_schedule_variant_on_every_isa() -> None:
    cases = _variant_cases()
    assert len(cases) >= 46 * len(TESTED_ISAS)
    cases = sampled(cases)
    build_all(cases)
    failures = [p for p in (run_problem(op, s, hw, seed=i) for i, (op, s, hw) in enumerate(cases))
                if p]
    assert not failures, "\n".join(failures)


@given(ops(max_size=80), st.sampled_from(TESTED_ISAS), st.integers(0, 2**16))
@SLOW
def test_random_shapes(op: OpSignature, isa: str, seed: int) -> None:
    hw = HW.with_isa(isa)
    s = default_schedule(op, hw, T2 if seed % 2 else 1)
    if seed % 3 == 0:
        s = s.replace(score="dot" if s.score == "outer" else "outer")
    assert run_problem(op, s, hw, seed) is None


@pytest.mark.parametrize(("op", "what"), [
    (attention_op(12, 1, 129, 64, mask="causal"), "GPT-2 decode step, 128 past tokens"),
    (attention_op(2, 4, 131, 64, mask="causal_padding", mask_rows=2), "4 new tokens on 127"),
    (attention_op(12, 128, 128, 64, mask="causal"), "GPT-2 prefill"),
    (attention_op(12, 128, 128, 64, mask="padding", mask_rows=1), "BERT-base"),
])
def test_model_shapes_and_decode_with_past(op: OpSignature, what: str) -> None:
    for score in ("outer", "dot"):
        s = default_schedule(op, HW, T2).replace(score=score)
        assert run_problem(op, s, HW) is None, what


@pytest.mark.parametrize("isa", TESTED_ISAS)
def test_fully_padded_keys(isa: str) -> None:
    """Mask rows at -inf on every key give zeros (not NaN); at finfo.min the mean of V;
    causal rows whose visible keys are all -inf give zeros too."""
    op = attention_op(4, 6, 37, 16, mask="causal_padding", mask_rows=4)
    q, k, v, mask = inputs_for(op, 5)
    mask[0] = -np.inf
    mask[1] = np.finfo(np.float32).min
    mask[2, :33] = -np.inf  # row i sees keys up to 31 + i: all masked for i <= 1
    mask[2, 33:] = 0.0
    hw = HW.with_isa(isa)
    for s in (AttentionSchedule(q_block=4, k_block=16, score="outer"),
              AttentionSchedule(q_block=1, k_block=32, score="dot", threads=T2)):
        y = cached_kernel(op, s, hw)(q, k, v, mask)
        assert np.all(y[0] == 0.0) and np.all(y[2, :2] == 0.0) and np.all(y[2, 2:] != 0.0)
        np.testing.assert_allclose(y[1], reference(op, (q, k, v, mask))[1], rtol=1e-5, atol=1e-6)
        assert check_result(op, (q, k, v, mask), y, reference(op, (q, k, v, mask))) is None


@pytest.mark.parametrize("isa", TESTED_ISAS)
def test_online_rescaling_with_growing_and_shrinking_scores(isa: str) -> None:
    """Scores far apart across key blocks (up to about +-300): each new block maximum
    rescales the running sum and the accumulator; an early large maximum makes later blocks
    underflow to 0. Both must match the reference."""
    op = attention_op(2, 5, 70, 16)
    rng = np.random.default_rng(7)
    q = np.ones((2, 5, 16), np.float32)
    ramp = np.linspace(-75, 75, 70, dtype=np.float32)[:, None] / 4
    k = np.stack([np.broadcast_to(ramp, (70, 16)), np.broadcast_to(ramp[::-1], (70, 16))])
    k = (k + 0.1 * rng.standard_normal(k.shape)).astype(np.float32)
    v = rng.standard_normal((2, 70, 16), dtype=np.float32)
    hw = HW.with_isa(isa)
    for s in (AttentionSchedule(q_block=2, k_block=16, score="outer"),
              AttentionSchedule(q_block=5, k_block=16, score="dot")):
        assert run_problem(op, s, hw, inputs=(q, k, v)) is None


def test_kernels_compile_for_avx512() -> None:
    """AVX-512 code is at least built (run only where the CPU has it): D=40 and Dv=24 leave
    partial vectors of 16 lanes."""
    hw = spec("avx512")
    for s in (AttentionSchedule(q_block=8, k_block=32, score="outer", threads=T2),
              AttentionSchedule(q_block=3, k_block=16, score="dot")):
        art = build(generate(FULL_OP, s, hw))
        assert art.path.exists()
        if HW.isa == "avx512":
            assert run_problem(FULL_OP, s, hw) is None


def test_runtime_random_inputs_pass_the_generic_check() -> None:
    """What the tuner does: ``random_inputs`` (a padding mask of -1e4) and ``check_result``."""
    op = attention_op(4, 24, 40, 32, mask="causal_padding", mask_rows=2, scale="input")
    kernel = cached_kernel(op, default_schedule(op, HW), HW)
    for seed in range(4):
        inputs = random_inputs(op, seed)
        assert inputs[-1].min() == -1e4 and inputs[-1].max() == 0.0
        assert check_result(op, inputs, kernel(*inputs), reference(op, inputs)) is None


# -- token-major layouts ------------------------------------------------------------------------


def _to_tokens(x: np.ndarray, heads: int) -> np.ndarray:
    """``[batch x heads, rows, width]`` laid out as ``[batch, rows, heads x width]``."""
    items, rows, width = x.shape
    return np.ascontiguousarray(x.reshape(items // heads, heads, rows, width)
                                .transpose(0, 2, 1, 3).reshape(items // heads, rows, -1))


def test_token_major_signature_text_and_arguments() -> None:
    op = attention_op(6, 5, 9, 16, Dv=8, heads=3, tokens="qy")
    assert op.text == ("attention(B=6,M=5,N=9,D=16,Dv=8,mask_rows=0,heads=3,dtype=float32,"
                       "mask=none,scale=default,tokens=qy,epilogue=none)")
    assert OpSignature.parse(op.text) == op
    assert [a.shape for a in op.arguments()] == [(2, 5, 48), (6, 9, 16), (6, 9, 8), (2, 5, 24)]
    # the head-major default keeps the texts (and op ids) stored before tokens existed
    assert "heads" not in attention_op(6, 5, 9, 16).text
    assert op.flops == attention_op(6, 5, 9, 16, Dv=8).flops


@pytest.mark.parametrize(("text", "message"), [
    ("attention(B=6,M=3,N=4,D=8,tokens=qkvy)", "tokens=qkvy needs heads >= 1 dividing B=6"),
    ("attention(B=6,M=3,N=4,D=8,heads=4,tokens=y)", "needs heads >= 1 dividing B=6"),
    ("attention(B=6,M=3,N=4,D=8,heads=3)", "heads=3 applies to token-major tensors only"),
    ("attention(B=6,M=3,N=4,D=8,heads=3,tokens=yq)", "tokens='yq' is not supported"),
])
def test_bad_token_major_signatures_are_refused(text: str, message: str) -> None:
    with pytest.raises(OpSignatureError, match=message.replace("(", r"\(")):
        OpSignature.parse(text)


@pytest.mark.parametrize("tokens", ["qkvy", "qy", "kv", "y"])
def test_token_major_kernels_match_the_head_major_semantics(tokens: str) -> None:
    """The same Q, K, V laid out token-major where ``tokens`` says: every schedule variant
    gives the documented (head-major) result, laid out as asked."""
    heads, batch = 3, 2
    plain = attention_op(batch * heads, 7, 11, 16, Dv=8, mask="full", mask_rows=batch)
    op = attention_op(batch * heads, 7, 11, 16, Dv=8, mask="full", mask_rows=batch,
                      heads=heads, tokens=tokens)
    inputs = random_inputs(plain, seed=5)
    laid = tuple(_to_tokens(x, heads) if name in tokens else x
                 for name, x in zip("qkvm", inputs, strict=True))
    expected = _naive(plain, inputs)
    if "y" in tokens:
        expected = _to_tokens(expected, heads)
    cases = [(op, AttentionSchedule(q_block=q, k_block=16, score=score, threads=t), HW)
             for q, score, t in itertools.product((1, 4), ("outer", "dot"), (1, T2))]
    build_all(cases)
    for case in cases:
        kernel = cached_kernel(*case)
        assert check_result(op, laid, kernel(*laid), expected) is None, case[1]
    assert poisoned_run_problem(cached_kernel(*cases[0]), op, laid, offset=3) is None
