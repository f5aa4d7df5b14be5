from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature

dims = st.integers(min_value=1, max_value=100_000)
epilogues = st.sampled_from([(), ("bias",), ("relu",), ("bias", "relu")])


@st.composite
def ops(draw: st.DrawFn) -> OpSignature:
    kind = draw(st.sampled_from(["matmul", "batch_matmul"]))
    kw = dict(trans_a=draw(st.booleans()), trans_b=draw(st.booleans()), epilogue=draw(epilogues))
    if kind == "matmul":
        return matmul_op(draw(dims), draw(dims), draw(dims), **kw)
    return batch_matmul_op(draw(dims), draw(dims), draw(dims), draw(dims),
                                    shared=draw(st.sampled_from(["none", "a", "b"])), **kw)


@given(ops())
def test_text_round_trip(op: OpSignature) -> None:
    parsed = OpSignature.parse(op.text)
    assert parsed == op
    assert parsed.text == op.text
    assert parsed.op_id == op.op_id
    assert hash(parsed) == hash(op)


@given(ops(), ops())
def test_op_id_distinguishes_ops(a: OpSignature, b: OpSignature) -> None:
    assert (a.op_id == b.op_id) == (a == b)
    assert len(a.op_id) == 16 and all(c in "0123456789abcdef" for c in a.op_id)


def test_op_id_is_stable_across_processes() -> None:
    op = matmul_op(512, 768, 768, epilogue="bias+relu")
    code = ("from tunecache.compiler.ops import OpSignature as O;"
            f"print(O.parse({op.text!r}).op_id)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == op.op_id


def test_parse_fills_defaults_and_tolerates_spacing() -> None:
    op = OpSignature.parse(" matmul( K = 3 , M=1, N=2 ) ")
    assert op == matmul_op(1, 2, 3)
    assert op.text == "matmul(M=1,N=2,K=3,dtype=float32,layout=nn,epilogue=none)"


def test_semantics_properties() -> None:
    op = matmul_op(4, 5, 6, trans_a=True, epilogue="bias")
    assert op.trans_a and not op.trans_b
    assert op.flops == 2 * 4 * 5 * 6
    shapes = {a.name: a.shape for a in op.arguments()}
    assert shapes == {"A": (6, 4), "B": (6, 5), "bias": (5,), "C": (4, 5)}
    assert op.min_bytes == 4 * (24 + 30 + 5 + 20)


def test_batch_matmul_shared_operand_has_no_batch_dim() -> None:
    op = batch_matmul_op(3, 4, 5, 6, shared="b", trans_b=True)
    shapes = {a.name: a.shape for a in op.arguments()}
    assert shapes == {"A": (3, 4, 6), "B": (5, 6), "C": (3, 4, 5)}
    assert op.min_bytes == 4 * (72 + 30 + 60)
    assert op.flops == 2 * 3 * 4 * 5 * 6


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("matmul", "expected kind(key=value,...)"),
        ("conv9d(M=1)", "unknown kind 'conv9d'"),
        ("matmul(M=1,N=2)", "missing dim(s) K"),
        ("matmul(M=1,N=2,K=0)", "out of range"),
        ("matmul(M=1,N=2,K=-3)", "not a positive integer"),
        ("matmul(M=1,N=2,K=x)", "not a positive integer"),
        ("matmul(M=1,N=2,K=3,layout=nx)", "layout='nx' is not supported"),
        ("matmul(M=1,N=2,K=3,dtype=float16)", "unsupported dtype"),
        ("matmul(M=1,N=2,K=3,epilogue=relu+bias)", "order"),
        ("matmul(M=1,N=2,K=3,epilogue=gelu)", "'gelu' is not supported"),
        ("matmul(M=1,N=2,K=3,M=4)", "M given twice"),
        ("matmul(M=1,N=2,K=3,shared=a)", "unknown key(s) shared"),
        ("matmul(M=1;N=2)", "is not key=value"),
    ],
)
def test_malformed_text_says_what_was_expected(text: str, fragment: str) -> None:
    with pytest.raises(OpSignatureError, match=None) as info:
        OpSignature.parse(text)
    assert fragment in str(info.value)


def test_constructor_validates() -> None:
    with pytest.raises(OpSignatureError, match="must be an integer"):
        matmul_op(1.5, 2, 3)  # type: ignore[arg-type]
    with pytest.raises(OpSignatureError, match="shared"):
        batch_matmul_op(2, 1, 2, 3, shared="c")


def test_signatures_pickle_and_deep_copy_as_values() -> None:
    # Ray ships ops to farm nodes and dataclasses.asdict deep-copies them into reports.
    import copy
    import pickle

    for op in (matmul_op(4, 5, 6, epilogue="bias"), conv2d_op(1, 3, 8, 8, 4, 3, 3)):
        for back in (pickle.loads(pickle.dumps(op)), copy.deepcopy(op)):
            assert back == op and back.text == op.text and back.dims_dict == op.dims_dict
