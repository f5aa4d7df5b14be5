"""Calling kernels: every bad argument is a clear error, never a crash."""

from __future__ import annotations

import numpy as np
import pytest

from tunecache.compiler.buffers import ALIGN, address_of, aligned_copy, aligned_empty, as_aligned
from tunecache.compiler.errors import KernelArgumentError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule

OP = matmul_op(20, 36, 12, trans_b=True, epilogue="bias+relu")


@pytest.fixture(scope="module")
def kernel():
    hw = local_spec()
    return compile_kernel(OP, default_schedule(OP, hw), hw)


def test_call_and_out_parameter(kernel) -> None:
    a, b, bias = random_inputs(OP)
    expected = reference(OP, (a, b, bias))
    np.testing.assert_allclose(kernel(a, b, bias), expected, rtol=1e-4, atol=1e-4)
    out = np.empty((20, 36), np.float32)
    assert kernel(a, b, bias, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_unaligned_but_contiguous_views_work(kernel) -> None:
    a, b, bias = random_inputs(OP)
    buf = np.zeros(a.size + 1, np.float32)
    shifted = buf[1:].reshape(a.shape)  # 4-byte offset from numpy's allocation
    shifted[...] = a
    np.testing.assert_allclose(kernel(shifted, b, bias), kernel(a, b, bias), rtol=0, atol=0)



@pytest.mark.parametrize("text", [
    "matmul(M=128,N=768,K=768,dtype=float32,layout=nn,epilogue=none)",
    "conv2d(N=1,C=16,H=9,W=9,F=32,R=3,S=3,stride_h=1,stride_w=1,pad_t=1,pad_l=1,pad_b=1,pad_r=1)",
    "softmax(M=3,N=7)",
])
def test_measurement_inputs_start_on_a_cache_line(text: str) -> None:
    """What the tuner times reads aligned operands, as a compiled model's arena and packed
    weights are: numpy guarantees only 16 bytes, and a 16-byte offset cost an in-place 8x16
    AVX-512 tile 4-5%."""
    op = OpSignature.parse(text)
    inputs = random_inputs(op)
    assert all(address_of(x) % ALIGN == 0 and x.flags.c_contiguous for x in inputs)
    again = np.random.default_rng(0).standard_normal(inputs[0].shape, dtype=np.float32)
    if "matmul" in text:  # the values are numpy's draw, unchanged by the copy
        np.testing.assert_array_equal(inputs[0], again)


def test_aligned_empty_takes_shapes_dtypes_and_zeroes() -> None:
    for shape, dtype in [(7, np.float32), ((3, 5), np.int64), ((2, 3, 4), np.uint8)]:
        x = aligned_empty(shape, dtype, zero=True)
        assert address_of(x) % ALIGN == 0 and x.dtype == dtype and not x.any()
        assert x.shape == ((shape,) if isinstance(shape, int) else shape)
    y = aligned_copy(np.arange(10.0)[::2])
    assert address_of(y) % ALIGN == 0 and y.flags.c_contiguous
    np.testing.assert_array_equal(y, [0.0, 2.0, 4.0, 6.0, 8.0])
    assert as_aligned(y) is y
    shifted = aligned_empty(9)[1:]  # 4 bytes past a line
    moved = as_aligned(shifted)
    assert moved is not shifted and address_of(moved) % ALIGN == 0

@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda a, b, c: (a.astype(np.float64), b, c), "dtype float64"),
        (lambda a, b, c: (a[:, :6], b, c), "shape (20, 6)"),
        (lambda a, b, c: (np.asfortranarray(a), b, c), "not C-contiguous"),
        (lambda a, b, c: (a, b.T.copy(), c), "shape (12, 36)"),
        (lambda a, b, c: (a, b, c[:5]), "argument bias has shape (5,)"),
        (lambda a, b, c: (a, b, c.tolist()), "must be a numpy array"),
        (lambda a, b, c: (a, b), "takes 3 input(s)"),
    ],
)
def test_bad_arguments_are_refused(kernel, mutate, fragment) -> None:
    with pytest.raises(KernelArgumentError) as info:
        kernel(*mutate(*random_inputs(OP)))
    assert fragment in str(info.value)


