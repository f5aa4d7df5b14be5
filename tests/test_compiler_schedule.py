from __future__ import annotations

import json

import pytest

from tunecache.compiler.errors import ScheduleError
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json, validate

OP = matmul_op(256, 256, 256)


def base(hw, **changes) -> MatmulSchedule:
    s = MatmulSchedule(mr=4, nr=2 * hw.lanes, kc=64, mc=64, nc=4 * hw.lanes)
    return s.replace(**changes)


def test_json_round_trip_and_stable_id(hw) -> None:
    s = base(hw, loop_order="ipj", unroll=4)
    again = schedule_from_json(s.to_json())
    assert again == s and again.schedule_id == s.schedule_id
    assert s.schedule_id != s.replace(unroll=2).schedule_id
    assert json.loads(s.to_json())["family"] == "matmul"


def test_default_schedule_is_legal(hw) -> None:
    for op in (OP, matmul_op(1, 1000, 2048, trans_b=True),
               batch_matmul_op(12, 128, 128, 64, shared="b")):
        for threads in range(1, hw.cores + 1):
            validate(op, default_schedule(op, hw, threads), hw)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"mr": 0}, "mr=0 out of range"),
        ({"mr": 33, "mc": 66}, "mr=33 out of range"),
        ({"nr": 3}, "must be a positive multiple"),
        ({"kc": 0}, "kc=0 out of range"),
        ({"mc": 6}, "mc=6 must be a multiple of mr=4"),
        ({"unroll": 3}, "unroll=3"),
        ({"loop_order": "kij"}, "loop_order='kij'"),
        ({"parallel": "k"}, "parallel='k'"),
        ({"parallel": "batch"}, "needs a batch_matmul"),
        ({"threads": 0}, "threads=0 out of range"),
        ({"threads": 10_000}, "out of range"),
        ({"pack_a": 2}, "each must be 0 or 1"),
    ],
)
def test_illegal_knobs_are_rejected(hw, changes, fragment) -> None:
    s = base(hw, **changes)
    found = problems(OP, s, hw)
    assert any(fragment in p for p in found), found
    with pytest.raises(ScheduleError, match="illegal schedule"):
        validate(OP, s, hw)


def test_register_file_bounds_micro_tile(hw) -> None:
    lanes, regs = hw.lanes, hw.vector_registers
    nv = 2
    mr_max = (regs - nv - 1) // nv
    assert not problems(OP, base(hw, mr=mr_max, nr=nv * lanes, mc=mr_max), hw)
    too_big = base(hw, mr=mr_max + 1, nr=nv * lanes, mc=mr_max + 1)
    assert any("vector registers" in p for p in problems(OP, too_big, hw))


def test_isa_changes_legal_vector_width(hw) -> None:
    from dataclasses import replace

    avx512 = replace(hw, isa="avx512", vector_bits=512)
    s = MatmulSchedule(mr=6, nr=8, kc=64, mc=60, nc=64)
    assert not problems(OP, s, avx512.with_isa("avx2"))
    assert not problems(OP, s, avx512.with_isa("generic"))
    assert any("multiple of 16" in p for p in problems(OP, s, avx512))
    # 14x32 fits 32 zmm registers but not 16 ymm ones.
    wide = MatmulSchedule(mr=14, nr=32, kc=64, mc=56, nc=64)
    assert not problems(OP, wide, avx512)
    assert any("vector registers" in p for p in problems(OP, wide, avx512.with_isa("avx2")))


def test_unpacked_b_needs_untransposed_b(hw) -> None:
    op = matmul_op(64, 64, 64, trans_b=True)
    assert any("pack_b=0" in p for p in problems(op, base(hw, pack_b=0), hw))
    assert not problems(matmul_op(64, 64, 64, trans_a=True), base(hw, pack_a=0, pack_b=0), hw)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[1, 2]", "must be a JSON object"),
        ("{nope", "not valid JSON"),
        ('{"family": "fft"}', "unknown schedule family"),
        ('{"mr": 4, "nr": 32, "kc": 8, "mc": 8, "nc": 32, "bogus": 1}', "unknown matmul knob"),
        ('{"mr": 4}', "missing knob"),
        ('{"mr": "4", "nr": 32, "kc": 8, "mc": 8, "nc": 32}', "must be an integer"),
        ('{"mr": true, "nr": 32, "kc": 8, "mc": 8, "nc": 32}', "must be an integer"),
        ('{"mr": 4, "nr": 32, "kc": 8, "mc": 8, "nc": 32, "loop_order": 1}', "must be a string"),
    ],
)
def test_malformed_schedule_json(text, fragment) -> None:
    with pytest.raises(ScheduleError, match=None) as info:
        schedule_from_json(text)
    assert fragment in str(info.value)


def test_dot_loop_order_rules(hw) -> None:
    nt = matmul_op(1, 64, 64, trans_b=True)
    dot = base(hw, loop_order="dot", pack_a=0, pack_b=0)
    assert not problems(nt, dot, hw)
    assert any("layout nt" in p for p in problems(OP, dot, hw))
    assert any("pack_a=0, pack_b=0" in p for p in problems(nt, dot.replace(pack_b=1), hw))
