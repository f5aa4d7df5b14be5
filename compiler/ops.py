"""Operator signatures: what a kernel computes, as a frozen value with one canonical text form.

An :class:`OpSignature` names an operator kind, its integer dimensions, dtype, layout
attributes and fused epilogue. Its canonical text, e.g.
``matmul(M=512,N=768,K=768,dtype=float32,layout=nn,epilogue=bias+relu)``, parses back to an
equal object; ``op_id`` is a short stable hash of that text and is the cache key for the op.

What each kind computes (its dims, parameters, attributes, epilogue steps, argument shapes
and FLOPs) is defined by the kind's module in :mod:`tunecache.compiler.kinds` and found
through the registry; this module only knows the generic structure. Epilogue steps are
applied in the kind's fixed order to each output element.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tunecache.compiler.errors import OpSignatureError

if TYPE_CHECKING:
    from tunecache.compiler.kinds import OpKind

MAX_DIM = 2**31 - 1
SUPPORTED_DTYPES = ("float32", "int8", "bf16")
"""An op's dtype: ``float32``; ``int8`` (u8 activations times s8 weights, accumulated in
int32); ``bf16`` (bfloat16 operands, float32 accumulation). It is part of the op's text, so
float32 op ids stay what they were."""
DTYPE_BYTES = {"float32": 4, "int8": 1, "bf16": 2}
ELEMENT_STORAGE = {"float32": "float32", "uint8": "uint8", "int8": "int8", "int32": "int32",
                   "bfloat16": "uint16"}
"""The element types a kernel argument may have, and the numpy dtype holding each (numpy
has no bfloat16: its bit patterns are held as uint16)."""
_ITEM_BYTES = {"float32": 4, "uint8": 1, "int8": 1, "int32": 4, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class KindSpec:
    """The shape of a kind's signature.

    ``dims`` are required sizes (``>= 1``); ``params`` are optional integer parameters that
    follow the dims in :attr:`OpSignature.dims`, each with ``(default, minimum)``;
    ``attrs`` the attribute choices (the first is the default when parsing text);
    ``epilogues`` the allowed epilogue steps in their fixed order; ``check`` an optional
    semantic check run after the structural one, returning problems as messages.
    ``epilogue_chain`` makes the epilogue a chain instead: any of the allowed steps, in any
    order, repeats allowed (the ``elementwise`` kind). ``epilogue_tail``: steps that may
    follow the ordered ones as such a chain (an element-wise chain folded into a producer,
    :data:`~tunecache.compiler.codegen.epilogue.CHAIN_STEPS`); the tail starts at its first
    step that is not one of ``epilogues``. ``omit_default`` names attributes and
    params the canonical text leaves out while they hold their default: those added to a
    kind after its op texts were stored, so those texts (and their op ids) stay the same.
    """

    dims: tuple[str, ...]
    attrs: Mapping[str, tuple[str, ...]]
    epilogues: tuple[str, ...]
    params: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    check: Callable[[OpSignature], list[str]] | None = None
    epilogue_chain: bool = False
    epilogue_tail: tuple[str, ...] = ()
    omit_default: frozenset[str] = frozenset()
    dtypes: tuple[str, ...] = ("float32",)
    """The dtypes the kind has kernels for."""

    @property
    def all_dims(self) -> tuple[str, ...]:
        """Dims then params: the names of :attr:`OpSignature.dims`, in order."""
        return self.dims + tuple(self.params)


@dataclass(frozen=True, slots=True)
class TensorArg:
    """One array argument of a kernel: its name, shape and whether the kernel writes it."""

    name: str
    shape: tuple[int, ...]
    role: Literal["input", "output"]
    dtype: str = "float32"
    """The numpy dtype of its elements (an int8 matmul reads uint8 A and int8 B, writes
    int32 C)."""


@dataclass(frozen=True, slots=True)
class OpSignature:
    """A tensor operator with concrete shapes; hashable, comparable, serialisable as text.

    Build one with a kind's constructor (``matmul_op``, ``conv2d_op``...) or :meth:`parse`;
    the constructor validates every field and raises :class:`OpSignatureError` naming what
    is wrong.
    """

    kind: str
    dims: tuple[tuple[str, int], ...]
    dtype: str = "float32"
    attrs: tuple[tuple[str, str], ...] = ()
    epilogue: tuple[str, ...] = ()
    _text: str = field(default="", init=False, repr=False, compare=False, hash=False)
    _dims: Mapping[str, int] = field(default_factory=dict, init=False, repr=False,
                                     compare=False, hash=False)
    _arguments: tuple[TensorArg, ...] | None = field(default=None, init=False, repr=False,
                                                     compare=False, hash=False)

    def __post_init__(self) -> None:
        spec = _spec(self.kind)
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
        # Read on every estimate and feature row: built once. A plain dict (picklable,
        # deep-copyable), handed out as a read-only Mapping.
        object.__setattr__(self, "_dims", dict(self.dims))
        if self.dtype not in SUPPORTED_DTYPES:
            raise OpSignatureError(
                f"unsupported dtype {self.dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        if self.dtype not in spec.dtypes:
            raise OpSignatureError(
                f"{self.kind} has no {self.dtype} kernels; its dtypes: {', '.join(spec.dtypes)}")
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
        _check_epilogue(self.kind, self.epilogue, spec.epilogues, spec.epilogue_chain,
                        spec.epilogue_tail)
        if spec.check is not None:
            found = spec.check(self)
            if found:
                raise OpSignatureError(f"invalid {self.kind}: " + "; ".join(found))
        object.__setattr__(self, "_text", self._render(spec))

    # -- construction -------------------------------------------------------------------

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

    def _render(self, spec: KindSpec) -> str:
        parts = [f"{name}={value}" for name, value in self.dims
                 if name not in spec.omit_default or value != spec.params[name][0]]
        parts.append(f"dtype={self.dtype}")
        parts.extend(f"{name}={value}" for name, value in self.attrs
                     if name not in spec.omit_default or value != spec.attrs[name][0])
        parts.append("epilogue=" + ("+".join(self.epilogue) if self.epilogue else "none"))
        return f"{self.kind}({','.join(parts)})"

    # -- accessors ----------------------------------------------------------------------

    def dim(self, name: str) -> int:
        """The value of dimension ``name`` (KeyError naming the valid dims otherwise)."""
        for key, value in self.dims:
            if key == name:
                return value
        raise KeyError(
            f"{self.kind} has no dim {name!r}; dims: {', '.join(_spec(self.kind).all_dims)}"
        )

    def attr(self, name: str) -> str:
        """The value of attribute ``name``."""
        for key, value in self.attrs:
            if key == name:
                return value
        raise KeyError(f"{self.kind} has no attribute {name!r}")

    @property
    def dims_dict(self) -> Mapping[str, int]:
        """Dim name -> value (read-only)."""
        return self._dims

    @property
    def trans_a(self) -> bool:
        """Whether A is stored transposed (kinds with a two-letter ``layout``)."""
        return self.attr("layout")[0] == "t"

    @property
    def trans_b(self) -> bool:
        return self.attr("layout")[1] == "t"

    @property
    def shared(self) -> str:
        """Which operand is shared across the batch (``none`` when the kind has no batch)."""
        return dict(self.attrs).get("shared", "none")

    @property
    def batch(self) -> int:
        """The batch dim ``B`` (1 for kinds without one)."""
        return self.dims_dict.get("B", 1)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def out_h(self) -> int:
        """Output height of a windowed op (conv2d, pooling): from H, R and its parameters."""
        return window_output(self, "h")

    @property
    def out_w(self) -> int:
        """Output width of a windowed op: from W, S and its parameters."""
        return window_output(self, "w")

    @property
    def flops(self) -> int:
        """Floating-point operations (a multiply-add counts as two; epilogues not counted)."""
        return _kind(self.kind).flops(self)

    @property
    def min_bytes(self) -> int:
        """Bytes every implementation must move at least: each tensor read or written once."""
        return sum(_prod(arg.shape) * _ITEM_BYTES[arg.dtype] for arg in self.arguments())

    def arguments(self) -> tuple[TensorArg, ...]:
        """The kernel's array arguments in call order: inputs, then the output."""
        if self._arguments is None:  # a pure function of the op, asked for by every estimate
            object.__setattr__(self, "_arguments", _kind(self.kind).arguments(self))
        assert self._arguments is not None
        return self._arguments


