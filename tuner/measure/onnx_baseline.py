"""onnxruntime as a conv2d baseline: a one-node ``Conv`` model, timed like our kernels.

Needs the ``onnx`` and ``onnxruntime`` extras; importing this module without them raises
ImportError, which callers turn into "no baseline" (``bench-op``) or a message saying what
to install (benchmarks).

The model takes X as its input and carries W and B as initializers, as a real model does, so
onnxruntime may pre-pack the weights once at session creation. The output is bound once
(IOBinding) so a timed call does not allocate.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tunecache.compiler.kinds.conv2d import nchw_conv2d
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs
from tunecache.tuner.measure.worker import time_calls

__all__ = ["conv_model", "conv_session", "run_conv", "time_onnxruntime_conv"]


def conv_model(op: OpSignature, weights: np.ndarray, bias: np.ndarray | None) -> bytes:
    """A serialized one-node ONNX Conv model computing ``op`` (bias only; no add/relu)."""
    if op.kind != "conv2d":
        raise ValueError(f"not a conv2d op: {op.text}")
    d = op.dims_dict
    inputs = ["X", "W"] + (["B"] if bias is not None else [])
    node = helper.make_node(
        "Conv", inputs, ["Y"], kernel_shape=[d["R"], d["S"]],
        strides=[d["stride_h"], d["stride_w"]],
        pads=[d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]],
        dilations=[d["dil_h"], d["dil_w"]], group=d["groups"])
    inits = [numpy_helper.from_array(weights, "W")]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "B"))
    graph = helper.make_graph(
        [node], "conv",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [d["N"], d["C"], d["H"], d["W"]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(op.arguments()[-1].shape))],
        initializer=inits)
    # IR 9 / opset 17: read by every onnxruntime of the last few years.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def conv_session(op: OpSignature, weights: np.ndarray, bias: np.ndarray | None,
                 threads: int) -> Any:
    """An onnxruntime CPU session for :func:`conv_model` with ``threads`` intra-op threads."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(conv_model(op, weights, bias), so,
                                providers=["CPUExecutionProvider"])


def run_conv(op: OpSignature, inputs: tuple[np.ndarray, ...], threads: int = 1) -> np.ndarray:
    """onnxruntime's answer for ``op`` on our kernel's inputs (epilogue: bias only)."""
    bias = inputs[2] if "bias" in op.epilogue else None
    sess = conv_session(op, inputs[1], bias, threads)
    return np.asarray(sess.run(["Y"], {"X": inputs[0]})[0])


def time_onnxruntime_conv(op: OpSignature, threads: int, timing: dict[str, Any],
                          seed: int = 0) -> list[float]:
    """Per-call seconds of each repeat (same protocol as the measurement worker). A conv2d
    on blocked layouts is compared with onnxruntime's NCHW convolution of the same shape, an
    int8 or bf16 one with onnxruntime's float32 convolution (what quantizing replaces; a
    one-node Conv takes no integer weights), the bias its only epilogue step."""
    op = nchw_conv2d(op)
    if op.dtype != "float32":
        op = OpSignature(op.kind, op.dims, "float32", op.attrs,
                         ("bias",) if "bias" in op.epilogue else ())
    inputs = random_inputs(op, seed)
    bias = inputs[2] if "bias" in op.epilogue else None
    sess = conv_session(op, inputs[1], bias, threads)
    out = np.empty(op.arguments()[-1].shape, dtype=np.float32)
    binding = sess.io_binding()
    binding.bind_cpu_input("X", inputs[0])
    binding.bind_ortvalue_output("Y", ort.OrtValue.ortvalue_from_numpy(out))

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            sess.run_with_iobinding(binding)
        return time.perf_counter() - start

    return time_calls(run, timing)
