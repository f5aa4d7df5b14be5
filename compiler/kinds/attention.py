"""The ``attention`` kind: fused scaled-dot-product attention, one tiled kernel.

``Y[b] = softmax(Q[b] @ K[b]^T * scale + mask) @ V[b]`` for every batch item ``b`` (batch x
heads), never materialising the ``M x N`` score matrix: the CPU form of FlashAttention.

Signature ``attention(B, M, N, D, Dv, mask_rows, heads, mask, scale, tokens)``:

* dims ``B`` (batch items: batch x heads), ``M`` (queries), ``N`` (keys and values), ``D``
  (head dim of Q and K); parameter ``Dv`` (head dim of V and Y; 0, the default, means
  ``D`` and is the only way to write it, so the text stays canonical).
* arguments, all contiguous float32: ``Q[B,M,D]``, ``K[B,N,D]``, ``V[B,N,Dv]``, then
  ``scale[1]`` and ``mask[mask_rows,N]`` (``mask[mask_rows,M,N]`` for ``full``) when used,
  then ``Y[B,M,Dv]``.
* ``tokens`` names the tensors among Q, K, V and Y laid out token-major instead:
  ``[B / heads, rows, heads x width]``, the layout of the projections before the head split
  (``Reshape`` to ``[b, rows, heads, width]``, ``Transpose(0, 2, 1, 3)``) and after the
  merge, so those transposes cost no copy; item ``b`` is head ``b % heads`` of batch
  ``b // heads``. ``none`` (the default, left out of the text with ``heads=0``), or the
  letters in order: ``qkvy`` (an encoder), ``qy`` (keys and values from a cache), ``y``.
* ``scale=default`` multiplies the scores by ``1/sqrt(D)`` (a constant of the kernel);
  ``scale=input`` by the runtime float ``scale[0]`` (floats are never part of a signature).
* ``mask``: ``none``; ``causal``: query ``i`` sees keys ``j <= i + (N - M)``, aligned at
  the bottom right as with a key/value cache (needs ``M <= N``; decoding one token after
  ``P`` past ones is ``M=1, N=P+1``; ``M = N`` is the usual lower triangle);
  ``padding``: an additive float mask ``mask[mask_rows, N]`` (0 for keys to keep, a large
  negative value or ``-inf`` for padding, as exporters produce), batch item ``b`` adding
  row ``b // (B // mask_rows)``: ``mask_rows = batch`` over ``B = batch x heads`` items is
  BERT's ``[batch, 1, 1, N]`` mask, ``mask_rows=1`` one mask for all; ``mask_rows`` must
  divide ``B`` and is 0 without an additive mask; ``causal_padding``: both; ``full``: an
  additive mask per query row, ``mask[mask_rows, M, N]``, item ``b`` adding matrix
  ``b // (B // mask_rows)`` (the ``[batch, 1, M, N]`` masks exporters build at run time from
  a padding mask and the causal one).

A query row whose every key is masked to ``-inf`` outputs zeros (PyTorch's SDPA since 2.5
and FlashAttention do the same; a plain numpy softmax would give NaN). Finite masks are
ordinary additive values: a row padded everywhere with ``-1e4`` gets the softmax of its
unmasked scores (softmax is shift invariant), one padded with ``finfo(float32).min`` the
mean of V (every score rounds to the same value), as onnxruntime and PyTorch compute them.

Kernel (schedule :class:`AttentionSchedule`): the ``B x ceil(M / q_block)`` blocks of
``q_block`` query rows are split over ``threads`` in contiguous ranges. A block copies its
scaled queries to the thread's workspace and streams the keys in blocks of ``k_block``:

1. scores ``S = Qs @ K_blk^T`` of the block's rows. ``score=outer`` vectorises over keys: a
   register tile broadcasts query elements against ``K^T``, packed once per batch item into
   the workspace (``D x N`` floats; best when many query blocks share it). ``score=dot``
   vectorises over ``D``: dot products along the head dim straight from ``K``, reduced
   horizontally (no packing: decode steps with one query row);
2. per row, online softmax: add the mask, take the block's max, raise the running max ``m``,
   rescale the running sum ``l`` and the output accumulator by ``exp(m_old - m_new)``, and
   overwrite ``S`` with ``P = exp(S - m_new)`` (causally hidden keys get ``P = 0``; key
   blocks wholly past the block's last visible key are never read);
3. ``O += P @ V_blk``: a register tile broadcasting ``P`` against rows of ``V``.

At the end ``Y = O / l`` (0 where ``l = 0``). Scores, ``P`` and ``O`` of a block stay in the
thread's workspace (a few KiB: L1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations
from typing import ClassVar

import numpy as np

from tunecache.compiler.codegen.abi import (
    ALIGN_FLOATS,
    HEADER,
    TIMER,
    WORKSPACE,
    defines,
    parallel_entry,
    unpack_args,
)
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, accumulate, store
from tunecache.compiler.elements import decoded, to_bfloat16
from tunecache.compiler.hardware import HardwareSpec, isa_level
from tunecache.compiler.kinds import OpKind, narrow_tensors, register
from tunecache.compiler.kinds.attention_tiles import (
    NARROW,
    TILE_K_BLOCKS,
    TILE_Q_BLOCKS,
    TileView,
    emit_attention_tiles,
    tile_problems,
    tile_workspace_bytes,
    with_narrow,
)
from tunecache.compiler.kinds.matmul import tile_dtypes
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg
from tunecache.compiler.schedule import MAX_PACKED_BYTES, ScheduleData, threads_problem

__all__ = ["K_BLOCKS", "MASKS", "MAX_Q_BLOCK", "SCORES", "TOKENS", "AttentionSchedule",
           "attention_op",
           "balanced_chunks", "causal_keep", "dot_keys", "has_mask_input", "has_padding",
           "is_causal", "tile_vectors", "value_dim"]

MASKS = ("none", "causal", "padding", "causal_padding", "full")
TOKENS = ("none", *("".join(c) for r in range(1, 5) for c in combinations("qkvy", r)))
"""Values of ``tokens``: none, or which of Q, K, V, Y are token-major (letters in order)."""
_ADDITIVE = ("padding", "causal_padding", "full")
SCALES = ("default", "input")
SCORES = ("outer", "dot", "tiles")
K_BLOCKS = (16, 32, 64, 128, 256)
MAX_Q_BLOCK = 8
_MAX_TILE_VECTORS = 4


@dataclass(frozen=True, slots=True)
class AttentionSchedule(ScheduleData):
    """Knobs of an attention kernel: ``q_block`` query rows per block (1..8), ``k_block``
    keys per streamed block (16..256, powers of two), ``score`` (``outer``: vectorised over
    keys against a packed ``K^T``; ``dot``: vectorised over ``D``, nothing packed; ``tiles``,
    bf16 ops only: matrix tiles, :mod:`~tunecache.compiler.kinds.attention_tiles`, with
    ``q_block`` 16 or 32 and ``k_block`` keys a score step, 16 or 32) and ``threads`` (each
    takes a contiguous range of query blocks)."""

    family: ClassVar[str] = "attention"

    q_block: int = 4
    k_block: int = 64
    score: str = "outer"
    threads: int = 1

    def __str__(self) -> str:
        return f"q{self.q_block} k{self.k_block} {self.score} t{self.threads}"


def attention_op(B: int, M: int, N: int, D: int, *, Dv: int | None = None, mask: str = "none",
                 mask_rows: int | None = None, scale: str = "default", tokens: str = "none",
                 heads: int = 0, dtype: str = "float32", narrow: str = "none") -> OpSignature:
    """``softmax(Q K^T * scale + mask) V`` over ``B`` items; ``Dv`` defaults to ``D`` and
    ``mask_rows`` to 1 for the additive masks (0 otherwise); ``tokens`` with ``heads`` lays
    the named tensors out token-major."""
    dv = 0 if Dv is None or Dv == D else Dv
    rows = (1 if mask in _ADDITIVE else 0) if mask_rows is None else mask_rows
    return OpSignature(
        KIND.name, (("B", B), ("M", M), ("N", N), ("D", D), ("Dv", dv), ("mask_rows", rows),
                    ("heads", heads)),
        dtype, (("mask", mask), ("scale", scale), ("tokens", tokens), ("narrow", narrow)), (),
    )


def token_major(op: OpSignature, tensor: str) -> bool:
    """Whether ``tensor`` (``q``, ``k``, ``v`` or ``y``) is laid out token-major."""
    return tensor in op.attr("tokens").replace("none", "")


def value_dim(op: OpSignature) -> int:
    """The head dim of V and Y (``Dv``, or ``D`` when ``Dv=0``)."""
    return op.dim("Dv") or op.dim("D")


def is_causal(op: OpSignature) -> bool:
    """Whether ``op`` hides keys past each query's position (``causal``, ``causal_padding``)."""
    return op.attr("mask") in ("causal", "causal_padding")


