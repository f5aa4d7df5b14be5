"""Concats in the native program: producers write straight into their slice of the output
(the Concat step vanishes), and every case where that is unsafe still runs correctly as
native strided copies (compiler/native/copies.py), no numpy step. Models are compiled like
a deployment (analytic schedules, layout planning on) and checked against onnxruntime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx_support import Builder, assert_close, ort_run, random_feeds

from tunecache.cache.store import Store
from tunecache.compiler.buffers import ALIGN
from tunecache.compiler.graph import OnnxNode
from tunecache.compiler.layout_plan import blocked_layout
from tunecache.compiler.native import NativeProgram
from tunecache.compiler.native.joins import Join, place_joins
from tunecache.tuner.deploy import compile_model


def _run(model: onnx.ModelProto, tmp_path: Path) -> tuple[Any, NativeProgram]:
    """Compile ``model``, run it on three inputs (the first again last: runs leave nothing
    behind) against onnxruntime; the compiled model and its program."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             record_wanted=False)
    names = [o.name for o in model.graph.output]
    first = None
    for seed in (0, 1, 0):
        feeds = random_feeds(model, seed)
        got = compiled.run(feeds)
        assert_close(got, ort_run(model, feeds), names)
        if first is None:
            first = got
    for name in names:
        np.testing.assert_array_equal(got[name], first[name])
    program = compiled.program
    assert program is not None
    return compiled, program


def _concats(compiled: Any) -> list[OnnxNode]:
    return [s for s in compiled.graph.steps if isinstance(s, OnnxNode) and s.op_type == "Concat"]


def _assert_in_place(program: NativeProgram, concat: OnnxNode) -> None:
    """Each input of ``concat`` is the slice of its output at its offset."""
    out = program.arena_range(concat.outputs[0])
    assert out is not None
    at = out[0]
    for name in concat.inputs:
        span = program.arena_range(name)
        assert span is not None and span[0] == at, (name, span, at)
        at = span[1]
    assert at == out[1]


def _branches(b: Builder, x: str, c: int) -> list[str]:
    return [b.node("Relu", [b.conv(x, c, 2 * c, 1)]), b.conv(x, c, c, 3),
            b.conv(b.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1] * 4), c, c, 1)]


@pytest.mark.parametrize("channels", [8, 4], ids=["blocked", "plain"])
def test_concat_of_conv_branches_is_written_in_place(channels: int, tmp_path: Path) -> None:
    b = Builder(13)
    x = b.input("x", [1, channels, 8, 8])
    cat = b.node("Concat", _branches(b, x, channels), axis=-3 if channels == 4 else 1)
    model = b.model([b.conv(cat, 4 * channels, 8, 3)])
    compiled, program = _run(model, tmp_path)
    (concat,) = _concats(compiled)
    assert (program.numpy_steps, program.joined_steps, program.segments) == (0, 1, 1)
    _assert_in_place(program, concat)
    if channels == 8 and blocked_layout(compiled.hw) == "nchw8c":
        producers = [k for k in compiled.graph.kernel_nodes if k.output in concat.inputs]
        assert producers and all("out_layout=nchw8c" in k.op.text for k in producers)


@pytest.mark.parametrize("case", ["graph_output", "read_after", "two_concats"])
def test_inputs_used_elsewhere_stay_correct(case: str, tmp_path: Path) -> None:
    """A concat input that is also a graph output or read after the concat shares the
    output's slot, which lives as long as either; a tensor in two concats is placed in one
    (the later), the other copies (natively)."""
    b = Builder(13)
    x = b.input("x", [1, 4, 8, 8])
    parts = _branches(b, x, 4)
    cat = b.node("Concat", parts, axis=1)
    y = cat
    for _ in range(3):  # tensors that would reuse the concat's slot were it freed early
        y = b.conv(y, 16, 16, 3)
    outputs = [y]
    if case == "graph_output":
        outputs.append(parts[1])
    elif case == "read_after":
        outputs.append(b.conv(parts[0], 8, 4, 1))
    else:
        outputs.append(b.node("Concat", [parts[2], parts[1]], axis=1))
    compiled, program = _run(b.model(outputs), tmp_path)
    concats = _concats(compiled)
    joined = len(concats) if case != "two_concats" else 1
    assert (program.joined_steps, program.numpy_steps) == (joined, 0)
    copies = len(concats[0].inputs) if case == "two_concats" else 0  # the earlier copies
    assert program.native_steps == len(compiled.graph.kernel_nodes) + copies
    _assert_in_place(program, concats[-1])


