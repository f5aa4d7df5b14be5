"""The tuner's side of ``pwdw``: depthwise tiles, pointwise strips and band heights.

The pointwise strip and the depthwise tile are register tiles (pixels x one channel block
of vectors) sized like conv2d's direct tiles: widths that divide the row, within the
register file. A band holds whole row tiles; the candidates range from one
tile to as many as fit a quarter of L2 (the band is read back right after it is written)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.pwdw import PwdwSchedule, band_floats, block_of, pwdw_problems
from tunecache.compiler.ops import OpSignature
from tunecache.tuner.kinds import Strata, TunerKind, register


def _widths(size: int, fit: int) -> list[int]:
    """Tile widths for a row of ``size``: the three widest that divide it and fit the
    registers (a tail tile measured 10-20% slower: 19+19+18 against 14 x 4 for a 56-pixel
    row), else the widest that fits."""
    exact = [w for w in range(min(size, fit), 3, -1) if size % w == 0]
    return exact[:3] or [min(size, fit)]


def _strips(size: int, fit: int, blocks: int) -> list[int]:
    """Pointwise strip widths for a row of ``size``: :func:`_widths`; for two-block bands
    the three widest that fit, tail and all, of those that cover the row with less than a
    tenth wasted. On the AVX2 VM, 6-pixel two-block strips ran MobileNet-v2's 112-wide
    16->96 layer 0.83-0.87x the time of the 4-pixel strips that divide the row, while on its
    7x7 160->960 layer (6 + 1 pixels) they ran 1.2x the one-block time."""
    if blocks == 1:
        return _widths(size, fit)
    fitting = range(min(size, fit), 3, -1)
    return [w for w in fitting if size / (-(-size // w) * w) >= 0.9][:3]


def _bands(op: OpSignature, s: PwdwSchedule, hw: HardwareSpec) -> list[int]:
    budget = hw.l2_bytes // 4 // 4
    tiles = -(-op.out_h // min(s.oh_block, op.out_h))
    out = [1]
    for t in (2, 4, 8, 16, tiles):
        if t <= tiles and band_floats(op, s.replace(band_tiles=t)) <= budget:
            out.append(t)
    return sorted(set(out))


def _tiles(op: OpSignature, hw: HardwareSpec, blocks: int) -> Iterator[tuple[int, int, int]]:
    """(depthwise ow, oh, pointwise strip) register tiles for bands of ``blocks`` channel
    blocks; two-block bands take narrow depthwise tiles two rows tall as well."""
    nv = max(1, block_of(op) * blocks // hw.lanes)
    fit = max(1, (hw.vector_registers - nv - 1) // nv)
    narrow = [w for w in (2, 3) if blocks > 1 and 2 * w <= fit]
    for ow in dict.fromkeys([*_widths(op.out_w, fit), *narrow]):
        for oh in (1, 2):
            if oh * ow <= fit and not (ow in narrow and oh == 1):
                for pw in _strips(op.dim("W"), fit, blocks):
                    yield ow, oh, pw


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[PwdwSchedule]:
    """Bands of one channel block and of two where a block is one vector (a second vector
    per pixel lets each broadcast input value feed two FMAs; F must hold whole bands, as
    :func:`pwdw_problems` checks). On the AVX2 Zen 3 VM, in MobileNet-v2 compiled from the
    estimate, its pwdw layers of 14x14 and more ran 0.84-0.91x their one-block time with
    two-block bands (5- and 6-pixel strips, 3x2 or 2x2 depthwise tiles); the 7x7 layers keep
    one-block bands."""
    pars = ["oc", "pixel"] if threads > 1 else ["oc"]
    for blocks in (1, 2) if block_of(op) == hw.lanes else (1,):
        for ow, oh, pw in _tiles(op, hw, blocks):
            base = PwdwSchedule(ow_block=ow, oh_block=oh, pw_block=pw, threads=threads,
                                band_blocks=blocks)
            for band, par in product(_bands(op, base, hw), pars):
                s = base.replace(band_tiles=band, parallel=par)
                if not pwdw_problems(op, s, hw):
                    yield s


def _tile_key(s: PwdwSchedule) -> tuple[object, ...]:
    return (s.ow_block, s.oh_block, s.pw_block, s.band_blocks)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None = None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    strata: Strata = {}
    for s in _pool(op, hw, t):
        strata.setdefault(_tile_key(s), []).append(s)
    return strata


def _neighbours(op: OpSignature, best: PwdwSchedule, hw: HardwareSpec) -> list[PwdwSchedule]:
    moves = [best.replace(band_tiles=max(1, best.band_tiles // 2)),
             best.replace(band_tiles=best.band_tiles * 2),
             best.replace(pw_block=best.pw_block + 2), best.replace(pw_block=best.pw_block - 2),
             best.replace(parallel="pixel" if best.parallel == "oc" else "oc")]
    return [m for m in dict.fromkeys(moves) if m != best and not pwdw_problems(op, m, hw)]


KIND = register(TunerKind(name="pwdw", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
