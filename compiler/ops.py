"""Operator signatures: what a kernel computes, as a frozen value with one canonical text form.

An :class:`OpSignature` names an operator kind, its integer dimensions, dtype, layout
attributes and fused epilogue. Its canonical text, e.g.
``matmul(M=512,N=768,K=768,dtype=float32,layout=nn,epilogue=bias+relu)``, parses back to an
equal object; ``op_id`` is a short stable hash of that text and is the cache key for the op.

Semantics per kind (row-major float32 arrays):

* ``matmul``: ``C[M,N] = op(A)[M,K] @ op(B)[K,N]``. ``layout`` has two letters, one per
  operand, ``n`` (stored as written) or ``t`` (stored transposed: A as ``[K,M]``, B as
  ``[N,K]``).
* ``batch_matmul``: the same with a leading batch dimension ``B`` on A, B and C.
  ``shared=a`` or ``shared=b`` means that operand has no batch dimension and is used by every
  batch (what ONNX MatMul broadcasting produces).
* ``conv2d``: 2-D cross-correlation (ONNX ``Conv``) of ``X[N,C,H,W]`` with
  ``W[F,C/groups,R,S]`` into ``Y[N,F,P,Q]`` (``layout=nchw``), with integer parameters
  ``stride_h, stride_w`` (default 1), ``pad_t, pad_l, pad_b, pad_r`` (default 0, asymmetric
  as ONNX ``pads`` gives them), ``dil_h, dil_w`` (default 1) and ``groups`` (default 1;
  depthwise when ``groups == C``). ``P = (H + pad_t + pad_b - dil_h*(R-1) - 1) // stride_h + 1``
  and likewise ``Q``.
* ``epilogue``: applied in order to each output element: ``bias`` adds ``bias[N]`` (matmul) or
  ``bias[F]`` (conv2d), ``add`` (conv2d) adds a residual tensor of the output's shape,
  ``relu`` clamps at zero.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from tunecache.compiler.errors import OpSignatureError

MAX_DIM = 2**31 - 1
SUPPORTED_DTYPES = ("float32",)
DTYPE_BYTES = {"float32": 4}


@dataclass(frozen=True, slots=True)
class KindSpec:
    """The shape of a kind's signature.

    ``dims`` are required sizes (``>= 1``); ``params`` are optional integer parameters that
    follow the dims in :attr:`OpSignature.dims`, each with ``(default, minimum)``;
    ``attrs`` the attribute choices (the first is the default when parsing text);
    ``epilogues`` the allowed epilogue steps in their fixed order; ``check`` an optional
    semantic check run after the structural one, returning problems as messages.
    """

    dims: tuple[str, ...]
    attrs: Mapping[str, tuple[str, ...]]
    epilogues: tuple[str, ...]
    params: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    check: Callable[[OpSignature], list[str]] | None = None

    @property
    def all_dims(self) -> tuple[str, ...]:
        """Dims then params: the names of :attr:`OpSignature.dims`, in order."""
        return self.dims + tuple(self.params)


def _conv_window(size: int, pad_lo: int, pad_hi: int, kernel: int, dil: int,
                 stride: int) -> tuple[int, int]:
    """(dilated kernel extent, output size) along one spatial axis."""
    extent = dil * (kernel - 1) + 1
    return extent, (size + pad_lo + pad_hi - extent) // stride + 1


def _conv2d_problems(op: OpSignature) -> list[str]:
    d = op.dims_dict
    found = []
    g = d["groups"]
    if d["C"] % g:
        found.append(f"input channels C={d['C']} are not divisible by groups={g}")
    if d["F"] % g:
        found.append(f"output channels F={d['F']} are not divisible by groups={g}")
    for axis, size, lo, hi, k, dil in (
        ("height", d["H"], d["pad_t"], d["pad_b"], d["R"], d["dil_h"]),
        ("width", d["W"], d["pad_l"], d["pad_r"], d["S"], d["dil_w"]),
    ):
        extent, _ = _conv_window(size, lo, hi, k, dil, 1)
        if extent > size + lo + hi:
            found.append(
                f"kernel {axis} {k} (dilated to {extent}) is larger than the padded input "
                f"{axis} {size}+{lo}+{hi}={size + lo + hi}"
            )
    return found


KINDS: dict[str, KindSpec] = {
    "matmul": KindSpec(
        dims=("M", "N", "K"),
        attrs={"layout": ("nn", "nt", "tn", "tt")},
        epilogues=("bias", "relu"),
    ),
    "batch_matmul": KindSpec(
        dims=("B", "M", "N", "K"),
        attrs={"layout": ("nn", "nt", "tn", "tt"), "shared": ("none", "a", "b")},
        epilogues=("bias", "relu"),
    ),
    "conv2d": KindSpec(
        dims=("N", "C", "H", "W", "F", "R", "S"),
        attrs={"layout": ("nchw",)},
        epilogues=("bias", "add", "relu"),
        params={
            "stride_h": (1, 1), "stride_w": (1, 1),
            "pad_t": (0, 0), "pad_l": (0, 0), "pad_b": (0, 0), "pad_r": (0, 0),
            "dil_h": (1, 1), "dil_w": (1, 1), "groups": (1, 1),
        },
        check=_conv2d_problems,
    ),
}


@dataclass(frozen=True, slots=True)
class TensorArg:
    """One array argument of a kernel: its name, shape and whether the kernel writes it."""

    name: str
    shape: tuple[int, ...]
    role: Literal["input", "output"]


@dataclass(frozen=True, slots=True)
class OpSignature:
    """A tensor operator with concrete shapes; hashable, comparable, serialisable as text.

    Build one with :meth:`matmul`, :meth:`batch_matmul` or :meth:`parse`; the constructor
    validates every field and raises :class:`OpSignatureError` naming what is wrong.
    """

    kind: str
    dims: tuple[tuple[str, int], ...]
    dtype: str = "float32"
    attrs: tuple[tuple[str, str], ...] = ()
    epilogue: tuple[str, ...] = ()
    _text: str = field(default="", init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is None:
            raise OpSignatureError(
                f"unknown op kind {self.kind!r}; supported kinds: {', '.join(KINDS)}"
            )
        names = tuple(name for name, _ in self.dims)
        if names != spec.all_dims:
            raise OpSignatureError(
                f"{self.kind} needs dims {', '.join(spec.all_dims)} in that order, got "
                f"{', '.join(names) or 'none'}"
            )
        for name, value in self.dims:
            if isinstance(value, bool) or not isinstance(value, int):
                raise OpSignatureError(f"{self.kind} dim {name} must be an integer, got {value!r}")
            low = spec.params[name][1] if name in spec.params else 1
            if not low <= value <= MAX_DIM:
                raise OpSignatureError(
                    f"{self.kind} dim {name}={value} is out of range; expected {low}..{MAX_DIM}"
                )
        if self.dtype not in SUPPORTED_DTYPES:
            raise OpSignatureError(
                f"unsupported dtype {self.dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        attr_names = tuple(name for name, _ in self.attrs)
        if attr_names != tuple(spec.attrs):
            raise OpSignatureError(
                f"{self.kind} needs attributes {', '.join(spec.attrs)} in that order, got "
                f"{', '.join(attr_names) or 'none'}"
            )
        for name, choice in self.attrs:
            if choice not in spec.attrs[name]:
                raise OpSignatureError(
                    f"{self.kind} {name}={choice!r} is not supported; expected one of "
                    f"{', '.join(spec.attrs[name])}"
                )
        _check_epilogue(self.kind, self.epilogue, spec.epilogues)
        if spec.check is not None:
            found = spec.check(self)
            if found:
                raise OpSignatureError(f"invalid {self.kind}: " + "; ".join(found))
        object.__setattr__(self, "_text", self._render())

    # -- construction -------------------------------------------------------------------

    @classmethod
    def matmul(
        cls,
        M: int,
        N: int,
        K: int,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        epilogue: tuple[str, ...] | str = (),
        dtype: str = "float32",
    ) -> OpSignature:
        """``C[M,N] = op(A) @ op(B)``, operands optionally stored transposed."""
        return cls(
            "matmul",
            (("M", M), ("N", N), ("K", K)),
            dtype,
            (("layout", _layout(trans_a, trans_b)),),
            _epilogue_tuple(epilogue),
        )

    @classmethod
    def batch_matmul(
        cls,
        B: int,
        M: int,
        N: int,
        K: int,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        shared: str = "none",
        epilogue: tuple[str, ...] | str = (),
        dtype: str = "float32",
    ) -> OpSignature:
        """A batch of ``B`` matmuls; ``shared`` names an operand without a batch dimension."""
        return cls(
            "batch_matmul",
            (("B", B), ("M", M), ("N", N), ("K", K)),
            dtype,
            (("layout", _layout(trans_a, trans_b)), ("shared", shared)),
            _epilogue_tuple(epilogue),
        )

    @classmethod
    def conv2d(
        cls,
        N: int,
        C: int,
        H: int,
        W: int,
        F: int,
        R: int,
        S: int,
        *,
        stride: int | tuple[int, int] = 1,
        pads: int | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        epilogue: tuple[str, ...] | str = (),
        dtype: str = "float32",
    ) -> OpSignature:
        """``Y[N,F,P,Q] = conv(X[N,C,H,W], W[F,C/groups,R,S])``.

        ``stride`` and ``dilation`` are ``(h, w)`` or one int for both; ``pads`` is
        ``(top, left, bottom, right)`` (ONNX ``pads`` order) or one int for all four.
        """
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
        pt, pl, pb, pr = (pads,) * 4 if isinstance(pads, int) else pads
        return cls(
            "conv2d",
            (("N", N), ("C", C), ("H", H), ("W", W), ("F", F), ("R", R), ("S", S),
             ("stride_h", sh), ("stride_w", sw), ("pad_t", pt), ("pad_l", pl),
             ("pad_b", pb), ("pad_r", pr), ("dil_h", dh), ("dil_w", dw), ("groups", groups)),
            dtype,
            (("layout", "nchw"),),
            _epilogue_tuple(epilogue),
        )

    @classmethod
    def parse(cls, text: str) -> OpSignature:
        """Parse ``kind(key=value,...)``; dtype, layout, shared and epilogue have defaults."""
        return parse_op(text)

    # -- text and identity --------------------------------------------------------------

    @property
    def text(self) -> str:
        """The canonical text form; ``OpSignature.parse(op.text) == op``."""
        return self._text

    def __str__(self) -> str:
        return self._text

    @property
    def op_id(self) -> str:
        """A short stable hash of the canonical text (16 hex digits)."""
        return hashlib.sha256(self._text.encode()).hexdigest()[:16]

    def _render(self) -> str:
        parts = [f"{name}={value}" for name, value in self.dims]
        parts.append(f"dtype={self.dtype}")
        parts.extend(f"{name}={value}" for name, value in self.attrs)
        parts.append("epilogue=" + ("+".join(self.epilogue) if self.epilogue else "none"))
        return f"{self.kind}({','.join(parts)})"

    # -- accessors ----------------------------------------------------------------------

    def dim(self, name: str) -> int:
        """The value of dimension ``name`` (KeyError naming the valid dims otherwise)."""
        for key, value in self.dims:
            if key == name:
                return value
        raise KeyError(
            f"{self.kind} has no dim {name!r}; dims: {', '.join(KINDS[self.kind].all_dims)}"
        )

    def attr(self, name: str) -> str:
        """The value of attribute ``name``."""
        for key, value in self.attrs:
            if key == name:
                return value
        raise KeyError(f"{self.kind} has no attribute {name!r}")

    @property
    def dims_dict(self) -> dict[str, int]:
        return dict(self.dims)

    @property
    def trans_a(self) -> bool:
        return self.attr("layout")[0] == "t"

    @property
    def trans_b(self) -> bool:
        return self.attr("layout")[1] == "t"

    @property
    def shared(self) -> str:
        """Which operand is shared across the batch (``none`` for plain matmul)."""
        return self.attr("shared") if self.kind == "batch_matmul" else "none"

    @property
    def batch(self) -> int:
        return self.dim("B") if self.kind == "batch_matmul" else 1

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def out_h(self) -> int:
        """conv2d output height P."""
        d = self.dims_dict
        return _conv_window(d["H"], d["pad_t"], d["pad_b"], d["R"], d["dil_h"], d["stride_h"])[1]

    @property
    def out_w(self) -> int:
        """conv2d output width Q."""
        d = self.dims_dict
        return _conv_window(d["W"], d["pad_l"], d["pad_r"], d["S"], d["dil_w"], d["stride_w"])[1]

    @property
    def flops(self) -> int:
        """Floating-point operations (a multiply-add counts as two; epilogues not counted)."""
        d = self.dims_dict
        if self.kind == "conv2d":
            return (2 * d["N"] * d["F"] * self.out_h * self.out_w
                    * (d["C"] // d["groups"]) * d["R"] * d["S"])
        return 2 * self.batch * d["M"] * d["N"] * d["K"]

    @property
    def min_bytes(self) -> int:
        """Bytes every implementation must move at least: each tensor read or written once."""
        return sum(_prod(arg.shape) for arg in self.arguments()) * self.dtype_bytes

    def arguments(self) -> tuple[TensorArg, ...]:
        """The kernel's array arguments in call order: inputs, then the output."""
        d = self.dims_dict
        if self.kind == "conv2d":
            out_shape = (d["N"], d["F"], self.out_h, self.out_w)
            conv = [
                TensorArg("X", (d["N"], d["C"], d["H"], d["W"]), "input"),
                TensorArg("W", (d["F"], d["C"] // d["groups"], d["R"], d["S"]), "input"),
            ]
            if "bias" in self.epilogue:
                conv.append(TensorArg("bias", (d["F"],), "input"))
            if "add" in self.epilogue:
                conv.append(TensorArg("add", out_shape, "input"))
            conv.append(TensorArg("Y", out_shape, "output"))
            return tuple(conv)
        M, N, K = d["M"], d["N"], d["K"]
        a_shape: tuple[int, ...] = (K, M) if self.trans_a else (M, K)
        b_shape: tuple[int, ...] = (N, K) if self.trans_b else (K, N)
        c_shape: tuple[int, ...] = (M, N)
        if self.kind == "batch_matmul":
            B = d["B"]
            if self.shared != "a":
                a_shape = (B, *a_shape)
            if self.shared != "b":
                b_shape = (B, *b_shape)
            c_shape = (B, M, N)
        args = [TensorArg("A", a_shape, "input"), TensorArg("B", b_shape, "input")]
        if "bias" in self.epilogue:
            args.append(TensorArg("bias", (N,), "input"))
        args.append(TensorArg("C", c_shape, "output"))
        return tuple(args)


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _layout(trans_a: bool, trans_b: bool) -> str:
    return ("t" if trans_a else "n") + ("t" if trans_b else "n")


def _epilogue_tuple(epilogue: tuple[str, ...] | str) -> tuple[str, ...]:
    if isinstance(epilogue, str):
        return () if epilogue in ("", "none") else tuple(epilogue.split("+"))
    return tuple(epilogue)


def _check_epilogue(kind: str, epilogue: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    # Epilogues are applied in a fixed order (the order of `allowed`); requiring that order in
    # the signature keeps one canonical text per computation.
    position = -1
    for step in epilogue:
        if step not in allowed:
            raise OpSignatureError(
                f"{kind} epilogue step {step!r} is not supported; expected a '+'-joined "
                f"subsequence of {'+'.join(allowed)} (or none)"
            )
        index = allowed.index(step)
        if index <= position:
            raise OpSignatureError(
                f"{kind} epilogue {'+'.join(epilogue)!r} repeats or reorders steps; expected "
                f"them in the order {'+'.join(allowed)}"
            )
        position = index


_OP_RE = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*\((.*)\)\s*$", re.DOTALL)
_ITEM_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([A-Za-z0-9_+\-]+)\s*$")


def parse_op(text: str) -> OpSignature:
    """Parse an op's text form, filling defaults, and return the validated signature."""
    if not isinstance(text, str):
        raise OpSignatureError(f"op text must be a string, got {type(text).__name__}")
    match = _OP_RE.match(text)
    if match is None:
        raise OpSignatureError(
            f"cannot parse op {text!r}: expected kind(key=value,...), e.g. "
            "matmul(M=512,N=768,K=768,layout=nn,epilogue=bias+relu)"
        )
    kind, body = match.group(1), match.group(2)
    spec = KINDS.get(kind)
    if spec is None:
        raise OpSignatureError(
            f"cannot parse op {text!r}: unknown kind {kind!r}; supported kinds: "
            f"{', '.join(KINDS)}"
        )
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        item_match = _ITEM_RE.match(item)
        if item_match is None:
            raise OpSignatureError(
                f"cannot parse op {text!r}: {item!r} is not key=value"
            )
        key, value = item_match.groups()
        if key in values:
            raise OpSignatureError(f"cannot parse op {text!r}: {key} given twice")
        values[key] = value
    known = set(spec.all_dims) | set(spec.attrs) | {"dtype", "epilogue"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise OpSignatureError(
            f"cannot parse op {text!r}: unknown key(s) {', '.join(unknown)}; {kind} accepts "
            f"{', '.join(spec.all_dims)}, dtype, {', '.join(spec.attrs)}, epilogue"
        )
    missing = [name for name in spec.dims if name not in values]
    if missing:
        raise OpSignatureError(
            f"cannot parse op {text!r}: missing dim(s) {', '.join(missing)}; {kind} needs "
            f"{', '.join(spec.dims)}"
        )
    dims = []
    for name in spec.all_dims:
        raw = values.get(name)
        if raw is None:
            dims.append((name, spec.params[name][0]))
            continue
        if not re.fullmatch(r"[0-9]+", raw):
            kind_of = "non-negative" if name in spec.params and spec.params[name][1] == 0 \
                else "positive"
            raise OpSignatureError(
                f"cannot parse op {text!r}: dim {name}={raw!r} is not a {kind_of} integer"
            )
        dims.append((name, int(raw)))
    attrs = tuple((name, values.get(name, choices[0])) for name, choices in spec.attrs.items())
    return OpSignature(
        kind,
        tuple(dims),
        values.get("dtype", "float32"),
        attrs,
        _epilogue_tuple(values.get("epilogue", "none")),
    )
