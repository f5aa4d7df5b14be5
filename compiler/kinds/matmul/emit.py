"""C code for matmul and batch_matmul: BLIS-style packing, blocking and register micro-kernels.

The emitted translation unit has all shapes as compile-time constants and exports

* ``int tc_kernel(void **args)`` — arguments in :meth:`OpSignature.arguments` order; returns
  0, or 1 if the workspace could not be allocated;
* ``double tc_time(void **args, long iters)`` — seconds for ``iters`` back-to-back calls,
  so timing does not include Python call overhead.

Structure (per batch item): the cache blocks of the schedule's loop order, packing of A and B
into 64-byte-aligned, zero-padded panels (edge panels always, full panels when the schedule
packs), and an ``MR x NR`` micro-kernel that keeps its accumulators in named vector registers
for the whole ``kc`` loop. Partial tiles are computed into a local tile and merged with
scalar code, so every shape is handled without masking. Threads split row blocks
(``parallel=m``), column micro-panels (``parallel=n``) or batch items, with manual static
partitions and explicit barriers; over pre-packed weights, a column split hands the last K
block's units of micro-panels to whichever thread is free (:func:`dynamic_split`). Each
row tile of a packed-B block prefetches its share of the next B micro-panel into L2, one
address per step of its k loop (``prefetch_plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tunecache.compiler.codegen.abi import (
    ALIGN_FLOATS,
    PackedWeights,
    kernel_entries,
    preamble,
)
from tunecache.compiler.codegen.epilogue import render, scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, micro_kernel
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import OpSignature

PREFETCH_NEXT_PANEL = True
"""Whether each micro-kernel call of a packed-B block prefetches its share of the next B
micro-panel into L2. Without it the first row tile of every panel waited on the panel's
lines from memory: BERT's and GPT-2's projections ran 0.90-0.92x as long with it
on the Xeon VM (ARCHITECTURE change 81). The share is spread over the micro-kernel's k
steps, not issued in a burst before it: a burst fills the core's miss buffers and stalls
it, and spread the projections ran 0.89-0.95x as long again (change 86)."""


DYNAMIC_SPLIT = True
"""Whether :func:`dynamic_split` may balance a column split (off: every split is static).
A static split waits at the join for its slower thread, and on the shared Xeon VM one
vCPU ran the same half 5-20% slower than the other from call to call (a kernel timed per
thread). Taking the last K block's units from a slower thread, BERT-base and GPT-2 prefill
at two threads ran 0.92-0.97x as long (ARCHITECTURE change 87). Change 82's version, units
dynamic in every K block with op(A) packed whole per thread, had measured no gain."""

DYNAMIC_UNIT_PANELS = 1
"""B micro-panels per work unit of a dynamic split (:func:`dynamic_split`)."""

DYNAMIC_A_MAX_BYTES = 2 << 20
"""The largest op(A) K block (all rows, ``kc`` deep) a dynamic split packs per thread."""


def dynamic_split(op: OpSignature, s: MatmulSchedule) -> bool:
    """Whether the pre-packed entry balances its column split at run time: a team that
    splits the columns of pre-packed weights in one column block (``nc >= N``), with each
    K block of op(A) small enough to pack whole per thread. Each thread runs its static
    share through every K block but the last; in the last, a thread that is done takes the
    units another has not started (``_dynamic_body``)."""
    M, K = op.dim("M"), op.dim("K")
    return (DYNAMIC_SPLIT and s.threads > 1 and s.parallel == "n" and s.loop_order == "jpi"
            and bool(s.pack_b) and s.nc >= op.dim("N")
            and (not s.pack_a or round_up(M, s.mr) * min(s.kc, K) * 4 <= DYNAMIC_A_MAX_BYTES))


def spreads_prefetch(rows: int, mr: int) -> bool:
    """Whether micro-kernels of ``mr`` rows over packed B panels, ``rows`` rows in all,
    prefetch the next B micro-panel (see :data:`PREFETCH_NEXT_PANEL`): only with more than
    one row tile. Where every block is one row tile high the weights stream through that
    tile alone, and M=1 decode-step matmuls ran 1.06-1.14x as long with the prefetch on the
    second Xeon VM (the hardware prefetchers follow a single stream; change 85)."""
    return PREFETCH_NEXT_PANEL and mr < rows


PREFETCH_PLAN = """\
/* Row tile i of n takes its share of the `lines` cache lines at `next` (NULL: none): one
   address every *pfs floats over its first *npf k steps (*npf = 0: none), *pfs at most a
   line; lines a k step each cannot reach are prefetched now. Returns the first address. */
