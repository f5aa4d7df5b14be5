"""The ``batch_matmul`` kind: ``B`` matmuls with a leading batch dim on A, B and C.

``shared=a`` or ``shared=b`` means that operand has no batch dim and is used by every batch
item (what ONNX MatMul broadcasting produces). Kernels, schedules and reference are matmul's.
"""

from __future__ import annotations

from tunecache.compiler.kinds import OpKind, register
from tunecache.compiler.kinds.matmul import (
    KIND as MATMUL,
)
from tunecache.compiler.kinds.matmul import (
    LAYOUTS,
    epilogue_tuple,
    layout_attr,
)
from tunecache.compiler.ops import KindSpec, OpSignature


def batch_matmul_op(B: int, M: int, N: int, K: int, *, trans_a: bool = False,
                    trans_b: bool = False, shared: str = "none",
                    epilogue: tuple[str, ...] | str = (), dtype: str = "float32") -> OpSignature:
    """A batch of ``B`` matmuls; ``shared`` names an operand without a batch dimension."""
    return OpSignature(
        KIND.name, (("B", B), ("M", M), ("N", N), ("K", K)), dtype,
        (("layout", layout_attr(trans_a, trans_b)), ("shared", shared)),
        epilogue_tuple(epilogue),
    )


KIND = register(OpKind(
    name="batch_matmul",
    spec=KindSpec(dims=("B", "M", "N", "K"),
                  attrs={"layout": LAYOUTS, "shared": ("none", "a", "b")},
                  epilogues=tuple(e for e in MATMUL.spec.epilogues if e != "dequant")),
    arguments=MATMUL.arguments,
    flops=MATMUL.flops,
    schedule=MATMUL.schedule,
    problems=MATMUL.problems,
    default_schedule=MATMUL.default_schedule,
    emit=MATMUL.emit,
    reference=MATMUL.reference,
    reduction_length=MATMUL.reduction_length,
    dim_columns={"B": "dim_batch", **MATMUL.dim_columns},
    examples=("batch_matmul(B=12,M=128,N=128,K=64,layout=nt)",
              "batch_matmul(B=4,M=33,N=20,K=17,shared=b,epilogue=bias)"),
))