def window_output(op: OpSignature, axis: str) -> int:
    """Output size along ``axis`` (``h`` or ``w``) of a 2-D windowed op with dims H/W, R/S
    and parameters ``stride_*``, ``pad_*``, ``dil_*``, ``ceil_mode`` (missing parameters take
    ONNX defaults)."""
    d = op.dims_dict
    if axis == "h":
        size, k, lo, hi, dil, stride = (d["H"], d["R"], d.get("pad_t", 0), d.get("pad_b", 0),
                                        d.get("dil_h", 1), d.get("stride_h", 1))
    else:
        size, k, lo, hi, dil, stride = (d["W"], d["S"], d.get("pad_l", 0), d.get("pad_r", 0),
                                        d.get("dil_w", 1), d.get("stride_w", 1))
    return conv_window(size, lo, hi, k, dil, stride, ceil=bool(d.get("ceil_mode", 0)))[1]


def window_params(stride: int | tuple[int, int], pads: int | tuple[int, int, int, int],
                  dilation: int | tuple[int, int]) -> tuple[tuple[str, int], ...]:
    """The ``stride_h, stride_w, pad_t, pad_l, pad_b, pad_r, dil_h, dil_w`` parameters of a
    2-D window op: ``stride`` and ``dilation`` are ``(h, w)`` or one int for both, ``pads``
    is ``(top, left, bottom, right)`` (ONNX ``pads`` order) or one int for all four."""
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    pt, pl, pb, pr = (pads,) * 4 if isinstance(pads, int) else pads
    return (("stride_h", sh), ("stride_w", sw), ("pad_t", pt), ("pad_l", pl), ("pad_b", pb),
            ("pad_r", pr), ("dil_h", dh), ("dil_w", dw))