static inline const float *prefetch_plan(const float *next, long lines, long i, long n,
                                         long k, long *npf, long *pfs) {
  const long lo = i * lines / n, hi = (i + 1) * lines / n, span = (hi - lo) * 16;
  *pfs = span >= 16 * k ? 16 : (span + k - 1) / k;
  *npf = next && span ? MIN(k, (span + *pfs - 1) / *pfs) : 0;
  if (next)
    for (long l = lo + *npf * *pfs / 16; l < hi; l++) __builtin_prefetch(next + l * 16, 0, 2);
  return next ? next + lo * 16 : NULL;
}
"""


SPREAD_STEP = "__builtin_prefetch(pf + p * pfs, 0, 2);"
"""What a spreading micro-kernel does at the top of k step ``p < npf`` (see
``prefetch_plan``)."""

PF_ARGS = ", pf, npf, pfs"
"""The arguments a spreading micro-kernel takes after the plain ones."""


def tile_plan(tile: str, tiles: str, indent: str) -> str:
    """C declaring ``pf``, ``npf`` and ``pfs`` for row tile ``tile`` of ``tiles``, from the
    enclosing ``next`` and ``lines`` and the depth ``k_cur``."""
    return (f"{indent}long npf, pfs;\n"
            f"{indent}const float *pf = prefetch_plan(next, lines, {tile}, {tiles}, k_cur, "
            "&npf, &pfs);\n")


def _panel_prefetch(spread: bool) -> tuple[str, str]:
    """C for compute_block: per micro-panel, the next one (``next``, ``lines`` cache lines);
    in the row-tile loop, row tile ``ir``'s share of it for the micro-kernel to spread."""
    if not spread:
        return "", ""
    # The last panel's successor is b_after, whose depth may be shorter: over-reaching
    # prefetches fall on the next panel's lines and cannot fault.
    per_panel = """\
    const float *next = jr + 1 < jr_hi ? Bp + (jr + 1) * NR * k_cur : b_after;
    const long lines = NR * (jr + 1 < jr_hi ? k_cur : MIN(KC, K)) / 16;
"""
    return per_panel, tile_plan("ir", "mp", "      ")