def has_padding(op: OpSignature) -> bool:
    """Whether ``op`` adds a mask row per batch item group (``padding``, ``causal_padding``)."""
    return op.attr("mask") in ("padding", "causal_padding")


def has_mask_input(op: OpSignature) -> bool:
    """Whether ``op`` takes an additive mask input (``padding``, ``causal_padding``,
    ``full``)."""
    return op.attr("mask") in _ADDITIVE


def _full_mask(op: OpSignature) -> bool:
    return op.attr("mask") == "full"


def _signature_problems(op: OpSignature) -> list[str]:
    d = op.dims_dict
    found = []
    if narrow_tensors(op) and op.dtype != "bf16":
        found.append(f"narrow={op.attr('narrow')}: only a bf16 attention takes bfloat16 inputs")
    if d["Dv"] == d["D"]:
        found.append(f"Dv={d['Dv']} equals D; write Dv=0 (the default, Dv = D)")
    if has_mask_input(op):
        if d["mask_rows"] < 1:
            found.append(f"mask={op.attr('mask')} needs mask_rows >= 1 (rows of the additive "
                         f"mask [mask_rows, {'M, ' if _full_mask(op) else ''}N])")
        elif d["B"] % d["mask_rows"]:
            found.append(f"mask_rows={d['mask_rows']} does not divide B={d['B']} (item b adds "
                         "mask row b // (B // mask_rows))")
    elif d["mask_rows"]:
        found.append(f"mask_rows={d['mask_rows']} applies to the padding and full masks only; "
                     "use mask_rows=0")
    if op.attr("tokens") != "none" and (d["heads"] < 1 or d["B"] % d["heads"]):
        found.append(f"tokens={op.attr('tokens')} needs heads >= 1 dividing B={d['B']} "
                     f"(item b is head b % heads of batch b // heads); got heads={d['heads']}")
    elif op.attr("tokens") == "none" and d["heads"]:
        found.append(f"heads={d['heads']} applies to token-major tensors only; use heads=0 "
                     "with tokens=none")
    if is_causal(op) and d["M"] > d["N"]:
        found.append(f"mask={op.attr('mask')} needs M <= N (query i sees keys j <= i + N - M); "
                     f"got M={d['M']}, N={d['N']}")
    return found


