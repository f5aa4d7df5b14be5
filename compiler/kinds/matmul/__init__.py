"""The ``matmul`` kind: ``C[M,N] = op(A)[M,K] @ op(B)[K,N]``, then the epilogue.

``layout`` has two letters, one per operand, ``n`` (stored as written) or ``t`` (stored
transposed: A as ``[K,M]``, B as ``[N,K]``). Epilogue: ``bias`` adds ``bias[N]``, then at
most one activation (:data:`ACTIVATIONS`: ``relu``, or GELU in its erf or tanh form, as
:mod:`~tunecache.compiler.codegen.epilogue` defines them). An ``elementwise`` activation
reading a matmul's result fuses into it (:func:`fuse_activation`). The BLIS-style kernels
(``emit.py``) and the dot-product kernel for ``C = A·Bᵀ`` (``emit_dot.py``) share the
schedule family of ``space.py``, which ``batch_matmul`` reuses.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tunecache.compiler.backends import backend_for
from tunecache.compiler.codegen.epilogue import CHAIN_STEPS, CHANNEL_OPERAND, chain_rows
from tunecache.compiler.codegen.epilogue import reference as epilogue_reference
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import ChannelView, OpKind, register
from tunecache.compiler.kinds.elementwise import KIND as ELEMENTWISE
from tunecache.compiler.kinds.matmul.emit import generate_matmul
from tunecache.compiler.kinds.matmul.emit_dot import generate_matmul_dot
from tunecache.compiler.kinds.matmul.emit_lowp import (
    dynamic_a,
    float_a,
    generate_lowp,
    narrow_c,
)
from tunecache.compiler.kinds.matmul.emit_strassen import generate_strassen
from tunecache.compiler.kinds.matmul.emit_tiles import TILE_REGISTERS, TILE_ROWS, tiles_used
from tunecache.compiler.kinds.matmul.space import (
    LOOP_ORDERS,
    PARALLEL_AXES,
    MatmulSchedule,
    default_matmul_schedule,
    matmul_problems,
    strassen_blocks,
)
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg

__all__ = ["ACTIVATIONS", "LOOP_ORDERS", "PARALLEL_AXES", "MatmulSchedule", "fuse_activation",
           "matmul_op", "strassen_block"]

LAYOUTS = ("nn", "nt", "tn", "tt")
A_TYPES = ("dtype", "float32", "dynamic")
"""How A arrives: as the op's dtype, or (``a_type=float32``, int8 and bf16 only) as float32
that the kernel converts while packing it: rounded to bfloat16, or quantized to u8 with the
``qa`` argument ``[scale, zero point]`` (``rint(a / scale) + zero point``, saturated), so no
separate quantize pass runs over the activations. ``a_type=dynamic`` (int8, epilogue
``dequant+bias``...) quantizes float32 A with the scale and zero point of its own range, as
ONNX ``DynamicQuantizeLinear`` does (:func:`dynamic_params`): then ``scale`` holds B's
per-column scales, ``zsum`` their products with B's column sums, and the kernel scales both
by A's parameters (the zero point's term ``- s_a * z_a * zsum[n]`` joins the bias)."""
ELEMENT_TYPES = {"float32": ("float32", "float32", "float32"),
                 "int8": ("uint8", "int8", "int32"),
                 "bf16": ("bfloat16", "bfloat16", "float32")}
"""Per op dtype, the element types of A, B and C (and bias): int8 multiplies u8 activations
by s8 weights and accumulates exactly in int32 (a ``dequant`` epilogue makes C float32),
bf16 accumulates in float32."""
ACTIVATIONS = ("relu", "gelu_erf", "gelu_tanh")
"""The epilogue's activations, after ``bias``; an op has at most one."""
NARROW = ("none", "y")
"""What a bf16 matmul holds narrower than its element types say: C (``y``) as bfloat16, for
a bf16 reader that would round it so anyway (:mod:`tunecache.compiler.lowering.bf16`)."""


