"""Calling kernels: every bad argument is a clear error, never a crash."""

from __future__ import annotations

import numpy as np
import pytest

from tunecache.compiler.errors import KernelArgumentError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule

OP = OpSignature.matmul(20, 36, 12, trans_b=True, epilogue="bias+relu")


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