def _layout_shape(op: OpSignature, tensor: str, rows: int, width: int) -> tuple[int, int, int]:
    b, heads = op.dim("B"), op.dim("heads")
    if token_major(op, tensor):
        return b // heads, rows, heads * width
    return b, rows, width


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    d = op.dims_dict
    m, n, dv = d["M"], d["N"], value_dim(op)
    held = narrow_tensors(op)

    def of(t: str) -> str:
        return "bfloat16" if t in held else "float32"
    args = [TensorArg("Q", _layout_shape(op, "q", m, d["D"]), "input", of("q")),
            TensorArg("K", _layout_shape(op, "k", n, d["D"]), "input", of("k")),
            TensorArg("V", _layout_shape(op, "v", n, dv), "input", of("v"))]
    if op.attr("scale") == "input":
        args.append(TensorArg("scale", (1,), "input"))
    if has_mask_input(op):
        args.append(TensorArg("mask", (d["mask_rows"], m, n) if _full_mask(op)
                              else (d["mask_rows"], n), "input"))
    args.append(TensorArg("Y", _layout_shape(op, "y", m, dv), "output"))
    return tuple(args)


def visible_pairs(op: OpSignature) -> int:
    """(query, key) pairs the causal mask leaves (all ``M * N`` without one)."""
    m, n = op.dim("M"), op.dim("N")
    return m * n - m * (m - 1) // 2 if is_causal(op) else m * n


def _flops(op: OpSignature) -> int:
    """Per visible (query, key) pair: the two dot products (``2 D + 2 Dv``) and the softmax
    (scale, mask, max, subtract, exp, sum: 5 or 6, an exp counting as one)."""
    per = 2 * op.dim("D") + 2 * value_dim(op) + 5 + has_mask_input(op)
    return op.dim("B") * visible_pairs(op) * per


def causal_keep(m: int, n: int) -> np.ndarray:
    """``[M, N]`` booleans: which keys each query may see under the causal mask."""
    return np.arange(n)[None, :] <= np.arange(m)[:, None] + (n - m)


