"""C code for conv2d: blocked direct convolution and implicit GEMM, both with fused epilogues.

Same ABI as every kernel (``tc_kernel(void **args)`` / ``tc_time``), arguments in
:meth:`OpSignature.arguments` order (``X, W[, bias][, add], Y``), shapes as compile-time
constants. Layout conversions happen inside the kernel, so they are part of its measured time;
blocked layouts (``nchw{x}c``, :class:`DirectPlan`) skip most of them: a blocked input is
read in place or copied row by row with its zero border, a blocked output gets whole vectors.

``direct`` (NCHW[x]c): the input is copied once per call into a zero-padded, channel-blocked
layout ``Xb[N][G][C/icb][Hp][Wp][icb]`` (padding done here, so the inner loops have no bounds
checks) and the weights into ``Wb[G][F/ocb][C/icb][R][S][icb][ocb]`` (zero-padded to whole
blocks). A register tile holds ``oh x ow`` output pixels x ``ocb`` output channels (vectors);
for every (channel block, r, s, c) it loads ``ocb/lanes`` weight vectors and broadcasts one
input scalar per pixel — GEMM's outer product with pixels as rows. The whole reduction stays
in registers; the finished tile goes through a small buffer to the NCHW output with bias,
residual add and relu applied. Depthwise convolutions (one channel per group) vectorise over
channels instead: ``Xb[N][C/ocb][Hp][Wp][ocb]``, one weight vector per tap, one input vector
per pixel.

``gemm`` (implicit GEMM): per group, ``Y[F,P*Q] = W[F,C*R*S] @ im2col(X)``. The weights are
packed into ``oc_block``-row panels (the A operand, broadcast), the im2col matrix is never
materialised: each thread packs a ``ic_block*R*S x ow_block`` panel of it on the fly (the B
operand, loaded as vectors along output pixels), and the micro-kernel writes NCHW output rows
directly. Partial tiles go through a local tile merged by scalar code, as in matmul.

This module picks the emitter (:func:`generate_conv2d`) and is where other code imports the
conv2d emitters' public names from. The code lives beside it: ``emit_direct.py`` (the direct
kernel), its plan and the choices behind it (``direct_plan.py``), its micro-kernel and stores
(``direct_tile.py``) and its operand copies (``direct_pack.py``); ``emit_plane.py`` (the
depthwise plane kernel, ``pack_w=0``); ``emit_gemm.py`` (implicit GEMM); ``winograd.py``;
``epilogue.py`` (the epilogue on finished outputs, shared by the direct and GEMM kernels).
"""

from __future__ import annotations

from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.kinds.conv2d.direct_plan import flattened, reduces_in_chunks
from tunecache.compiler.kinds.conv2d.direct_tile import blocked_store, direct_ukr
from tunecache.compiler.kinds.conv2d.emit_direct import generate_direct
from tunecache.compiler.kinds.conv2d.emit_gemm import generate_gemm
from tunecache.compiler.kinds.conv2d.emit_lowp import generate_lowp_conv
from tunecache.compiler.kinds.conv2d.emit_plane import generate_plane
from tunecache.compiler.kinds.conv2d.lowp import runs_float_kernel
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, flat_pixels
from tunecache.compiler.kinds.conv2d.winograd import generate_winograd
from tunecache.compiler.ops import OpSignature

__all__ = ["blocked_store", "direct_ukr", "generate_conv2d", "reduces_in_chunks"]


def generate_conv2d(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The C translation unit for the conv2d ``op`` under ``s`` (validated by the caller)."""
    if not runs_float_kernel(op):
        return generate_lowp_conv(op, s, d)
    if s.algorithm == "gemm":
        return generate_gemm(op, s, d)
    if s.algorithm == "winograd":
        return generate_winograd(op, s, d)
    if not s.pack_w:
        return generate_plane(op, s, d)
    if flat_pixels(op):
        return generate_direct(*flattened(op, s), d)
    return generate_direct(op, s, d)