def matmul_op(M: int, N: int, K: int, *, trans_a: bool = False, trans_b: bool = False,
              epilogue: tuple[str, ...] | str = (), dtype: str = "float32",
              a_type: str = "dtype", narrow: str = "none") -> OpSignature:
    """``C[M,N] = op(A) @ op(B)``, operands optionally stored transposed; ``narrow="y"`` (bf16
    only) stores C as bfloat16."""
    return OpSignature(KIND.name, (("M", M), ("N", N), ("K", K)), dtype,
                       (("layout", layout_attr(trans_a, trans_b)), ("a_type", a_type),
                        ("narrow", narrow)),
                       epilogue_tuple(epilogue))


def layout_attr(trans_a: bool, trans_b: bool) -> str:
    return ("t" if trans_a else "n") + ("t" if trans_b else "n")


def epilogue_tuple(epilogue: tuple[str, ...] | str) -> tuple[str, ...]:
    if isinstance(epilogue, str):
        return () if epilogue in ("", "none") else tuple(epilogue.split("+"))
    return tuple(epilogue)


def element_types(op: OpSignature) -> tuple[str, str, str]:
    """The element types of A, B and C (and bias) of ``op``."""
    a_type, b_type, c_type = ELEMENT_TYPES[op.dtype]
    if float_a(op):
        a_type = "float32"
    if "dequant" in op.epilogue:
        c_type = "float32"
    return a_type, b_type, c_type


def gemm_arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    """A, B[, qa][, scale][, bias], C; operands without a batch dim when the op has none or
    shares them."""
    d = op.dims_dict
    M, N, K = d["M"], d["N"], d["K"]
    a_shape: tuple[int, ...] = (K, M) if op.trans_a else (M, K)
    b_shape: tuple[int, ...] = (N, K) if op.trans_b else (K, N)
    c_shape: tuple[int, ...] = (M, N)
    if "B" in d:
        B = d["B"]
        if op.shared != "a":
            a_shape = (B, *a_shape)
        if op.shared != "b":
            b_shape = (B, *b_shape)
        c_shape = (B, M, N)
    a_type, b_type, c_type = element_types(op)
    out_type = "bfloat16" if narrow_c(op) else c_type
    args = [TensorArg("A", a_shape, "input", a_type), TensorArg("B", b_shape, "input", b_type)]
    if float_a(op) and op.dtype == "int8" and not dynamic_a(op):
        args.append(TensorArg("qa", (2,), "input", "float32"))
    if "dequant" in op.epilogue:
        args.append(TensorArg("scale", (N,), "input", "float32"))
    if dynamic_a(op):
        args.append(TensorArg("zsum", (N,), "input", "float32"))
    if "bias" in op.epilogue:
        args.append(TensorArg("bias", (N,), "input", c_type))
    if chain_rows(op.epilogue):
        args.append(TensorArg(CHANNEL_OPERAND, (chain_rows(op.epilogue), N), "input"))
    args.append(TensorArg("C", c_shape, "output", out_type))
    return tuple(args)


def with_narrow(op: OpSignature, tensors: frozenset[str]) -> OpSignature | None:
    """``OpKind.with_narrow``: a bf16 matmul holding A (``x``: bfloat16 as its dtype says,
    where it took float32 to round) and C (``y``) as bfloat16; None for anything else."""
    if op.dtype != "bf16" or not tensors <= {"x", "y"} or op.trans_a or op.trans_b:
        return None
    out = op
    if "x" in tensors:
        out = replace(out, attrs=tuple((k, "dtype" if k == "a_type" else v)
                                       for k, v in out.attrs))
    if "y" in tensors:
        out = replace(out, attrs=tuple((k, "y" if k == "narrow" else v) for k, v in out.attrs))
    return out


def quantize_u8(x: np.ndarray, qa: np.ndarray) -> np.ndarray:
    """``x`` quantized to u8 as an ``a_type=float32`` int8 kernel does: float32 ``x / scale``
    rounded half to even, plus the zero point, saturated."""
    scale, zero = np.float32(qa[0]), np.float32(qa[1])
    q = np.rint(np.asarray(x, dtype=np.float32) / scale) + zero
    return np.clip(q, 0, 255).astype(np.uint8)