def test_bad_outputs_are_refused(kernel) -> None:
    a, b, bias = random_inputs(OP)
    out = np.empty((20, 36), np.float32)
    out.flags.writeable = False
    with pytest.raises(KernelArgumentError, match="read-only"):
        kernel(a, b, bias, out=out)
    with pytest.raises(KernelArgumentError, match="shape"):
        kernel(a, b, bias, out=np.empty((36, 20), np.float32))
    with pytest.raises(KernelArgumentError, match="not C-contiguous"):
        kernel(a, b, bias, out=np.empty((40, 36), np.float32)[::2])
    shared = np.zeros(20 * 12 + 20 * 36, np.float32)
    with pytest.raises(KernelArgumentError, match="overlaps input A"):
        kernel(shared[:240].reshape(20, 12), b, bias, out=shared[200:920].reshape(20, 36))


def test_weights_packed_once_serve_every_kernel_of_that_layout() -> None:
    """Two matmuls over the same weights with different rows but the same packed layout
    (``OpKind.packed_weights_layout``): the second runs on the first's packed buffer and
    matches its reference; a kernel of another layout refuses the buffer."""
    from dataclasses import replace

    from tunecache.compiler.kinds import op_kind

    hw = local_spec()
    ops = [OpSignature.parse(f"matmul(M={m},N=40,K=48,epilogue=bias)") for m in (5, 9)]
    s = replace(default_schedule(ops[0], hw), pack_b=1, kc=16, threads=1)
    s = replace(s, nc=s.nr * 2)
    layout = op_kind("matmul").packed_weights_layout
    assert layout is not None and layout(ops[0], s) == layout(ops[1], s)
    first, second = (compile_kernel(op, s, hw) for op in ops)
    a, b, bias = random_inputs(ops[1])
    packed = first.bind_weights(b).packed
    bound = second.bind_packed(packed)
    assert bound.packed is packed
    np.testing.assert_allclose(bound(a, bias), reference(ops[1], (a, b, bias)), rtol=1e-4,
                               atol=1e-4)
    # other K blocks: the same number of floats in another order, so another layout
    assert layout(ops[1], replace(s, kc=32)) != layout(ops[1], s)
    with pytest.raises(KernelArgumentError, match="cannot run on"):
        second.bind_packed(packed[:-1])


@pytest.mark.parametrize("pack_b", [1, 0])
def test_a_rotating_timer_runs_the_kernel_on_every_copy_of_its_weights(pack_b: int) -> None:
    """Weights packed once (``pack_b=1``) or read in place (``pack_b=0``): as many copies as
    it takes to span the bytes asked for, each call on the next copy, each call right."""
    from dataclasses import replace

    from tunecache.compiler.runtime import MAX_WEIGHT_COPIES

    hw = local_spec()
    op = OpSignature.parse("matmul(M=4,N=64,K=96,epilogue=bias)")
    kernel = compile_kernel(op, replace(default_schedule(op, hw), pack_b=pack_b, threads=1), hw)
    assert kernel.prepacks_weights == bool(pack_b)
    inputs = random_inputs(op)
    unit = kernel.bind_weights(inputs[1]).packed.nbytes if pack_b else inputs[1].nbytes
    for span, copies in ((unit * 5 - 1, 5), (unit, 1), (unit * 1000, MAX_WEIGHT_COPIES)):
        out = np.full((4, 64), np.nan, dtype=np.float32)
        bound = kernel.bind_weights(inputs[1]) if pack_b else None
        run, made = kernel.rotating_timer(inputs, out, span, bound)
        assert made == copies
        assert run(2 * copies + 1) > 0
        np.testing.assert_allclose(out, reference(op, inputs), rtol=1e-4, atol=1e-4)


def test_a_rotating_timer_keeps_alive_every_array_it_points_into() -> None:
    """The timer's table holds raw pointers to the inputs and the output: a caller that
    keeps only the timer must not leave it writing into freed memory."""
    import gc
    import weakref

    hw = local_spec()
    op = OpSignature.parse("matmul(M=4,N=64,K=96,epilogue=bias)")
    kernel = compile_kernel(op, default_schedule(op, hw), hw)
    inputs = random_inputs(op)
    out = np.full((4, 64), np.nan, dtype=np.float32)
    run, _ = kernel.rotating_timer(inputs, out, 0)
    refs = [weakref.ref(a) for a in (*inputs, out)]
    del inputs, out
    gc.collect()
    assert all(r() is not None for r in refs)
    assert run(3) > 0
    np.testing.assert_allclose(refs[-1](), reference(op, tuple(r() for r in refs[:-1])),
                               rtol=1e-4, atol=1e-4)
