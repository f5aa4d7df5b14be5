"""``Einsum`` products as the ``Transpose`` and ``MatMul`` nodes they are.

Attention written with ``torch.einsum`` exports as ``Einsum`` nodes
(``bhid,bhjd->bhij`` for the scores, ``bhij,bhjd->bhid`` for the context), which only the
reference implementation ran. :func:`einsum_products` rewrites each two-operand product
whose letters split into batch letters (in both operands and the output), one row letter
(first operand and output), one column letter (second operand and output) and one
contracted letter (both operands, not the output) into a ``MatMul`` between ``Transpose``
nodes (each omitted where it is the identity). The lowerings then see what they know: a
MatMul of a transposed operand, which becomes a matmul or batch_matmul kernel, or with the
softmax between two of them an attention kernel. Other equations (a sum over a letter of
one operand, a repeated letter, an ellipsis, more than one letter per role, one operand or
three) stay ``Einsum`` nodes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import RewriteTensors, rewrite_each

__all__ = ["einsum_products"]


def einsum_products(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each two-operand ``Einsum`` that is one (batched) matrix product
    replaced by Transpose/MatMul/Transpose nodes; the new tensors get their shapes and the
    first operand's dtype."""
    return rewrite_each(nodes, tensors, lambda node, t: _roles(node, t.shapes),
                        lambda node, roles, t: _product(node, roles, t.shapes, t.dtypes))


def _roles(node: ReadNode, shapes: dict[str, tuple[int | None, ...]]
           ) -> tuple[str, str, str, str, str] | None:
    """``(a, b, out, matmul letters, contracted)`` of an Einsum this module rewrites: the
    two operands' and the output's letters, the MatMul's output letters (batch, row,
    column) and the letter summed over."""
    if node.op_type != "Einsum" or node.domain or len(node.inputs) != 2:
        return None
    equation = str(node.attrs.get("equation", "")).replace(" ", "")
    if "->" not in equation or "." in equation or equation.count(",") != 1:
        return None
    terms, result = equation.split("->")
    a, b = terms.split(",")
    if any(len(set(t)) != len(t) or not t.isalpha() for t in (a, b, result)):
        return None
    if any(len(shapes.get(t) or ()) != len(letters)
           for t, letters in zip(node.inputs, (a, b), strict=True)):
        return None  # a shape we do not know, or one the equation does not fit
    batch = [c for c in result if c in a and c in b]
    rows, cols = [c for c in a if c not in b], [c for c in b if c not in a]
    contracted = [c for c in a if c in b and c not in result]
    if len(rows) != 1 or len(cols) != 1 or len(contracted) != 1 or \
            set(result) != {*batch, *rows, *cols}:
        return None
    first, second = (dict(zip(t, shapes[n], strict=True)) for t, n in zip(
        (a, b), node.inputs, strict=True))
    if any(first[c] != second[c] for c in (*batch, *contracted)):
        return None  # sizes that differ (a broadcast): the reference decides
    return a, b, result, "".join(batch) + rows[0] + cols[0], contracted[0]


def _product(node: ReadNode, roles: tuple[str, str, str, str, str],
             shapes: dict[str, tuple[int | None, ...]], dtypes: dict[str, np.dtype]
             ) -> list[ReadNode]:
    a, b, result, product, contracted = roles
    size = {c: d for t, letters in zip(node.inputs, (a, b), strict=True)
            for c, d in zip(letters, shapes[t], strict=True)}
    dtype = dtypes.get(node.inputs[0], np.dtype(np.float32))
    made: list[ReadNode] = []

    def transposed(tensor: str, have: str, want: str, name: str, output: str | None = None
                   ) -> str:
        if have == want and output is None:
            return tensor
        target = output or f"{node.outputs[0]}/{name}"
        if output is None:
            shapes[target], dtypes[target] = tuple(size[c] for c in want), dtype
        made.append(replace(node, name=f"{node.name}/{name}", op_type="Transpose",
                            inputs=(tensor,), outputs=(target,),
                            attrs={"perm": tuple(have.index(c) for c in want)}))
        return target

    batch, row, col = product[:-2], product[-2], product[-1]
    left = transposed(node.inputs[0], a, batch + row + contracted, "a")
    right = transposed(node.inputs[1], b, batch + contracted + col, "b")
    last = product == result
    matmul_out = node.outputs[0] if last else f"{node.outputs[0]}/matmul"
    if not last:
        shapes[matmul_out], dtypes[matmul_out] = tuple(size[c] for c in product), dtype
    made.append(replace(node, name=node.name if last else f"{node.name}/matmul",
                        op_type="MatMul", inputs=(left, right), outputs=(matmul_out,),
                        attrs={}))
    if not last:
        transposed(matmul_out, product, result, "out", node.outputs[0])
    return made