def dynamic_params(a: np.ndarray) -> np.ndarray:
    """``[scale, zero point]`` of ``DynamicQuantizeLinear`` for ``a``, in float32 as the
    kernel computes them: its range widened to hold 0 mapped onto [0, 255] (scale 1 for a
    range of 0 alone), the zero point ``rint(clip(-min / scale, 0, 255))``."""
    f = np.float32
    a32 = np.asarray(a, dtype=np.float32)
    lo = f(min(0.0, float(a32.min()))) if a32.size else f(0)
    hi = f(max(0.0, float(a32.max()))) if a32.size else f(0)
    scale = f(1) if hi == lo else f((hi - lo) / f(255))
    return np.array([scale, np.rint(np.clip(f(0) - lo / scale, f(0), f(255)))], np.float32)


def _converted_a(op: OpSignature, a: np.ndarray, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    if not float_a(op):
        return a
    if dynamic_a(op):
        return quantize_u8(a, dynamic_params(a)).astype(np.float64)
    if op.dtype == "int8":
        return quantize_u8(a, inputs[2]).astype(np.float64)
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def gemm_reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """``op(A) @ op(B)`` then the epilogue, in the inputs' dtype (A converted first where
    the kernel converts it)."""
    a, b = _converted_a(op, inputs[0], inputs), inputs[1]
    if op.trans_a:
        a = np.swapaxes(a, -1, -2)
    if op.trans_b:
        b = np.swapaxes(b, -1, -2)
    names = [arg.name for arg in op.arguments() if arg.role == "input"]
    operands = {name: inputs[i] for i, name in enumerate(names)
                if name in ("scale", "bias", CHANNEL_OPERAND)}
    if dynamic_a(op):
        scale, zero = (float(v) for v in dynamic_params(inputs[0]))
        zsum = inputs[names.index("zsum")]
        operands.update(scale=scale * operands["scale"],
                        bias=operands["bias"] - scale * zero * zsum)
    return epilogue_reference(op.epilogue, np.matmul(a, b), operands)


def gemm_flops(op: OpSignature) -> int:
    d = op.dims_dict
    return 2 * op.batch * d["M"] * d["N"] * d["K"]


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _signature_problems(op: OpSignature) -> list[str]:
    found = _lowp_problems(op)
    acts = [step for step in op.epilogue if step in ACTIVATIONS]
    if len(acts) > 1:
        found.append(f"epilogue {'+'.join(op.epilogue)} has {len(acts)} activations "
                     f"({', '.join(acts)}); at most one")
    return found


def _lowp_problems(op: OpSignature) -> list[str]:
    found = []
    if op.dtype != "int8" and "dequant" in op.epilogue:
        found.append("dequant is an int8 matmul's epilogue step")
    if op.dtype == "float32":
        if narrow_c(op):
            found.append("narrow=y (C as bfloat16) is for bf16 matmuls")
        if float_a(op):
            found.append(f"a_type={op.attr('a_type')} is for low-precision matmuls")
        if chain_rows(op.epilogue) or "qround" in op.epilogue:
            found.append("an element-wise chain (cadd, cmul, qround, ...) follows an int8 or "
                         "bf16 matmul's epilogue, not a float32 one's")
        return found
    if narrow_c(op) and op.dtype != "bf16":
        found.append("narrow=y (C as bfloat16) is for bf16 matmuls")
    if dynamic_a(op) and (op.dtype != "int8" or op.epilogue[:2] != ("dequant", "bias")):
        found.append("a_type=dynamic is for int8 matmuls whose epilogue starts with "
                     "dequant+bias (the zero point's term joins the bias)")
    if op.trans_a or op.trans_b:
        found.append(f"{_a(op.dtype)} matmul is layout=nn so far")
    if op.dtype == "int8" and op.epilogue and op.epilogue[0] != "dequant":
        found.append(f"an int8 matmul's epilogue starts with dequant (its C is int32 until "
                     f"then), not {op.epilogue[0]}")
    return found


def fuse_activation(producer: OpSignature, reader: OpSignature) -> OpSignature | None:
    """``OpKind.fuses``: a matmul without an activation and an ``elementwise`` op applying
    one activation to its whole result (same rows and columns, no other operand), as the
    matmul with that activation in its epilogue: BERT's and ViT's FFN GELU, for one."""
    if producer.kind != KIND.name or reader.kind != ELEMENTWISE.name:
        return None
    if (len(reader.epilogue) != 1 or reader.epilogue[0] not in ACTIVATIONS
            or any(step in ACTIVATIONS for step in producer.epilogue)
            or len(reader.arguments()) != 2
            or (reader.dim("M"), reader.dim("N")) != (producer.dim("M"), producer.dim("N"))):
        return None
    return replace(producer, epilogue=producer.epilogue + reader.epilogue)


def channel_view(op: OpSignature) -> ChannelView | None:
    """``OpKind.channel_view``: an int8 or bf16 matmul takes a chain over its columns (``M``
    rows of ``N``, a per-column operand one value per column)."""
    if op.dtype == "float32":
        return None
    return ChannelView(rows=op.dim("M"), cols=op.dim("N"), per_channel="row",
                       channels=op.dim("N"))


def bf16_variant(op: OpSignature, hw: HardwareSpec) -> tuple[OpSignature, bool] | None:
    """``OpKind.bf16_variant``: a float32 matmul (A stored as written) whose epilogue the bf16
    kernel has, as that kernel rounding float32 A itself; its B transposed when stored so."""
    if op.dtype != "float32" or op.trans_a or \
            any(step not in ("bias", *ACTIVATIONS) for step in op.epilogue):
        return None
    variant = matmul_op(op.dim("M"), op.dim("N"), op.dim("K"), epilogue=op.epilogue,
                        dtype="bf16", a_type="float32")
    return variant, op.trans_b


def strassen_block(op: OpSignature, levels: int = 1) -> OpSignature:
    """The block product ``levels`` of Strassen run ``7 ** levels`` times for ``op`` (each
    dimension over ``2 ** levels``, rounded up), no epilogue: what its micro-tiles and
    blocks are chosen and estimated for."""
    return matmul_op(*strassen_blocks(op, levels), trans_a=op.trans_a, trans_b=op.trans_b,
                     dtype=op.dtype)


def emit_gemm(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    if op.dtype != "float32":
        return generate_lowp(op, s, d)
    if s.loop_order == "dot":
        return generate_matmul_dot(op, s, d)
    if s.strassen:
        return generate_strassen(op, s, d)
    return generate_matmul(op, s, d)


LOWP_KNOBS: dict[str, int | str] = {"pack_a": 0, "pack_b": 1, "strassen": 0, "loop_order": "jpi",
                                    "unroll": 1}
"""The knobs a low-precision kernel has one value of (it packs A per call)."""
LOWP_PARALLEL = ("m", "n")
"""How a low-precision kernel splits C among threads: row tiles, or B's column panels."""


def gemm_problems(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> list[str]:
    """:func:`matmul_problems`, and for int8 and bf16 the knobs their kernel has one value
    of and its tile's limit."""
    found = matmul_problems(op, s, hw)
    if op.dtype != "float32" and s.loop_order == "amx":
        fixed = {k: v for k, v in LOWP_KNOBS.items() if k != "loop_order"}
        found += [f"{_a(op.dtype)} matmul takes {knob}={want!r}, not {getattr(s, knob)!r}"
                  for knob, want in fixed.items() if getattr(s, knob) != want]
        found += tile_problems(op, s, hw) + _parallel_problems(op, s)
    elif op.dtype != "float32":
        found += _parallel_problems(op, s)
        found += [f"{_a(op.dtype)} matmul takes {knob}={want!r}, not {getattr(s, knob)!r}"
                  for knob, want in LOWP_KNOBS.items() if getattr(s, knob) != want]
        accumulators = s.mr * (s.nr // hw.lanes)
        if accumulators > hw.vector_registers // 2:
            found.append(f"{_a(op.dtype)} tile {s.mr}x{s.nr} has {accumulators} accumulators; "
                         f"at most {hw.vector_registers // 2} on {hw.isa}")
    return found


def _parallel_problems(op: OpSignature, s: MatmulSchedule) -> list[str]:
    if s.parallel in LOWP_PARALLEL:
        return []
    return [f"{_a(op.dtype)} matmul splits parallel='m' or 'n', not {s.parallel!r}"]


def tile_dtypes(hw: HardwareSpec) -> frozenset[str]:
    """The dtypes whose matmuls ``hw`` runs on matrix tiles (AMX)."""
    return frozenset(dtype for dtype, _ in backend_for(hw).dialect(hw).tiles)


def tile_problems(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> list[str]:
    """Why ``loop_order=amx`` cannot run ``op`` under ``s`` on ``hw`` (empty: it can)."""
    found = []
    if op.dtype not in tile_dtypes(hw):
        found.append(f"loop_order=amx needs {op.dtype} matrix tiles (AMX); {hw.hw_id} has none")
    if s.mr % TILE_ROWS or s.nr % TILE_ROWS:
        found.append(f"loop_order=amx takes mr and nr in whole tiles of {TILE_ROWS}, "
                     f"not {s.mr}x{s.nr}")
    elif tiles_used(s.mr, s.nr) > TILE_REGISTERS:
        found.append(f"tile {s.mr}x{s.nr} needs {tiles_used(s.mr, s.nr)} tile registers "
                     f"(C, A and B); there are {TILE_REGISTERS}")
    return found


def default_gemm_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> MatmulSchedule:
    """:func:`default_matmul_schedule`, with a low-precision kernel's fixed knobs."""
    s = default_matmul_schedule(op, hw, threads)
    if op.dtype == "float32":
        return s
    # Four rows by 16 accumulators on 32 registers (8 on 16): more spilled on Zen 4 (the
    # 128x768x768 kernel at 14x32 ran 168 GOP/s, at 4x64 438).
    # Columns in blocks whose packed B (up to 2 bytes an element) fills L2, which every row
    # tile then reads from L2: 128x3072x768 swept whole ran 1.54 ms, in 640-column blocks
    # 1.40 (320: 1.64; 1280: 1.49; one thread, Zen 4).
    if op.dtype in tile_dtypes(hw):
        # Two by two tiles of C: each K step loads two A and two B tiles for four products.
        nr = 2 * TILE_ROWS
        return replace(s, mr=2 * TILE_ROWS, nr=nr, nc=lowp_column_block(op, hw, nr),
                       mc=2 * TILE_ROWS, pack_a=0, pack_b=1, strassen=0, loop_order="amx",
                       unroll=1, parallel=tile_split(op, hw, threads, 2 * TILE_ROWS))
    nr = (4 if hw.vector_registers >= 32 else 2) * hw.lanes
    return replace(s, mr=4, nr=nr, nc=lowp_column_block(op, hw, nr), mc=max(4, s.mc // 4 * 4),
                   pack_a=0, pack_b=1, strassen=0, loop_order="jpi", unroll=1, parallel="m")


def tile_split(op: OpSignature, hw: HardwareSpec, threads: int, mr: int) -> str:
    """How a tile matmul's threads share C: B's column panels (``n``) where its weights
    outgrow L2, which each thread then streams a share of, or where there are fewer row
    tiles of ``mr`` rows than threads; else row tiles (``m``). Two threads, weights cold, AMX Xeon:
    BERT-base's 128x768x3072 bf16 0.58 -> 0.49 ms by columns, 128x3072x768 0.61 -> 0.55, but
    128x768x768 (1.2 MB of weights) 0.157 -> 0.18."""
    rows = -(-op.dim("M") // mr)
    weights = op.dim("K") * op.dim("N") * op.dtype_bytes
    return "n" if threads > 1 and (weights > hw.l2_bytes or rows < threads) else "m"


def lowp_column_block(op: OpSignature, hw: HardwareSpec, nr: int) -> int:
    """A low-precision kernel's ``nc``: the most ``nr``-column panels whose packed B fills
    half of L2 (int8; a bf16 block as many bytes), at most 4096 columns; on tiles a tenth of
    L2 in bytes. A model's weights come from memory, and on tiles the row tiles of a small
    block reuse it sooner after their first fetched it: BERT-base's
    128x768x3072 bf16 with its B cold ran 0.97 ms in 160-column blocks (half of L2), 0.84 in
    32 (a tenth); 128x3072x768 1.01 in 672, 0.87 in 128; int8 128x3072x768 0.51 in 1344,
    0.46 in 256 (one thread, AMX Xeon, L2 2 MiB)."""
    if op.dtype in tile_dtypes(hw):
        columns = hw.l2_bytes // (10 * op.dim("K") * op.dtype_bytes)
    else:
        columns = hw.l2_bytes // (2 * op.dim("K"))
    return max(nr, min(4096, columns) // nr * nr)


def packed_b_layout(op: OpSignature, s: MatmulSchedule) -> tuple[int | str, ...]:
    """What ``tc_pack_weights`` depends on: op(B)'s shape and storage, and the blocks
    (``NC`` x ``KC``, as clipped by the emitter) of ``NR``-column panels it writes, or with
    ``strassen`` the B sums of its products in ``NR``-column panels of ``KC``-row blocks of
    K's block (no N blocks); the rows ``M`` and every other knob leave the packed bytes the
    same."""
    n, k, nr = op.dim("N"), op.dim("K"), s.nr
    if op.dtype != "float32":  # one panel layout per dtype, width and K padding
        return (n, k, nr, op.dtype) + (("amx",) if s.loop_order == "amx" else ())
    if s.strassen:
        return (n, k, int(op.trans_b), nr, min(s.kc, strassen_blocks(op, s.strassen)[2]), 0,
                s.strassen)
    return n, k, int(op.trans_b), nr, min(s.kc, k), min(s.nc, -(-n // nr) * nr), 0


KIND = register(OpKind(
    name="matmul",
    spec=KindSpec(dims=("M", "N", "K"),
                  attrs={"layout": LAYOUTS, "a_type": A_TYPES, "narrow": NARROW},
                  epilogues=("dequant", "bias", *ACTIVATIONS), check=_signature_problems,
                  epilogue_tail=tuple(CHAIN_STEPS.values()),
                  dtypes=("float32", "int8", "bf16"),
                  omit_default=frozenset({"a_type", "narrow"})),
    arguments=gemm_arguments,
    flops=gemm_flops,
    schedule=MatmulSchedule,
    problems=gemm_problems,
    default_schedule=default_gemm_schedule,
    emit=emit_gemm,
    reference=gemm_reference,
    reduction_length=lambda op: op.dim("K"),
    dim_columns={"M": "dim_m", "N": "dim_n", "K": "dim_k"},
    # A matmul's B is a model's constant weights (the frontend gives a product of two
    # activations to batch_matmul), packed once when the model is compiled: a packed-B
    # schedule pays no packing per call, and is timed that way.
    prepacked_timing=True,
    packed_weights_layout=packed_b_layout,
    fuses=fuse_activation,
    bf16_variant=bf16_variant,
    channel_view=channel_view,
    with_narrow=with_narrow,
    examples=("matmul(M=128,N=768,K=768,epilogue=bias)", "matmul(M=1,N=1000,K=2048,layout=nt)",
              "matmul(M=97,N=13,K=511,layout=tn,epilogue=bias+relu)",
              "matmul(M=128,N=3072,K=768,epilogue=bias+gelu_erf)"),
))
