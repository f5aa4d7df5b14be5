"""Data-movement ops (Transpose, Concat, Split, Expand) run as native strided copies in the
compiled program: no numpy step, the same outputs as onnxruntime; the copy parameters merge
contiguous runs; a step the copies cannot describe stays a numpy step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_support import Builder, assert_close, ort_run, random_feeds

from tunecache.cache.store import Store
from tunecache.compiler.backends.cpu.runner import PARALLEL_MIN_BYTES
from tunecache.compiler.graph import OnnxNode
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.native import NativeProgram
from tunecache.compiler.native.copies import Copy, _merged, copies_of
from tunecache.tuner.deploy import compile_model


def _program(model: onnx.ModelProto, tmp_path: Path) -> tuple[NativeProgram, list[str]]:
    """Compile and run ``model`` on two inputs against onnxruntime; its program and the op
    types of its numpy steps."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             record_wanted=False, blocked_layouts=False)
    names = [o.name for o in model.graph.output]
    for seed in (0, 1):
        feeds = random_feeds(model, seed)
        assert_close(compiled.run(feeds), ort_run(model, feeds), names)
    program = compiled.program
    assert program is not None
    kinds = [s.op_type for s in compiled.graph.steps if isinstance(s, OnnxNode)
             and s.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")]
    return program, kinds


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 2, 3, 1), (3, 1, 0, 2), (0, 1, 2, 3)])
def test_transposes(perm: tuple[int, ...], tmp_path: Path) -> None:
    b = Builder(17)
    x = b.input("x", [2, 3, 5, 4])
    t = b.node("Transpose", [b.node("Relu", [x])], perm=list(perm))
    program, kinds = _program(b.model([b.node("Relu", [t])]), tmp_path)
    assert kinds == ["Transpose"] and program.numpy_steps == 0


@pytest.mark.parametrize("shape", [[1, 2, 2, 3, 5, 7], [2, 3, 1, 4, 6, 1]])
def test_phase_interleave(shape: list[int], tmp_path: Path) -> None:
    """A transposed convolution's interleave ``[N, sh, sw, C, Qh, Qw] -> [N, C, Qh, sh, Qw,
    sw]``: innermost dims of a few items, copied a block of two dims per task."""
    b = Builder(17)
    x = b.input("x", shape)
    t = b.node("Transpose", [b.node("Relu", [x])], perm=[0, 3, 4, 1, 5, 2])
    program, kinds = _program(b.model([b.node("Relu", [t])]), tmp_path)
    assert kinds == ["Transpose"] and program.numpy_steps == 0


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_of_activations_inputs_and_constants(axis: int, tmp_path: Path) -> None:
    """Inputs that no join can place (a graph input, a constant, an activation): one copy
    each, into the output's slice."""
    b = Builder(17)
    x = b.input("x", [2, 3, 4])
    parts = [b.node("Relu", [x]), x, b.weight(2, 3, 4), b.node("Sigmoid", [x])]
    cat = b.node("Concat", parts, axis=axis)
    program, kinds = _program(b.model([b.node("Relu", [cat])]), tmp_path)
    assert kinds == ["Concat"] and program.numpy_steps == 0


def test_split_and_expand(tmp_path: Path) -> None:
    b = Builder(17)
    x = b.input("x", [2, 6, 5])
    left, mid, right = b.node("Split", [b.node("Relu", [x]), b.ints([1, 3, 2])], n_out=3,
                              axis=1)
    wide = b.node("Expand", [b.node("Relu", [b.input("y", [3, 1])]), b.ints([2, 3, 5])])
    total = b.node("Add", [mid, wide])
    program, kinds = _program(b.model([b.node("Relu", [left]), total, right]), tmp_path)
    assert sorted(kinds) == ["Expand", "Split"] and program.numpy_steps == 0


def test_the_decode_step_with_a_cache_runs_no_numpy_copies(tmp_path: Path) -> None:
    """GPT-2 with past keys and values, as the TorchScript path exports it: the new key and
    value heads are transposed and concatenated with the cache natively."""
    from test_frontend_exporters import checked_runs

    for compiled, feeds, _, _ in checked_runs("gpt2_past_torchscript17", tmp_path, ((2, 3),)):
        program = compiled.prepare({k: v.shape for k, v in feeds.items()}).program
        assert program is not None
        bridged = {label.rsplit("(", 1)[-1].rstrip(")") for label in
                   (item.label for item in program._schedule if hasattr(item, "label"))}
        assert not bridged & {"Concat", "Transpose", "Split"}, bridged