def kernel_extent_problems(op: OpSignature) -> list[str]:
    """Why the dilated ``R x S`` kernel of a 2-D window op does not fit its padded input."""
    d = op.dims_dict
    found = []
    for axis, size, lo, hi, k, dil in (
        ("height", d["H"], d["pad_t"], d["pad_b"], d["R"], d["dil_h"]),
        ("width", d["W"], d["pad_l"], d["pad_r"], d["S"], d["dil_w"]),
    ):
        extent, _ = conv_window(size, lo, hi, k, dil, 1)
        if extent > size + lo + hi:
            found.append(f"kernel {axis} {k} (dilated to {extent}) is larger than the padded "
                         f"input {axis} {size}+{lo}+{hi}={size + lo + hi}")
    return found


def conv_window(size: int, pad_lo: int, pad_hi: int, kernel: int, dil: int,
                stride: int, ceil: bool = False) -> tuple[int, int]:
    """(dilated kernel extent, output size) along one spatial axis.

    ``ceil`` is ONNX pooling's ``ceil_mode``: the output size rounds up, except that a last
    window starting past the input (in the end padding or beyond) is dropped.
    """
    extent = dil * (kernel - 1) + 1
    span = size + pad_lo + pad_hi - extent
    if not ceil:
        return extent, span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + pad_lo:
        out -= 1
    return extent, out


def shape_family(text: str) -> tuple[str, tuple[int, ...]] | None:
    """An op text split into its *family* (the text without its size dims: ops that differ
    only in sizes share it) and its sizes in the kind's dim order; None when the text is not
    a canonical op text. Reads the text without building an :class:`OpSignature`, so whole
    indexes can be grouped cheaply."""
    kind, sep, rest = text.partition("(")
    if not sep or not rest.endswith(")"):
        return None
    try:
        dims = _spec(kind).dims
    except OpSignatureError:
        return None
    sizes: dict[str, int] = {}
    others = []
    for item in rest[:-1].split(","):
        name, _, value = item.partition("=")
        if name in dims:
            if not value.isdigit():
                return None
            sizes[name] = int(value)
        else:
            others.append(item)
    if len(sizes) != len(dims):
        return None
    return f"{kind}({','.join(others)})", tuple(sizes[d] for d in dims)


def _kind(name: str) -> OpKind:
    from tunecache.compiler.kinds import op_kind

    return op_kind(name)


def _spec(name: str) -> KindSpec:
    return _kind(name).spec


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


def _check_epilogue(kind: str, epilogue: tuple[str, ...], allowed: tuple[str, ...],
                    chain: bool = False, tail: tuple[str, ...] = ()) -> None:
    # Epilogues are applied in a fixed order (the order of `allowed`); requiring that order in
    # the signature keeps one canonical text per computation. A chain is its own order.
    start = next((i for i, step in enumerate(epilogue) if step in tail and step not in allowed),
                 len(epilogue))
    if start < len(epilogue):
        _check_epilogue(kind, epilogue[:start], allowed)
        _check_epilogue(kind, epilogue[start:], tail, chain=True)
        return
    if chain:
        unknown = [step for step in epilogue if step not in allowed]
        if unknown:
            raise OpSignatureError(
                f"{kind} epilogue step {unknown[0]!r} is not supported; expected a '+'-joined "
                f"chain of {', '.join(allowed)} (any order, repeats allowed) or none"
            )
        return
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
    try:
        spec = _spec(kind)
    except OpSignatureError as exc:
        raise OpSignatureError(f"cannot parse op {text!r}: {exc}") from None
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
        digits = raw.lstrip("0") or "0"
        if len(digits) > len(str(MAX_DIM)):
            # Checked on the text: int() refuses thousands of digits with a ValueError.
            raise OpSignatureError(
                f"cannot parse op {kind}(...): dim {name} has {len(digits)} digits; dims are at "
                f"most {MAX_DIM}"
            )
        dims.append((name, int(digits)))
    attrs = tuple((name, values.get(name, choices[0])) for name, choices in spec.attrs.items())
    return OpSignature(
        kind,
        tuple(dims),
        values.get("dtype", "float32"),
        attrs,
        _epilogue_tuple(values.get("epilogue", "none")),
    )