@pytest.mark.parametrize("case", ["graph_input", "batch_2", "repeated", "unaligned"])
def test_concats_that_cannot_alias_are_copied_natively(case: str, tmp_path: Path) -> None:
    b = Builder(13)
    batch, size = (2, 8) if case == "batch_2" else (1, 3 if case == "unaligned" else 8)
    x = b.input("x", [batch, 4, size, size])
    a = b.conv(x, 4, 4, 3)
    inputs = {"graph_input": [a, x], "repeated": [a, a]}.get(case, [a, b.conv(x, 4, 4, 1)])
    cat = b.node("Concat", inputs, axis=1)
    compiled, program = _run(b.model([b.conv(cat, 8, 4, 1)]), tmp_path)
    assert (program.joined_steps, program.numpy_steps) == (0, 0)
    assert program.native_steps == len(compiled.graph.kernel_nodes) + 2  # a copy per input


def test_nested_and_growing_concats_vanish(tmp_path: Path) -> None:
    """A concat of a concat, and DenseNet's concatenations of every earlier feature (each a
    prefix of the last): all of them cost nothing."""
    b = Builder(13)
    x = b.input("x", [1, 4, 8, 8])
    features = [b.conv(x, 4, 8, 3)]
    for _ in range(3):
        grown = b.node("Concat", features, axis=1) if len(features) > 1 else features[0]
        features.append(b.conv(b.node("Relu", [grown]), 8 * len(features), 8, 3))
    block = b.node("Concat", features, axis=1)
    inner = b.node("Concat", [b.conv(block, 32, 8, 1), b.conv(block, 32, 8, 3)], axis=1)
    outer = b.node("Concat", [inner, b.conv(block, 32, 16, 1)], axis=1)
    compiled, program = _run(b.model([b.conv(outer, 32, 4, 1)]), tmp_path)
    concats = _concats(compiled)
    assert len(concats) == 5
    assert (program.joined_steps, program.numpy_steps) == (5, 0)
    for concat in concats:
        _assert_in_place(program, concat)


def test_a_copied_result_is_written_into_its_slice(tmp_path: Path) -> None:
    """A Split's half (a native copy) lands in its slice of the concat; a concat that must
    copy (it reads the graph input) copies into its slice of an outer one."""
    b = Builder(13)
    x = b.input("x", [1, 8, 8, 8])
    left, right = b.node("Split", [b.conv(x, 8, 16, 1), b.ints([8, 8])], n_out=2, axis=1)
    shuffled = b.node("Concat", [left, b.conv(right, 8, 8, 3)], axis=1)
    copied = b.node("Concat", [x, b.conv(shuffled, 16, 8, 1)], axis=1)
    outer = b.node("Concat", [copied, b.conv(x, 8, 8, 3)], axis=1)
    compiled, program = _run(b.model([b.conv(outer, 24, 4, 1)]), tmp_path)
    assert (program.joined_steps, program.numpy_steps) == (2, 0)  # the Split, one Concat copy
    shuffle, _, last = _concats(compiled)
    _assert_in_place(program, shuffle)
    _assert_in_place(program, last)


def test_place_joins_takes_each_tensor_once_and_keeps_alignment() -> None:
    size = 4 * ALIGN
    joins = [Join("ab", ("a", "b"), (size, size)), Join("bc", ("b", "c"), (size, size)),
             Join("ragged", ("d", "e"), (ALIGN + 4, size))]
    placement = place_joins(joins, {"a", "b", "c", "d", "e", "ab", "bc"})
    assert placement.vanished == {"bc"}
    assert placement.slots == {"b": ("bc", 0), "c": ("bc", size)}
    nested = place_joins([Join("ab", ("a", "b"), (size, size)),
                          Join("all", ("ab", "c"), (2 * size, size))], {"a", "b", "c", "ab"})
    assert nested.vanished == {"ab", "all"}
    assert nested.slots == {"ab": ("all", 0), "a": ("all", 0), "b": ("all", size),
                            "c": ("all", 2 * size)}
