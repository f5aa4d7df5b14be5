"""The register micro-kernel generator shared by every outer-product tile.

A tile is ``rows x vectors`` accumulators kept in named vector registers for a whole
reduction loop nest. At each reduction step it reads one vector per column (the *column*
operand: a packed B panel, conv weights, ...) and, per row, either broadcasts one scalar
(the *row* operand: GEMM's outer product, with A elements or input pixels as rows) or loads
one vector per column (an elementwise product: depthwise convolutions), then FMAs into the
accumulators. :func:`store` writes the finished tile, optionally adding what the destination
holds and applying the fused epilogue (``epilogue.py``) on the way.

Operands are C expression templates, the emitter's addressing: ``{o}`` is the lane offset of
a column (``v * lanes``), ``{r}`` a row's index. Users: matmul's BLIS micro-kernels (packed or
in-place strided panels), conv2d's direct NCHW[x]c tile, its implicit-GEMM tile and its
depthwise plane tile. The matmul dot-product tile is not an outer product (both operands are
vectors along K, reduced horizontally at the end) and keeps its own code in ``emit_dot.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from tunecache.compiler.codegen.epilogue import operand_tensors, render

__all__ = ["KEEP_IN_REGISTER", "Loop", "Store", "Tile", "accumulate", "micro_kernel", "store"]

KEEP_IN_REGISTER = """\
/* VKEEP(x): keep a loaded vector in a register. A tile that sweeps its input (one load
 * feeding several accumulators) needs it: GCC otherwise folds every use back into a
 * memory-operand FMA and loads the vector once per use. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define VKEEP(x) __asm__("" : "+v"(x))
#else
#define VKEEP(x) ((void)0)
#endif
"""


@dataclass(frozen=True, slots=True)
class Loop:
    """One level of the reduction loop nest, outermost first.

    ``header`` is the C ``for (...)``; ``setup`` statements open every iteration (pointer
    arithmetic the inner levels use); ``unroll > 1`` asks GCC to unroll the level.
    """

    header: str
    setup: tuple[str, ...] = ()
    unroll: int = 1


@dataclass(frozen=True, slots=True)
class Tile:
    """``len(rows)`` rows of ``vectors`` vectors of ``lanes`` floats. Row labels name the
    accumulators: ``a{label}_{v}`` (e.g. ``a0_13_1`` for pixel (0, 13), vector 1)."""

    rows: tuple[str, ...]
    vectors: int
    lanes: int

    def acc(self, r: int, v: int) -> str:
        """The accumulator of row ``r``, vector ``v``."""
        return f"a{self.rows[r]}_{v}"


@dataclass(frozen=True, slots=True)
class Store:
    """Where a finished tile goes and what happens to it on the way.

    ``rows``: per row, a pointer to its first output float (vector ``v`` is ``v * lanes``
    further); ``aligned``: the destination is 64-byte aligned (aligned loads and stores).
    ``accumulate``: a C condition under which the tile is added to what the destination holds
    (``"!first"``; empty: never). ``epilogue``: steps applied when ``epilogue_if`` holds
    (empty condition: always), with ``operands`` mapping each tensor a step reads to a vector
    expression template (``{r}`` row, ``{o}`` lane offset); a template without ``{r}`` is
    loaded once per column for the whole tile. ``prefetch``: touch every cache line of the
    destination before the reduction, so that the lines a tile adds to (or overwrites) are
    on their way while it computes.
    """

    rows: tuple[str, ...]
    aligned: bool = False
    accumulate: str = ""
    epilogue: tuple[str, ...] = ()
    operands: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    epilogue_if: str = ""
    prefetch: bool = False


def _prefetches(tile: Tile, spec: Store) -> list[str]:
    """Write prefetches of every line the tile's rows cover (its start may be unaligned, so
    each row's last float is touched too)."""
    if not spec.prefetch:
        return []
    width = tile.vectors * tile.lanes
    offsets = sorted({*range(0, width, 16), width - 1})
    return [f"  __builtin_prefetch({row} + {o}, 1, 3);" for row in spec.rows for o in offsets]


def _fmas(tile: Tile, columns: str, rows: Sequence[str], indent: str) -> list[str]:
    """One reduction step: load the column vectors, then each row's FMAs (row operand first)."""
    nv = tile.vectors
    shared = "{o}" not in columns
    if shared:
        cols = ["b"] * nv
        lines = [f"{indent}const vec b = {columns};"]
    else:
        cols = [f"b{v}" for v in range(nv)]
        lines = [indent + "vec " + ", ".join(
            f"b{v} = {columns.format(o=v * tile.lanes)}" for v in range(nv)) + ";"]
    for r, expr in enumerate(rows):
        if "{o}" in expr:
            lines.append(indent + " ".join(
                f"{tile.acc(r, v)} = VFMA({expr.format(o=v * tile.lanes)}, {cols[v]}, "
                f"{tile.acc(r, v)});" for v in range(nv)))
        else:
            fmas = " ".join(f"{tile.acc(r, v)} = VFMA(x, {cols[v]}, {tile.acc(r, v)});"
                            for v in range(nv))
            lines.append(f"{indent}{{ const vec x = VSET1({expr}); {fmas} }}")
    return lines


def accumulate(tile: Tile, loops: Sequence[Loop], columns: str, rows: Sequence[str],
               lead: Sequence[Loop] = ()) -> list[str]:
    """C lines zeroing the accumulators and running the reduction loop nest.

    ``columns``: the column operand, a vector expression template (``{o}`` lane offset; one
    without ``{o}`` is the same vector for every column, e.g. a broadcast weight).
    ``rows``: per row of ``tile``, a float expression broadcast to all columns, or a vector
    expression template with ``{o}`` loaded per column. Expressions use the loops' variables.
    ``lead``: a nest with the same body run before ``loops`` (their headers split the
    reduction between them), so that work only its first steps do (``setup``) is a loop of
    its own, not a branch in every step: GCC would split such a loop itself, but leaves the
    split-off part unaligned (ARCHITECTURE change 64).
    """
    if len(rows) != len(tile.rows):
        raise ValueError(f"{len(rows)} row operands for a tile of {len(tile.rows)} rows")
    lines = ["  vec " + ", ".join(f"{tile.acc(r, v)} = VZERO()" for v in range(tile.vectors)) + ";"
             for r in range(len(tile.rows))]
    for nest in (lead, loops) if lead else (loops,):
        lines += _nest(tile, nest, columns, rows)
    return lines


def _nest(tile: Tile, loops: Sequence[Loop], columns: str, rows: Sequence[str]) -> list[str]:
    """C lines of one reduction loop nest around the FMAs of one step."""
    lines: list[str] = []
    indent = "  "
    for loop in loops:
        if loop.unroll > 1:
            lines.append(f"#pragma GCC unroll {loop.unroll}")
        lines.append(f"{indent}{loop.header} {{")
        indent += "  "
        lines += [indent + statement for statement in loop.setup]
    lines += _fmas(tile, columns, rows, indent)
    for depth in range(len(loops), 0, -1):
        lines.append("  " * depth + "}")
    return lines


def store(tile: Tile, spec: Store) -> list[str]:
    """C lines writing the accumulators of ``tile`` as ``spec`` says."""
    if len(spec.rows) != len(tile.rows):
        raise ValueError(f"{len(spec.rows)} output rows for a tile of {len(tile.rows)} rows")
    load, put = ("VLOAD", "VSTORE") if spec.aligned else ("VLOADU", "VSTOREU")
    lanes = tile.lanes
    lines: list[str] = []
    # Operands the same for every row are loaded once per column, before the stores.
    operands: dict[str, str] = {}
    hoisted: dict[str, str] = {}
    read = operand_tensors(spec.epilogue)
    for name, template in spec.operands.items():
        if name not in read:
            continue
        if "{r}" in template:
            operands[name] = template
            continue
        per_column = "{o}" in template
        for v in range(tile.vectors if per_column else 1):
            hoisted[f"ep_{name}{v}"] = template.format(o=v * lanes)
        operands[name] = f"ep_{name}{{v}}" if per_column else f"ep_{name}0"
    if hoisted:
        if spec.epilogue_if:
            lines.append("  vec " + ", ".join(hoisted) + ";")
            lines.append(f"  if ({spec.epilogue_if}) {{ "
                         + " ".join(f"{k} = {e};" for k, e in hoisted.items()) + " }")
        else:
            lines += [f"  const vec {k} = {e};" for k, e in hoisted.items()]
    for r in range(len(tile.rows)):
        for v in range(tile.vectors):
            ptr = f"{spec.rows[r]} + {v * lanes}"
            acc = tile.acc(r, v)
            if not spec.accumulate and not spec.epilogue:
                lines.append(f"  {put}({ptr}, {acc});")
                continue
            step = f"  {{ vec t = {acc};"
            if spec.accumulate:
                step += f" if ({spec.accumulate}) t = VADD(t, {load}({ptr}));"
            if spec.epilogue:
                ops = {name: t.format(r=r, o=v * lanes, v=v) for name, t in operands.items()}
                epi = render(spec.epilogue, "t", ops, vector=True)
                step += f" if ({spec.epilogue_if}) {{ {epi} }}" if spec.epilogue_if else f" {epi}"
            lines.append(f"{step} {put}({ptr}, t); }}")
    return lines


def micro_kernel(signature: str, tile: Tile, loops: Sequence[Loop], columns: str,
                 rows: Sequence[str], spec: Store, lead: Sequence[Loop] = ()) -> str:
    """A whole ``static inline`` micro-kernel: ``signature`` (everything before the body's
    brace), the reduction of :func:`accumulate`, then the :func:`store` of ``spec``."""
    return "\n".join([f"{signature} {{", *_prefetches(tile, spec),
                      *accumulate(tile, loops, columns, rows, lead), *store(tile, spec), "}"])
