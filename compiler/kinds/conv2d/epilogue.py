"""How conv2d kernels apply their fused epilogue to finished outputs.

Per element on the way out (:func:`epilogue_scalar`: the direct kernel's stores, the implicit
GEMM's partial-tile merge), or to the channel vectors of the direct kernel's scratch tile
before the ``nchw`` sink transposes it (:func:`vector_tile_epilogue`, :func:`tile_epilogue`).
"""

from __future__ import annotations

from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND, render
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.ops import OpSignature


def epilogue_scalar(op: OpSignature, v: str, f: str, off: str) -> str:
    """C statements applying the epilogue to float ``v`` of channel ``f`` at output ``off``."""
    return render(op.epilogue, v, {"bias": f"bias[{f}]", "add": f"add[{off}]",
                                   CHANNEL_OPERAND: f"chan[{{i}} * F + {f}]"}, vector=False)


def vector_tile_epilogue(op: OpSignature) -> bool:
    """Whether the ``nchw`` sink applies the epilogue to the scratch tile's channel vectors
    before transposing it (every epilogue without a residual: its operand is per channel),
    rather than per element on the way out (scalar ``FEXP`` for ``silu`` cost 3 ms of a
    144-channel 56x56 depthwise layer)."""
    return bool(op.epilogue) and "add" not in op.epilogue


def tile_epilogue(op: OpSignature, s: Conv2dSchedule, lanes: int) -> str:
    """``tile_epilogue``: the epilogue on every vector of the scratch tile (channels
    ``f0 + o`` in the lanes; bias lanes from ``fvalid`` on read as 0, nothing past F)."""
    lines = []
    for v in range(s.oc_block // lanes):
        n = f"MIN({lanes}, MAX(0, fvalid - {v * lanes}))"
        epi = render(op.epilogue, "t", {
            "bias": f"VLOADU_PART(bias + f0 + {v * lanes}, {n})",
            CHANNEL_OPERAND: f"VLOADU_PART(chan + {{i}} * F + f0 + {v * lanes}, {n})"},
            vector=True)
        lines.append(f"    {{ vec t = VLOAD(tile + k * OCB + {v * lanes}); {epi} "
                     f"VSTORE(tile + k * OCB + {v * lanes}, t); }}")
    body = "\n".join(lines)
    return f"""\
#define MAX(x, y) ((x) > (y) ? (x) : (y))
static void tile_epilogue(float *restrict tile, const float *restrict bias,
                          const float *restrict chan, long f0, long fvalid) {{
  (void)bias; (void)chan; (void)f0; (void)fvalid;
  for (long k = 0; k < TH * TW; k++) {{
{body}
  }}
}}
"""
