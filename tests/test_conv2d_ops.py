"""conv2d op signatures: canonical text, defaults, shapes, FLOPs and refused signatures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature


@st.composite
def conv_ops(draw: st.DrawFn) -> OpSignature:
    groups = draw(st.sampled_from([1, 1, 2, 3, 4]))
    c = groups * draw(st.integers(1, 8))
    f = groups * draw(st.integers(1, 8))
    r, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = tuple(draw(st.integers(0, 4)) for _ in range(4))
    h = max(1, dh * (r - 1) + 1 - pads[0] - pads[2]) + draw(st.integers(0, 30))
    w = max(1, dw * (s - 1) + 1 - pads[1] - pads[3]) + draw(st.integers(0, 30))
    return conv2d_op(
        draw(st.integers(1, 4)), c, h, w, f, r, s,
        stride=(draw(st.integers(1, 4)), draw(st.integers(1, 4))), pads=pads,  # type: ignore[arg-type]
        dilation=(dh, dw), groups=groups,
        epilogue=draw(st.sampled_from(["none", "bias", "add", "relu", "bias+relu", "add+relu",
                                       "bias+add", "bias+add+relu"])))


@settings(max_examples=200, deadline=None)
@given(conv_ops())
def test_text_round_trip(op: OpSignature) -> None:
    again = OpSignature.parse(op.text)
    assert again == op and again.op_id == op.op_id and again.text == op.text
    # Whitespace and key order are not part of the identity.
    body = op.text[len("conv2d("):-1].split(",")
    shuffled = "conv2d( " + " , ".join(reversed(body)) + " )"
    assert OpSignature.parse(shuffled) == op


@settings(max_examples=100, deadline=None)
@given(conv_ops())
def test_shapes_and_flops(op: OpSignature) -> None:
    d = op.dims_dict
    args = {a.name: a for a in op.arguments()}
    p, q = op.out_h, op.out_w
    assert p >= 1 and q >= 1
    assert p == (d["H"] + d["pad_t"] + d["pad_b"] - d["dil_h"] * (d["R"] - 1) - 1) // d["stride_h"] + 1
    assert args["X"].shape == (d["N"], d["C"], d["H"], d["W"])
    assert args["W"].shape == (d["F"], d["C"] // d["groups"], d["R"], d["S"])
    assert args["Y"].shape == (d["N"], d["F"], p, q) and args["Y"].role == "output"
    assert ("bias" in args) == ("bias" in op.epilogue)
    assert ("add" in args) == ("add" in op.epilogue)
    if "add" in args:
        assert args["add"].shape == args["Y"].shape
    assert [a.name for a in op.arguments()][-1] == "Y"
    assert op.flops == 2 * d["N"] * d["F"] * p * q * (d["C"] // d["groups"]) * d["R"] * d["S"]
    assert op.min_bytes == 4 * sum(
        a.shape[0] * (a.shape[1] if len(a.shape) > 1 else 1) * (a.shape[2] if len(a.shape) > 2 else 1)
        * (a.shape[3] if len(a.shape) > 3 else 1) for a in op.arguments())


def test_defaults_fill_in_when_parsing() -> None:
    op = OpSignature.parse("conv2d(N=1,C=3,H=224,W=224,F=64,R=7,S=7,stride_h=2,stride_w=2,"
                           "pad_t=3,pad_l=3,pad_b=3,pad_r=3)")
    assert op == conv2d_op(1, 3, 224, 224, 64, 7, 7, stride=2, pads=3)
    assert (op.out_h, op.out_w) == (112, 112)
    assert op.text == ("conv2d(N=1,C=3,H=224,W=224,F=64,R=7,S=7,stride_h=2,stride_w=2,pad_t=3,"
                       "pad_l=3,pad_b=3,pad_r=3,dil_h=1,dil_w=1,groups=1,dtype=float32,"
                       "layout=nchw,epilogue=none)")
    assert op.flops == 2 * 64 * 112 * 112 * 3 * 49


def test_matmul_texts_and_ids_unchanged() -> None:
    # Frozen values: the store keys records by these; a change would orphan them.
    op = matmul_op(512, 768, 768, epilogue="bias+relu")
    assert op.text == "matmul(M=512,N=768,K=768,dtype=float32,layout=nn,epilogue=bias+relu)"
    assert OpSignature.parse("matmul(M=2,N=3,K=4)").text == (
        "matmul(M=2,N=3,K=4,dtype=float32,layout=nn,epilogue=none)")
    assert OpSignature.parse("batch_matmul(B=2,M=2,N=3,K=4)").attr("shared") == "none"


@pytest.mark.parametrize(("text", "message"), [
    ("conv2d(N=1,C=-3,H=8,W=8,F=4,R=3,S=3)", "dim C='-3' is not a positive integer"),
    ("conv2d(N=1,C=0,H=8,W=8,F=4,R=3,S=3)", "C=0 is out of range"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,pad_t=-1)", "pad_t='-1' is not a non-negative integer"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,stride_h=0)", "stride_h=0 is out of range; expected 1"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,groups=2)", "input channels C=3 are not divisible by groups=2"),
    ("conv2d(N=1,C=4,H=8,W=8,F=6,R=3,S=3,groups=4)", "output channels F=6 are not divisible by groups=4"),
    ("conv2d(N=1,C=3,H=4,W=8,F=4,R=5,S=3)",
     "kernel height 5 (dilated to 5) is larger than the padded input height 4+0+0=4"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,dil_w=4)",
     "kernel width 3 (dilated to 9) is larger than the padded input width 8+0+0=8"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3)", "missing dim(s) S"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,layout=nhwc)", "layout='nhwc' is not supported"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,epilogue=relu+bias)", "repeats or reorders"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,epilogue=add+add)", "repeats or reorders"),
    ("conv2d(N=1,C=3,H=8,W=8,F=4,R=3,S=3,pad=1)", "unknown key(s) pad"),
])
def test_bad_signatures_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(OpSignatureError) as info:
        OpSignature.parse(text)
    assert message in str(info.value)


def test_padding_makes_a_large_kernel_fit() -> None:
    op = conv2d_op(1, 2, 1, 1, 3, 3, 3, pads=1)
    assert (op.out_h, op.out_w) == (1, 1)
    with pytest.raises(OpSignatureError, match="larger than the padded input"):
        conv2d_op(1, 2, 1, 1, 3, 3, 3, pads=(1, 1, 0, 0))