def _ukr(name: str, s: MatmulSchedule, d: IsaDialect, a_ps: str, a_rs: str, b_ps: str,
         b_aligned: bool, epilogue: tuple[str, ...], spread: bool = False) -> str:
    """One micro-kernel: element (r, p) of the A panel is ``a[p*a_ps + r*a_rs]``, row p of
    the B panel starts at ``b + p*b_ps``; C rows are ``ldc`` apart. The tile adds to C unless
    ``first`` and applies the epilogue (bias along columns) when ``last``. ``spread``: its
    first ``npf`` k steps each prefetch ``pf + p*pfs`` into L2 (see ``prefetch_plan``), in a
    loop of their own."""
    tile = Tile(tuple(str(r) for r in range(s.mr)), s.nr // d.lanes, d.lanes)
    load = "VLOAD" if b_aligned else "VLOADU"
    extra = ", const float *pf, long npf, long pfs" if spread else ""
    signature = (f"static inline void {name}(long kc, const float *restrict a, "
                 "const float *restrict b, float *restrict c, long ldc, int first, int last, "
                 f"const float *restrict bias{extra})")
    # npf <= kc (prefetch_plan): the steps that prefetch are a loop of their own.
    lead = ([Loop("for (long p = 0; p < npf; p++)", setup=(SPREAD_STEP,), unroll=s.unroll)]
            if spread else [])
    start = "npf" if spread else "0"
    return micro_kernel(
        signature, tile, [Loop(f"for (long p = {start}; p < kc; p++)", unroll=s.unroll)],
        columns=f"{load}(b + p * ({b_ps}) + {{o}})",
        rows=[f"a[p * ({a_ps}) + {r} * ({a_rs})]" for r in range(s.mr)],
        spec=Store(tuple(f"c + {r} * ldc" for r in range(s.mr)), accumulate="!first",
                   epilogue=epilogue, operands={"bias": "VLOADU(bias + {o})"},
                   epilogue_if="last", prefetch=True),
        lead=lead,
    )


def plain_micro_kernel(name: str, s: MatmulSchedule, d: IsaDialect, a_ps: str,
                       a_rs: str, spread: bool = False) -> str:
    """A micro-kernel ``name`` over A panel elements ``a[p*a_ps + r*a_rs]`` and a packed B
    panel, without an epilogue (for kernels that add its tiles up themselves); ``spread``:
    it takes a ``prefetch_plan`` (see :func:`_ukr`)."""
    return _ukr(name, s, d, a_ps, a_rs, "NR", True, (), spread)


@dataclass(frozen=True, slots=True)
class _MatmulPlan:
    """What one matmul kernel is made of, decided before any C is written.

    ``constants`` are its compile-time constants in ``preamble`` order: shapes, strides,
    blocks and the workspace layout (:func:`_workspace`). ``body_threads`` threads run each
    batch item's body (1 when the threads split the batch). The code paths: the bias
    (``has_bias``), the prefetch its micro-kernels spread over their k steps (``spread``),
    the pre-packed-B entry (``prepack``) and that entry's dynamic column split
    (``dynamic``).
    """

    constants: Mapping[str, int | str]
    body_threads: int
    has_bias: bool
    spread: bool
    prepack: bool
    dynamic: bool


def _matmul_plan(op: OpSignature, s: MatmulSchedule) -> _MatmulPlan:
    """The plan :func:`generate_matmul` renders ``op`` under ``s`` from."""
    dims = op.dims_dict
    M, N, K = dims["M"], dims["N"], dims["K"]
    mr, nr = s.mr, s.nr
    kc, mc, nc = min(s.kc, K), min(s.mc, round_up(M, mr)), min(s.nc, round_up(N, nr))
    # A threaded kernel whose parallel axis is batch runs a serial body per batch item.
    body_threads = 1 if s.parallel == "batch" else s.threads
    # Constant-B pre-packing: the whole op(B) laid out block by block, (jc, pc) in loop
    # order, exactly as the kernel would pack it; only when every batch item shares B.
    prepack = bool(s.pack_b) and (op.batch == 1 or op.shared == "b")
    dynamic = prepack and dynamic_split(op, s)
    layout, shared_floats, private_floats = _workspace(op, s, kc, mc, nc, body_threads,
                                                       dynamic)
    # op(A)[i, p] = A[i*ARS + p*APS]; op(B)[p, j] = B[p*BPS + j*BCS]
    a_rs, a_ps = (1, M) if op.trans_a else (K, 1)
    b_ps, b_cs = (1, K) if op.trans_b else (N, 1)
    constants: dict[str, int | str] = {
        "M": M, "N": N, "K": K, "BATCH": op.batch, "MR": mr, "NR": nr, "KC": kc, "MC": mc,
        "NC": nc, "ARS": a_rs, "APS": a_ps, "BPS": b_ps, "BCS": b_cs,
        "A_BATCH": 0 if op.shared == "a" else M * K,
        "B_BATCH": 0 if op.shared == "b" else K * N, "C_BATCH": M * N,
        "SHARED_FLOATS": shared_floats, "PRIVATE_FLOATS": private_floats,
        "NC_PADDED": round_up(nc, nr),
        "B_PACKED_FLOATS": sum(round_up(min(nc, N - j), nr) * K for j in range(0, N, nc)),
        "DYN_PANELS": DYNAMIC_UNIT_PANELS, **layout,
    }
    return _MatmulPlan(constants, body_threads, "bias" in op.epilogue,
                       bool(s.pack_b) and spreads_prefetch(M, mr), prepack, dynamic)


def _workspace(op: OpSignature, s: MatmulSchedule, kc: int, mc: int, nc: int,
               body_threads: int, dynamic: bool) -> tuple[dict[str, int | str], int, int]:
    """The workspace's regions: each one's offset (``OFF_*``, floats, 64-byte aligned) in
    the team's shared part or in each thread's private part, then the floats of the shared
    part and of one private part."""
    mr, nr = s.mr, s.nr
    # Every thread packs the A block it reads itself, also when threads split the columns:
    # a shared A block cost two barriers per block, and a barrier waits for the other vCPU,
    # which a busy host may not be running.
    shared_b = (body_threads > 1 and s.pack_b == 1
                and (s.parallel == "n" or (s.parallel == "m" and s.loop_order == "jpi")))
    layout: dict[str, int | str] = {}
    ends = {"shared": 0, "private": 0}

    def place(name: str, part: str, floats: int) -> None:
        layout[name] = ends[part]
        ends[part] += round_up(floats, ALIGN_FLOATS)

    if s.pack_a:
        place("OFF_A_PRIV", "private", round_up(mc, mr) * kc)
    if s.pack_b:
        place(*(("OFF_B_SHARED", "shared") if shared_b else ("OFF_B_PRIV", "private")),
              round_up(nc, nr) * kc)
    if dynamic:
        place("OFF_STEAL", "shared", 4 * s.threads)  # a range and a progress count per thread
        if s.pack_a:
            place("OFF_A_SLAB", "private", round_up(op.dim("M"), mr) * kc)
    for name, size in (("EDGE_A", mr * kc), ("EDGE_B", kc * nr), ("CTILE", mr * nr)):
        place(f"OFF_{name}", "private", size)
    return layout, ends["shared"], ends["private"]


def generate_matmul(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    """The C translation unit for ``op`` under schedule ``s`` (validated by the caller):
    its plan (:func:`_matmul_plan`), then the C rendered from it."""
    plan = _matmul_plan(op, s)
    out = [preamble(d, plan.constants, plan.body_threads)]
    out += filter(None, [scalar_helpers(op.epilogue)])
    if plan.spread:
        out.append(PREFETCH_PLAN)
    out.append(PACKED_BLOCK)
    out.append(PACKING)
    out += _micro_kernels(op, s, d, plan.spread)
    out.append(_merge_tile(op))
    out.append(_compute_block(s, plan))
    out.append(_gemm_body(s, s.parallel, plan.body_threads))
    if plan.dynamic:
        out.append(_dynamic_body(s))
    out.append(_entries(op, s, s.threads, s.parallel, plan.prepack, plan.dynamic))
    return "\n".join(out)


PACKED_BLOCK = ("#define PACKED_BLOCK(base, jc, pc) ((base) + ((jc) / NC) * NC_PADDED * K"
                " + (MIN(NC, N - (jc)) + NR - 1) / NR * NR * (pc))\n")
"""Pre-packed op(B): block (jc, pc) of the buffer at ``base``, its panels KC-deep."""

PACKING = """\
static void pack_a_panel(float *restrict dst, const float *restrict a, long m_cur, long k_cur) {
  /* a points at op(A)[i0, p0] */
  if (APS == 1 && m_cur == MR) {
    /* a full panel column by column: MR loads, MR contiguous stores */
    for (long p = 0; p < k_cur; p++)
      for (long r = 0; r < MR; r++) dst[p * MR + r] = a[r * ARS + p];
    return;
  }
  if (APS == 1) {
    for (long r = 0; r < m_cur; r++)
      for (long p = 0; p < k_cur; p++) dst[p * MR + r] = a[r * ARS + p];
  } else {
    for (long p = 0; p < k_cur; p++)
      for (long r = 0; r < m_cur; r++) dst[p * MR + r] = a[r * ARS + p * APS];
  }
  if (m_cur < MR)
    for (long p = 0; p < k_cur; p++)
      for (long r = m_cur; r < MR; r++) dst[p * MR + r] = 0.0f;
}

static void pack_b_panel(float *restrict dst, const float *restrict b, long n_cur, long k_cur) {
  /* b points at op(B)[p0, j0] */
  if (BCS == 1) {
    for (long p = 0; p < k_cur; p++) {
      long q = 0;
      for (; q < n_cur; q++) dst[p * NR + q] = b[p * BPS + q];
      for (; q < NR; q++) dst[p * NR + q] = 0.0f;
    }
  } else {
    for (long q = 0; q < n_cur; q++)
      for (long p = 0; p < k_cur; p++) dst[p * NR + q] = b[q * BCS + p * BPS];
    if (n_cur < NR)
      for (long p = 0; p < k_cur; p++)
        for (long q = n_cur; q < NR; q++) dst[p * NR + q] = 0.0f;
  }
}

/* Pack panels [lo, hi) of the m_cur x k_cur block of op(A) at (i0, p0). */
static void pack_a_block(float *restrict dst, const float *restrict A, long i0, long m_cur,
                         long p0, long k_cur, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    long i = t * MR;
    pack_a_panel(dst + t * MR * k_cur, A + (i0 + i) * ARS + p0 * APS, MIN(MR, m_cur - i), k_cur);
  }
}

static void pack_b_block(float *restrict dst, const float *restrict B, long p0, long k_cur,
                         long j0, long n_cur, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    long j = t * NR;
    pack_b_panel(dst + t * NR * k_cur, B + p0 * BPS + (j0 + j) * BCS, MIN(NR, n_cur - j), k_cur);
  }
}
"""
"""Packing: panels of MR rows of op(A) / NR columns of op(B), zero-padded, k-major."""


def _micro_kernels(op: OpSignature, s: MatmulSchedule, d: IsaDialect, spread: bool) -> list[str]:
    """The micro-kernel variants: packed A/B, or read in place (full panels only)."""
    variants = [("ukr_pp", "MR", "1", "NR", True)]
    if s.pack_a == 0:
        variants.append(("ukr_dp", "APS", "ARS", "NR", True))
    if s.pack_b == 0:
        variants.append(("ukr_pd", "MR", "1", "BPS", False))
    if s.pack_a == 0 and s.pack_b == 0:
        variants.append(("ukr_dd", "APS", "ARS", "BPS", False))
    return [_ukr(name, s, d, aps, ars, bps, aligned, op.epilogue, spread)
            for name, aps, ars, bps, aligned in variants]


def _merge_tile(op: OpSignature) -> str:
    """C merging an edge tile, computed into a local tile, into C (with the epilogue)."""
    epilogue = render(op.epilogue, "v", {"bias": "bias[j + q]"}, vector=False)
    return f"""\
static void merge_tile(float *restrict c, const float *restrict t, long m_cur, long n_cur,
                       int first, int last, const float *restrict bias, long j) {{
  (void)bias; (void)j;
  for (long r = 0; r < m_cur; r++)
    for (long q = 0; q < n_cur; q++) {{
      float v = t[r * NR + q];
      if (!first) v += c[r * N + q];
      if (last) {{ {epilogue} }}
      c[r * N + q] = v;
    }}
}}
"""


def _compute_block(s: MatmulSchedule, plan: _MatmulPlan) -> str:
    """C computing micro-panels [jr_lo, jr_hi) of the block at (i0, j0, p0)."""
    a_full = "Ap + ir * MR * k_cur" if s.pack_a else "A + (i0 + ir * MR) * ARS + p0 * APS"
    b_full = "Bp + jr * NR * k_cur" if s.pack_b else "B + p0 * BPS + (j0 + jr * NR) * BCS"
    a_edge_src = "Ap + ir * MR * k_cur" if s.pack_a else "ea"
    b_edge_src = "Bp + jr * NR * k_cur" if s.pack_b else "eb"
    edge_a_pack = "" if s.pack_a else (
        "if (m_full < mp) pack_a_panel(ea, A + (i0 + m_full * MR) * ARS + p0 * APS, "
        "m_cur - m_full * MR, k_cur);")
    edge_b_pack = "" if s.pack_b else (
        "if (n_full < np && jr_hi == np) pack_b_panel(eb, B + p0 * BPS + (j0 + n_full * NR) * BCS, "
        "n_cur - n_full * NR, k_cur);")
    spread = plan.spread
    per_panel, per_tile = _panel_prefetch(spread)
    return f"""\
static void compute_block(float *restrict C, const float *restrict A, const float *restrict B,
                          const float *restrict bias, const float *restrict Ap,
                          const float *restrict Bp, float *restrict priv, long i0, long m_cur,
                          long j0, long n_cur, long p0, long k_cur, int first, int last,
                          long jr_lo, long jr_hi, const float *b_after) {{
  /* b_after: the B micro-panel this thread reads after jr_hi - 1 (NULL: none known) */
  (void)A; (void)B; (void)Ap; (void)Bp; (void)b_after;
  const long mp = (m_cur + MR - 1) / MR, np = (n_cur + NR - 1) / NR;
  const long m_full = m_cur / MR, n_full = n_cur / NR;
  float *ea = priv + OFF_EDGE_A, *eb = priv + OFF_EDGE_B, *ct = priv + OFF_CTILE;
  (void)ea; (void)eb;
  {edge_a_pack}
  {edge_b_pack}
  for (long jr = jr_lo; jr < jr_hi; jr++) {{
    const long j = j0 + jr * NR;
    const long n_here = MIN(NR, n_cur - jr * NR);
    const float *bias_j = {"bias + j" if plan.has_bias else "bias"};
{per_panel}    for (long ir = 0; ir < mp; ir++) {{
{per_tile}      const long i = i0 + ir * MR;
      const long m_here = MIN(MR, m_cur - ir * MR);
      float *c = C + i * N + j;
      if (ir < m_full && jr < n_full) {{
        {_call_full(s, spread)}
      }} else {{
        const float *a = ir < m_full ? {a_full} : {a_edge_src};
        const float *b = jr < n_full ? {b_full} : {b_edge_src};
        {_call_edge(s, spread)}
        merge_tile(c, ct, m_here, n_here, first, last, bias, j);
      }}
    }}
  }}
}}
"""


def _call_full(s: MatmulSchedule, spread: bool) -> str:
    a = "Ap + ir * MR * k_cur" if s.pack_a else "A + i * ARS + p0 * APS"
    b = "Bp + jr * NR * k_cur" if s.pack_b else "B + p0 * BPS + j * BCS"
    name = "ukr_" + ("p" if s.pack_a else "d") + ("p" if s.pack_b else "d")
    return f"{name}(k_cur, {a}, {b}, c, N, first, last, bias_j{PF_ARGS if spread else ''});"


def _call_edge(s: MatmulSchedule, spread: bool) -> str:
    # Edge tiles: at least one operand comes from a packed edge panel. When an operand is
    # read in place for a full panel and the other is an edge, the matching mixed variant is
    # used; the tile goes to the local buffer `ct` and is merged by scalar code.
    pf = PF_ARGS if spread else ""
    if s.pack_a and s.pack_b:
        return f"ukr_pp(k_cur, a, b, ct, NR, 1, 0, bias_j{pf});"
    lines = []
    a_direct = "ir < m_full" if not s.pack_a else "0"
    b_direct = "jr < n_full" if not s.pack_b else "0"
    combos = {
        ("0", "0"): "ukr_pp",
        ("1", "0"): "ukr_dp",
        ("0", "1"): "ukr_pd",
        ("1", "1"): "ukr_dd",
    }
    for (ad, bd), name in combos.items():
        if (ad == "1" and s.pack_a) or (bd == "1" and s.pack_b):
            continue
        cond_a = a_direct if ad == "1" else f"!({a_direct})"
        cond_b = b_direct if bd == "1" else f"!({b_direct})"
        lines.append(f"if (({cond_a}) && ({cond_b})) {name}(k_cur, a, b, ct, NR, 1, 0, "
                     f"bias_j{pf});")
    return "\n        ".join(lines)


def _gemm_body(s: MatmulSchedule, par: str, threads: int) -> str:
    """The blocked loops for one batch item, run by every thread of the team."""
    a_buf = "priv + OFF_A_PRIV" if s.pack_a else "NULL"
    if s.pack_b and threads > 1 and (par == "n" or (par == "m" and s.loop_order == "jpi")):
        b_buf = "shared + OFF_B_SHARED"
    else:
        b_buf = "priv + OFF_B_PRIV" if s.pack_b else "NULL"
    head = """\
static void gemm_body(const float *restrict A, const float *restrict B, const float *restrict bias,
                      float *restrict C, float *shared, float *priv, int tid, int nth,
                      const float *Bpre) {
  /* Bpre: op(B) already packed (tc_pack_weights), or NULL to pack blocks here */
  (void)shared; (void)tid; (void)nth; (void)Bpre;
"""
    lines = [head, f"  float *Ap = {a_buf}; float *Bp = {b_buf}; (void)Ap; (void)Bp;",
             "  const float *Bu = Bp; (void)Bu;"]
    lines.append("  const long nblk_m = (M + MC - 1) / MC;\n  (void)nblk_m;")
    loops = _jpi_loops if s.loop_order == "jpi" else _ipj_loops
    lines.append(loops(s, par == "m" and threads > 1, par == "n" and threads > 1))
    lines.append("}\n")
    return "\n".join(lines)


def _jpi_loops(s: MatmulSchedule, split_m: bool, split_n: bool) -> str:
    """gemm_body's loops in jpi order: column blocks, K blocks, row blocks; ``split_m``,
    ``split_n``: the team splits the row blocks or the columns."""
    body = "  for (long jc = 0; jc < N; jc += NC) {\n    const long n_cur = MIN(NC, N - jc);\n"
    body += "    for (long pc = 0; pc < K; pc += KC) {\n      const long k_cur = MIN(KC, K - pc);\n"
    body += _pack_b_step(s, "      ", split_m or split_n)
    body += _next_block("      ")
    if split_m:
        body += ("      for (long bi = tid; bi < nblk_m; bi += nth) {\n"
                 "        const long ic = bi * MC, m_cur = MIN(MC, M - ic);\n")
    else:
        body += ("      for (long ic = 0; ic < M; ic += MC) {\n"
                 "        const long m_cur = MIN(MC, M - ic);\n")
    body += _pack_a_step(s, "        ")
    body += _compute_step(s, "        ", split_n)
    body += "      }\n"
    if split_m or split_n:
        # Only the shared B block couples the threads: pre-packed weights (every compiled
        # model's) leave each thread its own rows of C and nothing to wait for.
        body += "      if (!Bpre) { BARRIER(); }\n"
    return body + "    }\n  }\n"


def _ipj_loops(s: MatmulSchedule, split_m: bool, split_n: bool) -> str:
    """gemm_body's loops in ipj order: row blocks, K blocks, column blocks (see
    :func:`_jpi_loops`)."""
    if split_m:
        body = ("  for (long bi = tid; bi < nblk_m; bi += nth) {\n"
                "    const long ic = bi * MC, m_cur = MIN(MC, M - ic);\n")
    else:
        body = "  for (long ic = 0; ic < M; ic += MC) {\n    const long m_cur = MIN(MC, M - ic);\n"
    body += "    for (long pc = 0; pc < K; pc += KC) {\n      const long k_cur = MIN(KC, K - pc);\n"
    body += _pack_a_step(s, "      ")
    body += "      for (long jc = 0; jc < N; jc += NC) {\n        const long n_cur = MIN(NC, N - jc);\n"
    body += _pack_b_step(s, "        ", split_n)
    body += _compute_step(s, "        ", split_n)
    if split_n:
        body += "        if (!Bpre) { BARRIER(); }\n"
    return body + "      }\n    }\n  }\n"


def _pack_a_step(s: MatmulSchedule, ind: str) -> str:
    """C packing the row block's A block (nothing when A is read in place)."""
    if not s.pack_a:
        return ""
    return f"{ind}pack_a_block(Ap, A, ic, m_cur, pc, k_cur, 0, (m_cur + MR - 1) / MR);\n"


def _pack_b_step(s: MatmulSchedule, ind: str, split: bool) -> str:
    """C pointing ``Bu`` at the (jc, pc) B block: pre-packed, else packed here (by the whole
    team when ``split``); nothing when B is read in place."""
    if not s.pack_b:
        return ""
    if split:
        pack = ("{ long lo, hi; split_range((n_cur + NR - 1) / NR, tid, nth, &lo, &hi);"
                " pack_b_block(Bp, B, pc, k_cur, jc, n_cur, lo, hi); } BARRIER();")
    else:
        pack = "pack_b_block(Bp, B, pc, k_cur, jc, n_cur, 0, (n_cur + NR - 1) / NR);"
    # Every thread takes the same branch (Bpre is the same for all), so the barrier holds.
    return (f"{ind}if (Bpre) Bu = PACKED_BLOCK(Bpre, jc, pc);\n"
            f"{ind}else {{ {pack} Bu = Bp; }}\n")


def _compute_step(s: MatmulSchedule, ind: str, split_n: bool) -> str:
    """C computing the (ic, jc, pc) block's micro-panels: this thread's share when
    ``split_n``, else all of them."""
    rng = ("{ long lo, hi; split_range((n_cur + NR - 1) / NR, tid, nth, &lo, &hi);"
           if split_n else "{ long lo = 0, hi = (n_cur + NR - 1) / NR;")
    # The panel after a block's last: the next block's at the same position (pre-packed B
    # only, jpi order, after the last row block), else none.
    after = ("(Bpre && ic + MC >= M && lo < next_np ? next_b + lo * NR * next_k : NULL)"
             if s.loop_order == "jpi" and s.pack_b else "NULL")
    return (f"{ind}{rng}\n{ind}  compute_block(C, A, B, bias, Ap, Bu, priv, ic, m_cur, jc, "
            f"n_cur, pc, k_cur, pc == 0, pc + KC >= K, lo, hi, {after}); }}\n")


def _next_block(ind: str) -> str:
    """C declaring the pre-packed B block after (jc, pc) in jpi order: ``next_b`` (NULL after
    the last), its K depth ``next_k`` and its micro-panel count ``next_np``."""
    return (f"{ind}const long next_pc = pc + KC < K ? pc + KC : 0;\n"
            f"{ind}const long next_jc = pc + KC < K ? jc : jc + NC;\n"
            f"{ind}const long next_k = MIN(KC, K - next_pc);\n"
            f"{ind}const long next_np = next_jc < N ? (MIN(NC, N - next_jc) + NR - 1) / NR : 0;\n"
            f"{ind}const float *next_b = Bpre && next_jc < N"
            f" ? PACKED_BLOCK(Bpre, next_jc, next_pc) : NULL;\n"
            f"{ind}(void)next_b; (void)next_k; (void)next_np;\n")


STEAL_CLAIM = """\
#include <sched.h>
/* Each thread's work units as a range [front, back) packed in one word, so that a claim
   from either end is one compare-and-swap. */
#define RANGE(lo, hi) (((long)(lo) << 32) | (long)(hi))
static int claim_own(long *slot, long *unit) {
  long w = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  while ((w >> 32) < (w & 0xffffffffL))
    if (__atomic_compare_exchange_n(slot, &w, w + (1L << 32), 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      *unit = w >> 32;
      return 1;
    }
  return 0;
}
/* The last unit of the fullest other range whose owner has finished the steps before
   (progress[t] >= ready); waits while one with units left has not (0: every range is
   empty). */
static int claim_other(long *slots, const long *progress, long ready, int tid, int nth,
                       long *unit) {
  for (;;) {
    int victim = -1, waiting = 0; long most = 0, w = 0;
    for (int t = 0; t < nth; t++) {
      long x = __atomic_load_n(&slots[t], __ATOMIC_ACQUIRE);
      long left = (x & 0xffffffffL) - (x >> 32);
      if (t == tid || left <= 0) continue;
      if (__atomic_load_n(&progress[t], __ATOMIC_ACQUIRE) < ready) { waiting = 1; continue; }
      if (left > most) { most = left; victim = t; w = x; }
    }
    if (victim < 0 && !waiting) return 0;
    if (victim < 0) { sched_yield(); continue; }
    if (__atomic_compare_exchange_n(&slots[victim], &w, w - 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      *unit = (w & 0xffffffffL) - 1;
      return 1;
    }
  }
}
"""


def _dynamic_body(s: MatmulSchedule) -> str:
    """The pre-packed entry's body under :func:`dynamic_split` (one column block). Each
    thread runs its static share of units (``DYN_PANELS`` micro-panels each) through every
    K block but the last, as the static split does; in the last K block it claims its units
    from the front of its share and, when that is empty, takes units from the back of the
    fullest other share whose owner is done with the earlier K blocks. A thread the host
    slows hands its last units to the others instead of holding the team at the join, and
    no barrier sits between K blocks."""
    a_slab = "priv + OFF_A_SLAB" if s.pack_a else "NULL"
    pack = ("    for (long ic = 0; ic < M; ic += MC)\n"
            "      pack_a_block(As + ic * k_cur, A, ic, MIN(MC, M - ic), pc, k_cur, 0,"
            " (MIN(MC, M - ic) + MR - 1) / MR);\n" if s.pack_a else "")
    a_block = "As + ic * k_cur" if s.pack_a else "NULL"
    compute = ("      for (long ic = 0; ic < M; ic += MC)\n"
               "        compute_block(C, A, NULL, bias, " + a_block + ", blk, priv, ic,"
               " MIN(MC, M - ic), 0, N, pc, k_cur, pc == 0, last, plo, phi,"
               " ic + MC >= M ? after : NULL);\n")
    return STEAL_CLAIM + """\
#define NP ((N + NR - 1) / NR)
#define UNITS ((NP + DYN_PANELS - 1) / DYN_PANELS)
#define STEPS ((K + KC - 1) / KC)
static void gemm_body_dynamic(const float *restrict A, const float *restrict bias,
                              float *restrict C, float *shared, float *priv, int tid, int nth,
                              const float *Bpre) {
  float *As = """ + a_slab + """; (void)As;
  long *slots = (long *)(shared + OFF_STEAL), *progress = slots + nth, lo, hi, u;
  split_range(UNITS, tid, nth, &lo, &hi);
  __atomic_store_n(&slots[tid], RANGE(lo, hi), __ATOMIC_RELEASE);
  __atomic_store_n(&progress[tid], 0L, __ATOMIC_RELEASE);
  BARRIER();
  const long jc = 0; /* one column block */
  for (long pc = 0, step = 0; pc < K; pc += KC, step++) {
    const long k_cur = MIN(KC, K - pc), last = step == STEPS - 1;
    const float *blk = PACKED_BLOCK(Bpre, jc, pc);
""" + _next_block("    ") + pack + """\
    if (!last) {
      const long plo = MIN(NP, lo * DYN_PANELS), phi = MIN(NP, hi * DYN_PANELS);
      const float *after = plo < next_np ? next_b + plo * NR * next_k : NULL;
""" + compute + """\
      __atomic_store_n(&progress[tid], step + 1, __ATOMIC_RELEASE);
      continue;
    }
    for (;;) {
      const int own = claim_own(&slots[tid], &u);
      if (!own && !claim_other(slots, progress, STEPS - 1, tid, nth, &u)) break;
      const long plo = u * DYN_PANELS, phi = MIN(NP, plo + DYN_PANELS);
      /* what this thread likely reads next: the unit after (its own) or before (taken) */
      const float *after = own && phi < NP ? blk + phi * NR * k_cur
                           : !own && plo > 0 ? blk + (plo - DYN_PANELS) * NR * k_cur : NULL;
""" + compute + """\
    }
  }
  /* the next batch item's ranges must not be published while a thread still claims here */
  if (BATCH > 1) { BARRIER(); }
}
"""


def _entries(op: OpSignature, s: MatmulSchedule, threads: int, par: str, prepack: bool,
             dynamic: bool) -> str:
    """``tc_kernel`` and ``tc_time``; with ``prepack``, also the pre-packed-B ABI.

    ``tc_pack_weights(weights, packed)`` writes op(B) block by block in the kernel's panel layout
    (``tc_packed_weights_floats()`` floats, 64-byte aligned); ``tc_kernel_packed`` takes
    ``tc_kernel``'s arguments with that buffer in B's place and packs nothing of B.
    """
    def body(packed: bool) -> str:
        # Packed: args[1] is the pre-packed op(B), which gemm_body reads instead of B.
        b_at, pre = ("NULL", "B") if packed else ("B + b * B_BATCH", "NULL")
        priv = "ws + SHARED_FLOATS + TID * PRIVATE_FLOATS"
        if packed and dynamic:
            return (f"for (long b = 0; b < BATCH; b++)\n      gemm_body_dynamic(A + b * A_BATCH, "
                    f"bias, C + b * C_BATCH, ws, {priv}, TID, NTH, B);")
        call = f"gemm_body(A + b * A_BATCH, {b_at}, bias, C + b * C_BATCH, ws, {priv}, "
        if par == "batch":
            # A threaded kernel whose parallel axis is batch runs a serial body per item.
            return f"for (long b = TID; b < BATCH; b += NTH)\n      {call}0, 1, {pre});"
        return f"for (long b = 0; b < BATCH; b++)\n      {call}TID, NTH, {pre});"

    pack = """\
  for (long jc = 0; jc < N; jc += NC) {
    const long n_cur = MIN(NC, N - jc);
    for (long pc = 0; pc < K; pc += KC)
      pack_b_block(PACKED_BLOCK(packed, jc, pc),
                   weights, pc, MIN(KC, K - pc), jc, n_cur, 0, (n_cur + NR - 1) / NR);
  }"""
    return kernel_entries(
        op, body, threads=threads, ws_floats=f"SHARED_FLOATS + {threads}L * PRIVATE_FLOATS",
        optional=("bias",), packed=PackedWeights("B_PACKED_FLOATS", pack) if prepack else None)