def test_params_merge_contiguous_runs_and_drop_unit_dims() -> None:
    # the head transpose of one decode token: [1, 1, 12, 64] -> [1, 12, 1, 64] is one run
    copy = Copy("k", "kt", (1, 12, 1, 64), (3072, 256, 3072, 4), (3072, 256, 256, 4))
    assert _merged(copy.shape, copy.src_strides, copy.dst_strides) == ((768,), (4,), (4,))
    params = copy.params(4, threads=2)
    assert list(params[:5]) == [1, 4, 0, 0, 2] and list(params[5:]) == [768, 4, 4]
    # a real transpose keeps its two dims
    assert _merged((3, 5), (4, 12), (20, 4)) == ((3, 5), (4, 12), (20, 4))


def test_steps_it_cannot_describe_stay_numpy() -> None:
    shapes = {"x": ((2, 3), np.dtype(np.float32)), "y": ((3, 2), np.dtype(np.float32)),
              "i": ((2, 3), np.dtype(np.int64)), "j": ((3, 2), np.dtype(np.int64))}
    from types import MappingProxyType

    def node(op: str, inputs: tuple[str, ...], outputs: tuple[str, ...], **attrs: object
             ) -> OnnxNode:
        return OnnxNode("n", op, inputs, outputs, MappingProxyType(attrs))

    assert copies_of(node("Transpose", ("x",), ("y",)), shapes, {})  # perm reversed
    assert copies_of(node("Transpose", ("i",), ("j",)), shapes, {}) is None  # int64
    assert copies_of(node("Relu", ("x",), ("x",)), shapes, {}) is None
    assert copies_of(node("Transpose", ("x",), ("y",), perm=(0, 1)), shapes, {}) is None


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), [
    ([1], [4], [1], None),                      # one axis
    ([0, -3], [2, 100], [0, -1], [1, 1]),       # negative start, clamped end
    ([5, 0], [-100, 6], [2, 1], [-2, 3]),       # reversed with a step, and a stride
])
def test_slices_with_constant_bounds(starts: list[int], ends: list[int], axes: list[int],
                                     steps: list[int] | None, tmp_path: Path) -> None:
    b = Builder(17)
    x = b.input("x", [3, 6, 7])
    inputs = [b.node("Relu", [x]), b.ints(starts), b.ints(ends), b.ints(axes)]
    if steps is not None:
        inputs.append(b.ints(steps))
    cut = b.node("Slice", inputs)
    program, kinds = _program(b.model([b.node("Relu", [cut])]), tmp_path)
    assert kinds == ["Slice"] and program.numpy_steps == 0


def test_large_copies_shared_among_threads(tmp_path: Path) -> None:
    """Copies of at least PARALLEL_MIN_BYTES run on the program's threads: many runs (a
    key/value cache Concat), one long run cut into pieces (a Concat along axis 0), and an
    element-strided transpose; each equals onnxruntime's."""
    b = Builder(17)
    past, new = b.input("past", [8, 12, 128, 64]), b.input("new", [8, 12, 1, 64])
    # graph inputs: no producer can write them into the joined buffer, so they are copied
    cache = b.node("Concat", [past, new], axis=2)
    x = b.input("x", [256, 512])
    rows = b.node("Concat", [x, b.input("y", [256, 512])], axis=0)
    turned = b.node("Transpose", [b.node("Relu", [x])], perm=[1, 0])
    model = b.model([b.node("Relu", [cache]), b.node("Relu", [rows]),
                     b.node("Relu", [turned])])
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    hw = replace(local_spec(), cores=2)
    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             record_wanted=False, blocked_layouts=False, hw=hw, threads=2)
    names = [o.name for o in model.graph.output]
    for seed in (0, 1):
        feeds = random_feeds(model, seed)
        assert_close(compiled.run(feeds), ort_run(model, feeds), names)
    program = compiled.program
    assert program is not None and program.threads == 2 and program.numpy_steps == 0
    copies = [v for k, v in program._constants.items() if k.startswith("copy:")]
    assert copies and all(int(params[4]) == 2 for params in copies)
    assert max(int(np.prod(p[5:5 + p[0]])) * 4 for p in copies) >= PARALLEL_MIN_BYTES