def _head_major(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The inputs with Q, K and V laid out head-major ``[B, rows, width]``."""
    heads = op.dim("heads")
    out = list(inputs)
    for i, tensor in enumerate("qkv"):
        if token_major(op, tensor):
            x = inputs[i]
            batch, rows, width = x.shape[0], x.shape[1], x.shape[2] // heads
            out[i] = x.reshape(batch, rows, heads, width).transpose(0, 2, 1, 3).reshape(
                batch * heads, rows, width)
    return tuple(out)


def _scale(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> float:
    return float(inputs[3][0]) if op.attr("scale") == "input" else 1.0 / math.sqrt(op.dim("D"))


def _masked_scores(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """``Q K^T * scale + mask`` in the inputs' dtype, causally hidden scores ``-inf``."""
    q, k = inputs[0], inputs[1]
    b, m, n = op.dim("B"), op.dim("M"), op.dim("N")
    s = np.matmul(q, k.transpose(0, 2, 1))
    s *= s.dtype.type(_scale(op, inputs))
    if has_mask_input(op):
        rows = op.dim("mask_rows")
        mask = inputs[-1] if _full_mask(op) else inputs[-1][:, None, :]
        s.reshape(rows, b // rows, m, n)[...] += mask[:, None]
    if is_causal(op):
        s[:, ~causal_keep(m, n)] = -np.inf
    return s


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The unfused computation in numpy, in the inputs' dtype (float64: the ground truth;
    float32: the executor's fallback and the ``bench-op`` baseline). Rows with every key at
    ``-inf`` give zeros."""
    inputs = _head_major(op, inputs)
    s = _masked_scores(op, inputs)
    top = s.max(axis=2, keepdims=True)
    empty = np.isneginf(top)
    top[empty] = 0.0
    s -= top
    np.exp(s, out=s)
    total = s.sum(axis=2, keepdims=True)
    total[empty] = 1.0
    out = np.matmul(s, inputs[2])
    out /= total
    if token_major(op, "y"):
        heads = op.dim("heads")
        return out.reshape(-1, heads, op.dim("M"), out.shape[2]).transpose(0, 2, 1, 3).reshape(
            _layout_shape(op, "y", op.dim("M"), out.shape[2]))
    return out


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """Outputs are convex combinations of V's rows: off by ``max|V|`` times the relative
    error of the weights, which is the float32 rounding of the scores: of each dot product
    (``D`` terms bounded by ``scale |q| |k|``) and of ``z - max z`` (grows with ``|max z|``:
    scores pushed to -1e4 by a mask on every key keep only ~1e-3 of their precision), plus
    the exp's and the ``N``-term sums' rounding."""
    arrays = _head_major(op, tuple(a.astype(np.float64) for a in decoded(op, inputs)))
    q, k, v = arrays[0], arrays[1], arrays[2]
    if not (q.size and k.size and v.size):
        return 1e-5, 1e-7
    s = _masked_scores(op, arrays)
    top = s.max(axis=2)
    finite = top[np.isfinite(top)]
    level = float(np.abs(finite).max()) if finite.size else 0.0
    bound = abs(_scale(op, arrays)) * float(np.linalg.norm(q, axis=2).max()) * float(
        np.linalg.norm(k, axis=2).max())
    eps = 2.0 ** -24
    weights = 4 * eps * (op.dim("D") * bound + 4 * level + op.dim("N") + 8)
    if op.dtype == "bf16":
        # Qs and K rounded to bfloat16 move each score by up to 2**-8 of its bound, which
        # moves a normalised weight by about twice that, twice over (its own exp and the
        # sum's); P and V rounded add 2**-9 each.
        weights += 4 * 2.0 ** -8 * bound + 2.0 ** -8
    return 1e-5, float(np.abs(v).max()) * weights + 1e-7


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Standard normal Q, K, V; a scale around ``1/sqrt(D)``; a padding mask as exporters
    write it: per mask row (and query, for ``full``) a valid length of at least one key, then
    ``-1e4``."""
    out = []
    for arg in _arguments(op):
        if arg.role != "input":
            continue
        if arg.name == "scale":
            out.append(np.array([rng.uniform(0.5, 2.0) / math.sqrt(op.dim("D"))], np.float32))
        elif arg.name == "mask":
            n = op.dim("N")
            valid = rng.integers(max(1, n // 2), n + 1, size=arg.shape[:-1])
            mask = np.zeros(arg.shape, np.float32)
            mask[np.arange(n) >= valid[..., None]] = -1e4
            out.append(mask)
        else:
            x = rng.standard_normal(arg.shape, dtype=np.float32)
            out.append(to_bfloat16(x) if arg.dtype == "bfloat16" else x)
    return tuple(out)


# -- schedules --------------------------------------------------------------------------------


def workspace_floats(op: OpSignature, s: AttentionSchedule, lanes: int) -> dict[str, int]:
    """Offsets (floats) of one thread's workspace regions, and its size ``WS_THREAD``:
    ``K^T`` (outer scores only), the scaled queries, the scores and the accumulator."""
    d = op.dims_dict
    kt = d["D"] * round_up(d["N"], lanes) if s.score == "outer" else 0
    qs = s.q_block * round_up(d["D"], lanes)
    sc = s.q_block * round_up(s.k_block, lanes)
    acc = s.q_block * round_up(value_dim(op), lanes)
    off_qs = round_up(kt, ALIGN_FLOATS)
    off_s = off_qs + round_up(qs, ALIGN_FLOATS)
    off_o = off_s + round_up(sc, ALIGN_FLOATS)
    return {"OFF_QS": off_qs, "OFF_S": off_s, "OFF_O": off_o,
            "WS_THREAD": off_o + round_up(acc, ALIGN_FLOATS)}


def attention_problems(op: OpSignature, s: AttentionSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the attention ``op`` on ``hw`` (empty when legal)."""
    tiles = op.dtype == "bf16" or s.score == "tiles"
    found = (tile_problems(op, s.q_block, s.k_block, s.score, hw) if tiles
             else _vector_problems(op, s))
    found += threads_problem(s.threads, hw)
    if not found:
        per_thread = (tile_workspace_bytes(op, s.q_block, value_dim(op)) if s.score == "tiles"
                      else 4 * workspace_floats(op, s, hw.lanes)["WS_THREAD"])
        if s.threads * per_thread > MAX_PACKED_BYTES:
            why = ("score=tiles packs K and V in bfloat16 per thread" if s.score == "tiles"
                   else "score=outer packs D x N floats of K^T per thread; use score=dot")
            found.append(f"workspace of {s.threads * per_thread >> 20} MiB exceeds "
                         f"{MAX_PACKED_BYTES >> 20} MiB ({why})")
    return found


def _vector_problems(op: OpSignature, s: AttentionSchedule) -> list[str]:
    found: list[str] = []
    m, n = op.dim("M"), op.dim("N")
    if not 1 <= s.q_block <= MAX_Q_BLOCK:
        found.append(f"q_block={s.q_block} out of range 1..{MAX_Q_BLOCK}")
    elif s.q_block > m:
        found.append(f"q_block={s.q_block} exceeds the op's M={m} query rows")
    if s.k_block not in K_BLOCKS:
        found.append(f"k_block={s.k_block}; expected one of {', '.join(map(str, K_BLOCKS))}")
    elif s.k_block > K_BLOCKS[0] and s.k_block // 2 >= n:
        found.append(f"k_block={s.k_block} is over twice N={n}: k_block={s.k_block // 2} "
                     "already covers every key")
    if s.score not in SCORES:
        found.append(f"score={s.score!r}; expected one of {', '.join(SCORES)}")
    return found


def default_attention_schedule(op: OpSignature, hw: HardwareSpec,
                               threads: int = 1) -> AttentionSchedule:
    """A bf16 op: matrix tiles, two tiles of query rows (one for ``M <= 16``). Dot-product
    scores without packing for one or two query rows (decoding); else
    ``outer`` with the query block whose register tile has the most accumulators (the
    taller on a tie: 6 rows on AVX2, 8 on AVX-512). Key blocks of 128, or the fewest
    covering a shorter ``N``. Measured on AVX2 (BERT-base, seq 128 and 384), these were
    within 10% of the best."""
    m, n = op.dim("M"), op.dim("N")
    if op.dtype == "bf16":
        # BERT-base's 12 heads of 128 queries: 0.228 ms in blocks of 16 rows, 0.217 in 32
        # (one thread, AMX Xeon)
        q_block = TILE_Q_BLOCKS[-1] if m > TILE_Q_BLOCKS[0] else TILE_Q_BLOCKS[0]
        return AttentionSchedule(q_block=q_block, k_block=TILE_K_BLOCKS[-1], score="tiles",
                                 threads=threads)
    k_block = next(k for k in K_BLOCKS if k >= min(n, 128))
    if m <= 2:
        return AttentionSchedule(q_block=m, k_block=k_block, score="dot", threads=threads)
    q_block = max(range(1, min(m, MAX_Q_BLOCK) + 1),
                  key=lambda q: (q * tile_vectors(q, hw.vector_registers), q))
    return AttentionSchedule(q_block=q_block, k_block=k_block, score="outer", threads=threads)


# -- code generation --------------------------------------------------------------------------


def tile_vectors(rows: int, registers: int) -> int:
    """Vectors per row of a ``rows``-row broadcast tile: its accumulators, one loaded vector
    per column and the broadcast fit in the register file."""
    return max(1, min(_MAX_TILE_VECTORS, (registers - 1) // (rows + 1)))


def balanced_chunks(count: int, most: int) -> list[int]:
    """``count`` split into the fewest chunks of at most ``most``, sizes differing by at most
    one (8 by 3: 3, 3, 2)."""
    if count <= 0:
        return []
    chunks = -(-count // most)
    base, extra = divmod(count, chunks)
    return [base + 1] * extra + [base] * (chunks - extra)


def dot_keys(rows: int, registers: int) -> int:
    """Keys per dot-product tile of ``rows`` query rows (accumulators in half the registers)."""
    return max(1, min(4, registers // 2 // rows))


class _Emitter:
    """C of one attention kernel: the op's constants and the block functions."""

    def __init__(self, op: OpSignature, s: AttentionSchedule, d: IsaDialect) -> None:
        self.op, self.s, self.d = op, s, d
        self.lanes = d.lanes
        self.registers = isa_level(d.name).vector_registers
        self.causal = is_causal(op)
        self.masked = has_mask_input(op)
        self.full = _full_mask(op)

    def constants(self) -> dict[str, int | str]:
        op, s, lanes = self.op, self.s, self.lanes
        dims = op.dims_dict
        dv = value_dim(op)
        out: dict[str, int | str] = {
            "B": dims["B"], "M": dims["M"], "N": dims["N"], "D": dims["D"], "DV": dv,
            "HEADS": max(dims["heads"], 1),
            "LANES": lanes, "QB": s.q_block, "KB": s.k_block, "NQB": -(-dims["M"] // s.q_block),
            "NPAD": round_up(dims["N"], lanes), "DPAD": round_up(dims["D"], lanes),
            "DVPAD": round_up(dv, lanes), "KBPAD": round_up(s.k_block, lanes),
            "SHIFT": dims["N"] - dims["M"],
            "MASK_DIV": dims["B"] // dims["mask_rows"] if self.masked else 1,
            "NEG_INF": "(-__builtin_inff())",
            "DEFAULT_SCALE": f"{float(np.float32(1.0 / math.sqrt(dims['D'])))!r}f",
        }
        out.update(workspace_floats(op, s, lanes))
        for tensor, rows, width in (("q", "M", "D"), ("k", "N", "D"), ("v", "N", "DV"),
                                    ("y", "M", "DV")):
            out.update(self._addressing(tensor.upper(), token_major(op, tensor), rows, width))
        return out

    @staticmethod
    def _addressing(name: str, tokens: bool, rows: str, width: str) -> dict[str, int | str]:
        """``<name>BASE(b)``, where item ``b``'s first row starts, and ``<name>S``, the
        distance between its rows, for a head-major or token-major tensor."""
        if tokens:
            return {f"{name}BASE(b)": f"(((b) / HEADS) * ({rows} * HEADS * {width}) + "
                                      f"((b) % HEADS) * {width})",
                    f"{name}S": f"(HEADS * {width})"}
        return {f"{name}BASE(b)": f"((b) * ({rows} * {width}))", f"{name}S": width}

    # -- pieces shared by every block size ------------------------------------------------

    def helpers(self) -> str:
        lanes = self.lanes
        mask_z = ("    z = VADD(z, VLOADU(mk + j)); VSTOREU(s + j, z);\n" if self.masked else "")
        mask_tail = ("    z = VADD(z, VLOADU_PART(mk + j, t)); VSTOREU_PART(s + j, z, t);\n"
                     if self.masked else "")
        pack = "" if self.s.score != "outer" else """
/* K^T of one batch item in panels of LANES keys: key j, element d at
   kt[(j / LANES) * (D * LANES) + d * LANES + j % LANES]; keys past N are zero. */
static void pack_kt(const float *restrict kmat, float *restrict kt) {
  for (long p = 0; p < NPAD / LANES; p++) {
    float *restrict panel = kt + p * (D * LANES);
    const long keys = MIN(LANES, N - p * LANES);
    for (long d = 0; d < D; d++) {
      for (long t = 0; t < keys; t++) panel[d * LANES + t] = kmat[(p * LANES + t) * KS + d];
      for (long t = keys; t < LANES; t++) panel[d * LANES + t] = 0.0f;
    }
  }
}
"""
        return f"""\
typedef struct {{ const float *q, *k, *v, *mask; float *y; float scale; }} attn_args;
{pack}
/* One row's step of the online softmax over a key block: s holds kb scores, of which the
   first n are visible; mk the mask from the block's first key (NULL without one). Leaves
   P = exp(s - m_new) in s (0 past n), raises the running max m, rescales the running sum l
   and the accumulator row o. Until a row sees a finite score, m stays -inf and P is 0. */
static inline void online_row(float *restrict s, const float *restrict mk, long n, long kb,
                              float *restrict m, float *restrict l, float *restrict o) {{
  (void)mk;
  if (n > kb) n = kb;
  if (n <= 0) {{ memset(s, 0, sizeof(float) * (size_t)kb); return; }}
  vec mx = VSET1(NEG_INF);
  long j = 0;
  for (; j + {lanes} <= n; j += {lanes}) {{
    vec z = VLOADU(s + j);
{mask_z}    mx = VMAX(mx, z);
  }}
  if (j < n) {{
    const int t = (int)(n - j);
    vec z = VLOADU_PART(s + j, t);
{mask_tail}    mx = VMAX(mx, VFILL_PART(z, t, NEG_INF));
  }}
  const float top = VHMAX(mx);
  const float mn = top > *m ? top : *m;
  if (mn == NEG_INF) {{ memset(s, 0, sizeof(float) * (size_t)kb); return; }}
  /* exp(-inf) = 0: the first visible block zeroes nothing that matters */
  const float alpha = VHMAX(VEXP(VSET1(*m - mn)));
  const vec mv = VSET1(mn);
  vec sum = VZERO();
  for (j = 0; j + {lanes} <= n; j += {lanes}) {{
    const vec e = VEXP(VSUB(VLOADU(s + j), mv));
    VSTOREU(s + j, e); sum = VADD(sum, e);
  }}
  if (j < n) {{
    const int t = (int)(n - j);
    const vec e = VFILL_PART(VEXP(VSUB(VLOADU_PART(s + j, t), mv)), t, 0.0f);
    VSTOREU_PART(s + j, e, t); sum = VADD(sum, e);
  }}
  if (n < kb) memset(s + n, 0, sizeof(float) * (size_t)(kb - n));
  *l = *l * alpha + VHSUM(sum);
  *m = mn;
  if (alpha != 1.0f) {{
    const vec av = VSET1(alpha);
    for (long c = 0; c < DVPAD; c += {lanes}) VSTOREU(o + c, VMUL(VLOADU(o + c), av));
  }}
}}
"""

    # -- one block of R query rows -----------------------------------------------------------

    def _outer_tile(self, rows: int, nv: int) -> list[str]:
        tile = Tile(tuple(str(r) for r in range(rows)), nv, self.lanes)
        loops = [Loop("for (long d = 0; d < D; d++)")]
        lines = accumulate(tile, loops, "VLOADU(kp + d * LANES + {o} * D)",
                           [f"qs[{r} * DPAD + d]" for r in range(rows)])
        return lines + store(tile, Store(tuple(f"sc + {r} * KBPAD + c" for r in range(rows))))

    def outer_scores(self, rows: int) -> list[str]:
        lanes = self.lanes
        nv = tile_vectors(rows, self.registers)
        width = nv * lanes
        out = ["{", f"  const long kv = (kn + {lanes - 1}) / {lanes} * {lanes};", "  long c = 0;",
               f"  for (; c + {width} <= kv; c += {width}) {{",
               "  const float *restrict kp = kt + (j0 + c) * D;",
               *self._outer_tile(rows, nv), "  }"]
        if nv > 1:
            out += [f"  for (; c < kv; c += {lanes}) {{",
                    "  const float *restrict kp = kt + (j0 + c) * D;",
                    *self._outer_tile(rows, 1), "  }"]
        return [*out, "}"]

    def _dot_tile(self, rows: int, keys: int) -> list[str]:
        lanes, dim = self.lanes, self.op.dim("D")
        full, tail = dim - dim % lanes, dim % lanes
        accs = [[f"a{r}_{t}" for t in range(keys)] for r in range(rows)]
        out = [f"  const float *restrict k{t} = kmat + (j0 + j + {t}) * KS;" for t in range(keys)]
        out += ["  vec " + ", ".join(f"{a} = VZERO()" for a in row) + ";" for row in accs]

        def step(load: str, offset: str) -> list[str]:
            lines = ["    " + " ".join(f"const vec k{t}v = {load.format(t=t, d=offset)};"
                                       for t in range(keys))]
            for r in range(rows):
                fmas = " ".join(f"{accs[r][t]} = VFMA(x, k{t}v, {accs[r][t]});"
                                for t in range(keys))
                lines.append(f"    {{ const vec x = VLOADU(qs + {r} * DPAD + {offset}); {fmas} }}")
            return lines

        if full:
            out += [f"  for (long d = 0; d < {full}; d += {lanes}) {{",
                    *step("VLOADU(k{t} + {d})", "d"), "  }"]
        if tail:
            out += ["  {", *step(f"VLOADU_PART(k{{t}} + {{d}}, {tail})", str(full)), "  }"]
        out += [f"  sc[{r} * KBPAD + j + {t}] = VHSUM({accs[r][t]});"
                for r in range(rows) for t in range(keys)]
        return out

    def dot_scores(self, rows: int) -> list[str]:
        keys = dot_keys(rows, self.registers)
        out = ["{", "  long j = 0;", f"  for (; j + {keys} <= kn; j += {keys}) {{",
               *self._dot_tile(rows, keys), "  }"]
        if keys > 1:
            out += ["  for (; j < kn; j++) {", *self._dot_tile(rows, 1), "  }"]
        return [*out, "}"]

    def _pv_tile(self, rows: int, nv: int, columns: str, at: str) -> list[str]:
        tile = Tile(tuple(str(r) for r in range(rows)), nv, self.lanes)
        loops = [Loop("for (long j = 0; j < kn; j++)")]
        lines = accumulate(tile, loops, columns, [f"sc[{r} * KBPAD + j]" for r in range(rows)])
        return lines + store(tile, Store(tuple(f"o + {r} * DVPAD + {at}" for r in range(rows)),
                                         accumulate="1"))

    def pv(self, rows: int) -> list[str]:
        lanes, dv = self.lanes, value_dim(self.op)
        full, tail = dv - dv % lanes, dv % lanes
        out = ["{", "  const float *restrict vb = vmat + j0 * VS;"]
        at = 0
        for nv in balanced_chunks(full // lanes, tile_vectors(rows, self.registers)):
            out += ["  {", *self._pv_tile(rows, nv, f"VLOADU(vb + j * VS + {at} + {{o}})",
                                          str(at)), "  }"]
            at += nv * lanes
        if tail:
            out += ["  {", *self._pv_tile(rows, 1, f"VLOADU_PART(vb + j * VS + {full}, {tail})",
                                          str(full)), "  }"]
        return [*out, "}"]

    def block(self, rows: int) -> str:
        lanes = self.lanes
        limit = "i0 + r + SHIFT + 1" if self.causal else "N"
        mask = ("a->mask + ((b / MASK_DIV) * M + i0) * N" if self.full else
                "a->mask + (b / MASK_DIV) * N" if self.masked else "NULL")
        # A full mask has a row per query: query r of the block reads row r.
        mask_row = "mrow + r * N + j0" if self.full else "mrow + j0"
        scores = self.outer_scores(rows) if self.s.score == "outer" else self.dot_scores(rows)
        body = [
            "const float *restrict kmat = a->k + KBASE(b);",
            "const float *restrict vmat = a->v + VBASE(b);",
            f"const float *restrict mrow = {mask};",
            "const float *restrict kt = w;",
            "float *restrict qs = w + OFF_QS, *restrict sc = w + OFF_S, *restrict o = w + OFF_O;",
            "(void)kmat; (void)kt; (void)mrow;",
            f"for (long r = 0; r < {rows}; r++) {{",
            "  const float *restrict qrow = a->q + QBASE(b) + (i0 + r) * QS;",
            "  for (long d = 0; d < D; d++) qs[r * DPAD + d] = qrow[d] * a->scale;",
            "  for (long d = D; d < DPAD; d++) qs[r * DPAD + d] = 0.0f;",
            "}",
            f"memset(o, 0, sizeof(float) * {rows} * DVPAD);",
            f"float m[{rows}], l[{rows}];",
            f"long lim[{rows}];",
            f"for (long r = 0; r < {rows}; r++) {{ m[r] = NEG_INF; l[r] = 0.0f; lim[r] = {limit}; }}",
            f"const long kend = lim[{rows - 1}];",
            "for (long j0 = 0; j0 < kend; j0 += KB) {",
            "  const long kn = MIN(KB, kend - j0);",
            *("  " + line for line in scores),
            f"  for (long r = 0; r < {rows}; r++)",
            f"    online_row(sc + r * KBPAD, mrow ? {mask_row} : NULL, lim[r] - j0, kn, m + r, "
            "l + r, o + r * DVPAD);",
            *("  " + line for line in self.pv(rows)),
            "}",
            f"for (long r = 0; r < {rows}; r++) {{",
            "  float *restrict y = a->y + YBASE(b) + (i0 + r) * YS;",
            "  const float *restrict orow = o + r * DVPAD;",
            "  const vec inv = VSET1(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);",
            "  long c = 0;",
            f"  for (; c + {lanes} <= DV; c += {lanes}) VSTOREU(y + c, VMUL(VLOADU(orow + c), inv));",
            "  if (c < DV) VSTOREU_PART(y + c, VMUL(VLOADU(orow + c), inv), (int)(DV - c));",
            "}",
        ]
        return (f"static void attn_block{rows}(const attn_args *restrict a, float *restrict w, "
                "long b, long i0) {\n" + "".join(f"  {line}\n" for line in body) + "}\n")

    def part(self, rem: int) -> str:
        pack = ("    if (b != packed) { pack_kt(a->k + KBASE(b), w); packed = b; }\n"
                if self.s.score == "outer" else "")
        call = (f"    if (qb == NQB - 1) attn_block{rem}(a, w, b, qb * QB);\n    else "
                if rem else "    ")
        return (
            "static void attn_part(const attn_args *a, float *ws, int tid, int nth) {\n"
            "  long lo, hi;\n  split_range(B * NQB, tid, nth, &lo, &hi);\n"
            "  float *w = ws + tid * WS_THREAD;\n  long packed = -1;\n  (void)packed;\n"
            "  for (long item = lo; item < hi; item++) {\n"
            "    const long b = item / NQB, qb = item % NQB;\n"
            f"{pack}{call}attn_block{self.s.q_block}(a, w, b, qb * QB);\n  }}\n}}\n"
        )

    def unit(self) -> str:
        s = self.s
        rem = self.op.dim("M") % s.q_block
        blocks = [self.block(s.q_block)] + ([self.block(rem)] if rem else [])
        unpack = unpack_args(self.op, optional=("scale", "mask"))
        entry = ("int tc_kernel(void **args) {\n" + unpack
                 + "  const attn_args a = {Q, K, V, mask, Y, scale ? scale[0] : DEFAULT_SCALE};\n"
                 + parallel_entry(s.threads, "attn_part(&a, ws, TID, NTH);",
                                  f"{s.threads}L * WS_THREAD"))
        return "\n".join([self.d.prelude, HEADER, defines(self.constants()), WORKSPACE,
                          self.helpers(), *blocks, self.part(rem), entry, TIMER])


def bf16_variant(op: OpSignature, hw: HardwareSpec) -> tuple[OpSignature, None] | None:
    """``OpKind.bf16_variant``: the float32 ``op`` as a bf16 attention where ``hw`` has bf16
    matrix tiles (no weights: the kernel rounds Q, K and V itself). BERT-base at bf16 on the
    AMX Xeon, one thread: each layer's attention 0.42 ms in float32, 0.21 on tiles (two
    threads: 0.22, 0.11); the model 39.5 -> 36.5 ms."""
    if op.dtype != "float32" or "bf16" not in tile_dtypes(hw):
        return None
    return replace(op, dtype="bf16"), None


def emit_attention(op: OpSignature, s: AttentionSchedule, d: IsaDialect) -> str:
    """The C translation unit for the attention ``op`` under ``s`` (validated by the caller)."""
    if s.score == "tiles":
        return emit_attention_tiles(op, s.q_block, s.k_block, s.threads, d, _tile_view(op))
    return _Emitter(op, s, d).unit()


def _tile_view(op: OpSignature) -> TileView:
    addressing: dict[str, int | str] = {}
    for tensor, rows, width in (("q", "M", "D"), ("k", "N", "D"), ("v", "N", "DV"),
                                ("y", "M", "DV")):
        addressing.update(_Emitter._addressing(tensor.upper(), token_major(op, tensor), rows,
                                               width))
    return TileView(value_dim(op), is_causal(op), has_mask_input(op), _full_mask(op),
                    tuple(addressing.items()))


KIND = register(OpKind(
    name="attention",
    spec=KindSpec(
        dims=("B", "M", "N", "D"),
        attrs={"mask": MASKS, "scale": SCALES, "tokens": TOKENS, "narrow": NARROW},
        epilogues=(),
        dtypes=("float32", "bf16"),
        params={"Dv": (0, 0), "mask_rows": (0, 0), "heads": (0, 0)},
        check=_signature_problems,
        omit_default=frozenset({"heads", "tokens", "narrow"}),
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=AttentionSchedule,
    problems=attention_problems,
    default_schedule=default_attention_schedule,
    emit=emit_attention,
    reference=_reference,
    reduction_length=lambda op: op.dim("N"),
    bf16_variant=bf16_variant,
    with_narrow=with_narrow,
    dim_columns={"B": "dim_batch", "M": "dim_m", "N": "dim_n", "D": "dim_d", "Dv": "dim_dv",
                 "mask_rows": "mask_rows"},
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    examples=(
        "attention(B=12,M=128,N=128,D=64,mask_rows=1,mask=padding)",  # BERT-base
        "attention(B=12,M=128,N=128,D=64,mask=causal)",  # GPT-2 prefill
        "attention(B=12,M=1,N=129,D=64,mask=causal)",  # GPT-2 decoding, 128 past tokens
        "attention(B=12,M=197,N=197,D=64)",  # ViT-B/16
        "attention(B=3,M=37,N=45,D=40,Dv=24,mask_rows=3,mask=causal_padding,scale=input)",
        "attention(B=4,M=5,N=8,D=16,mask_rows=2,mask=full)",  # an exported [batch,1,M,N] mask
        # BERT-base's heads read from and written to the projections' layout
        "attention(B=12,M=128,N=128,D=64,mask_rows=1,heads=12,mask=padding,tokens=qkvy)",
    ),
))
