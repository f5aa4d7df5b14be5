"""The native whole-model program: arena planning, the C runner, and models run through it
against the reference executor and onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_support import (
    Builder,
    assert_close,
    bert_layer_model,
    mobilenet_model,
    ort_run,
    random_feeds,
    resnet_model,
)

from tunecache.cache.store import Store
from tunecache.compiler.buffers import ALIGN, address_of
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.graph import ModelError
from tunecache.compiler.native import Lifetime, NativeProgram, plan_arena
from tunecache.tuner.deploy import compile_model


def _overlapping(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_arena_never_overlaps_tensors_alive_together() -> None:
    rng = np.random.default_rng(0)
    tensors = []
    for i in range(60):
        first = int(rng.integers(0, 40))
        tensors.append(Lifetime(f"t{i}", int(rng.integers(1, 5000)), first,
                                first + int(rng.integers(0, 6))))
    plan = plan_arena(tensors)
    for t in tensors:
        assert plan.offsets[t.name] % ALIGN == 0
        assert plan.offsets[t.name] + t.nbytes <= plan.peak_bytes
    for a in tensors:
        for b in tensors:
            if a.name < b.name and a.overlaps(b):
                span_a = (plan.offsets[a.name], plan.offsets[a.name] + a.nbytes)
                span_b = (plan.offsets[b.name], plan.offsets[b.name] + b.nbytes)
                assert not _overlapping(span_a, span_b), (a, b)
    # Reuse: far less than every tensor side by side, never less than the busiest step.
    busiest = max(sum(t.nbytes for t in tensors if t.first <= s <= t.last) for s in range(46))
    assert busiest <= plan.peak_bytes < plan.total_bytes


def test_a_chain_reuses_two_buffers() -> None:
    chain = [Lifetime(f"t{i}", 1000, i, i + 1) for i in range(10)]
    plan = plan_arena(chain)
    assert plan.peak_bytes == 2 * 1024
    assert plan_arena([]).peak_bytes == 0


def _compiled(model: onnx.ModelProto, tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                         record_wanted=False)


@pytest.mark.parametrize("make", [resnet_model, mobilenet_model, bert_layer_model],
                         ids=["resnet", "mobilenet", "bert_layer"])
def test_models_run_natively_and_match_the_reference(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = make()
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    program = NativeProgram.build(compiled.graph, compiled.kernels, feeds)
    assert program.native_steps == len(compiled.graph.kernel_nodes)
    assert 0 < program.arena_bytes <= program.unplanned_bytes
    # Constants read in place (biases, depthwise weights) start on a line, as the arena does.
    constants = list(program._constants.values())
    assert constants and all(address_of(c) % ALIGN == 0 for c in constants)
    reference = compiled.run(feeds)
    for seed in (0, 1):  # runs are independent: nothing stale is left in the arena
        feeds = random_feeds(model, seed)
        got = program.run(feeds)
        assert_close(got, ort_run(model, feeds), [o.name for o in model.graph.output])
    again = program.run(random_feeds(model, 0))
    for name, value in reference.items():
        np.testing.assert_array_equal(again[name], value)


def test_outputs_are_fresh_arrays_and_views_cost_nothing(tmp_path: Path) -> None:
    b = Builder(13)
    x = b.input("x", [2, 6])
    h = b.node("MatMul", [x, b.weight(6, 8)], name="mm1")
    flat = b.node("Reshape", [h, b.const(np.array([4, 4], dtype=np.int64))])
    back = b.node("Reshape", [flat, b.const(np.array([2, 8], dtype=np.int64))])
    y = b.node("MatMul", [back, b.weight(8, 3)], name="mm2")
    model = b.model([y, flat])
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    program = NativeProgram.build(compiled.graph, compiled.kernels, feeds)
    assert (program.native_steps, program.numpy_steps, program.segments) == (2, 0, 1)
    first = program.run(feeds)
    assert_close(first, ort_run(model, feeds), [y, flat])
    kept = {k: v.copy() for k, v in first.items()}
    program.run(random_feeds(model, 3))
    for name, value in kept.items():
        np.testing.assert_array_equal(first[name], value)  # not overwritten by a later run


def test_shapes_other_than_planned_are_refused(tmp_path: Path) -> None:
    model = bert_layer_model()
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    program = NativeProgram.build(compiled.graph, compiled.kernels, feeds)
    with pytest.raises(ModelError, match=r"planned for|expects"):
        program.run({k: np.concatenate([v, v]) for k, v in feeds.items()})


def test_loaded_shapes_plan_the_program_without_a_traced_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph as the loader left it knows every tensor's shape: the program is planned
    from them (no reference run); a graph rewritten by layout planning (blocked
    activations, on machines with vectors) is traced."""
    from tunecache.compiler.native import program as native

    model = bert_layer_model()
    compiled = _compiled(model, tmp_path)
    assert compiled.graph.tensors
    traced = []
    real = native._trace
    monkeypatch.setattr(native, "_trace", lambda *a: traced.append(1) or real(*a))
    feeds = random_feeds(model)
    program = NativeProgram.build(compiled.graph, compiled.kernels, feeds)
    assert not traced
    assert_close(program.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])
    (tmp_path / "cnn").mkdir()
    cnn = _compiled(resnet_model(), tmp_path / "cnn")
    feeds = random_feeds(resnet_model())
    program = NativeProgram.build(cnn.graph, cnn.kernels, feeds)
    assert len(traced) == (0 if cnn.graph.tensors else 1)  # blocked layouts: traced
    model = resnet_model()
    assert_close(program.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])


@pytest.mark.parametrize("make", [resnet_model, bert_layer_model], ids=["resnet", "bert_layer"])
def test_outputs_are_written_in_place_into_fresh_arrays(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A graph output's producer writes the array the run returns (no copy out of the
    arena); each run returns new arrays, and a later run leaves earlier results alone."""
    model = make()
    compiled = _compiled(model, tmp_path)
    program = NativeProgram.build(compiled.graph, compiled.kernels, random_feeds(model))
    first = program.run(random_feeds(model, 0))
    kept = {name: array.copy() for name, array in first.items()}
    second = program.run(random_feeds(model, 1))
    for name, array in first.items():
        np.testing.assert_array_equal(array, kept[name])
        assert not np.may_share_memory(array, second[name])
        assert not np.may_share_memory(array, program._arena)
        assert program.arena_range(name) is not None  # planned: its producer wrote it there


def test_two_outputs_on_one_buffer_are_returned_as_separate_arrays(tmp_path: Path) -> None:
    """An output and a view of it share one output buffer: the first is handed the buffer,
    the other a copy, so no two returned arrays alias."""
    b = Builder(13)
    x = b.input("x", [2, 6])
    h = b.node("MatMul", [x, b.weight(6, 8)], name="mm")
    flat = b.node("Reshape", [h, b.const(np.array([4, 4], dtype=np.int64))])
    model = b.model([h, flat])
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    program = NativeProgram.build(compiled.graph, compiled.kernels, feeds)
    got = program.run(feeds)
    assert_close(got, ort_run(model, feeds), [h, flat])
    assert program.arena_range(h) == program.arena_range(flat)  # one slot for both
    assert not np.may_share_memory(got[h], got[flat])
    got[h][...] = 0.0  # the caller owns each array
    assert np.abs(got[flat]).max() > 0


def test_a_profile_times_every_step_where_it_runs(tmp_path: Path) -> None:
    """One entry per step in run order, each named by its node and op and placed where it
    runs (a kernel, a runner copy, a numpy bridge); profiling leaves the outputs as they
    were."""
    b = Builder(13)
    x = b.input("x", [64, 32])
    y = b.node("Relu", [b.node("MatMul", [x, b.weight(32, 48)], name="mm")])
    t = b.node("Transpose", [y], perm=[1, 0], name="tr")
    model = b.model([b.node("ReduceProd", [t], axes=[1], keepdims=1, name="prod"),
                     b.node("Floor", [t], name="floor")])
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    expected = compiled.run(feeds)
    profile = compiled.profile(feeds, runs=4)
    program = compiled.program
    assert program is not None and profile.runs == 4
    assert len(profile.steps) == program.native_steps + program.numpy_steps
    assert [(s.index, s.step.node, s.step.op, s.step.where) for s in profile.steps] == [
        (0, "mm", "matmul", "kernel"), (1, "tr", "Transpose", "copy"),
        (2, "prod", "ReduceProd", "numpy"), (3, "floor", "Floor", "numpy")]
    assert all(s.seconds > 0 for s in profile.steps)
    assert profile.outside_seconds >= 0 and profile.run_seconds > 0
    assert set(profile.seconds_by("where")) == {"kernel", "copy", "numpy"}
    assert sum(profile.seconds_by("op").values()) == pytest.approx(profile.step_seconds)
    assert profile.top(1)[0].seconds == max(s.seconds for s in profile.steps)
    assert_close(compiled.run(feeds), list(expected.values()), list(expected))


def test_a_profile_of_the_reference_executor_is_refused(tmp_path: Path) -> None:
    model = mobilenet_model()
    compiled = _compiled(model, tmp_path)
    compiled.native = False
    with pytest.raises(TunecacheError, match="native program"):
        compiled.profile(random_feeds(model), runs=1)


def test_a_one_segment_program_runs_float32_inputs_in_one_call(tmp_path: Path) -> None:
    """Contiguous float32 inputs of the planned shapes take the direct path (one native
    call, fresh outputs); any other form of the same inputs takes the general path and
    gives the same outputs; a program with a numpy step has no direct path."""
    model = mobilenet_model()
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    expected = compiled.run(feeds)
    program = compiled.program
    assert program is not None and program._direct is not None
    names = list(expected)
    first = program.run(feeds)
    second = program.run(feeds)
    assert_close(first, list(expected.values()), names)
    assert all(not np.shares_memory(first[n], second[n]) for n in names)
    (name, array), = feeds.items()
    strided = np.repeat(array, 2, axis=-1)[..., ::2]
    assert program._run_direct({name: strided}) is None
    for given in ([array], {name: strided}):
        assert_close(program.run(given), list(expected.values()), names)
    for wrong, message in ((array[..., :-1].copy(), "shape"),
                           (array.astype(np.float64), "dtype")):
        assert program._run_direct({name: wrong}) is None
        with pytest.raises(ModelError, match=message):
            program.run({name: wrong})
    b = Builder(13)
    x = b.input("x", [8, 8])
    bridged = b.model([b.node("ReduceProd", [b.node("Relu", [x])], axes=[1], keepdims=1)])
    (tmp_path / "bridged").mkdir()
    with_numpy = _compiled(bridged, tmp_path / "bridged")
    with_numpy.run(random_feeds(bridged))
    assert with_numpy.program is not None and with_numpy.program._direct is None


@pytest.mark.parametrize(("opset", "op_type", "axes", "keep"), [
    (13, "ReduceMean", [2, 3], 1), (18, "ReduceMean", [-1, -2], 0), (13, "ReduceMax", [3, 2], 0),
    (18, "ReduceMax", [2, 3], 1)])
def test_spatial_reductions_run_as_global_pooling(opset: int, op_type: str, axes: list[int],
                                                  keep: int, tmp_path: Path) -> None:
    """A mean or max over H and W, as exporters write global pooling, runs as the pool2d
    kernel (the output with or without the two unit axes); over other axes it stays numpy."""
    b = Builder(opset)
    y = b.conv(b.input("x", [2, 16, 7, 9]), 16, 16, 3)
    if opset >= 18:
        spatial = b.node(op_type, [y, b.ints(axes)], keepdims=keep)
        channels = b.node(op_type, [y, b.ints([1])], keepdims=1)
    else:
        spatial = b.node(op_type, [y], axes=axes, keepdims=keep)
        channels = b.node(op_type, [y], axes=[1], keepdims=1)
    model = b.model([b.node("Relu", [spatial]), b.node("Relu", [channels])])
    compiled = _compiled(model, tmp_path)
    feeds = random_feeds(model)
    names = [o.name for o in model.graph.output]
    assert_close(compiled.run(feeds), ort_run(model, feeds), names)
    assert [e.op.kind for e in compiled.plan].count("pool2d") == 1
    assert compiled.program is not None and compiled.program.numpy_steps == 1


def test_numpy_steps_run_with_blas_on_one_thread(tmp_path: Path) -> None:
    """While a program runs numpy steps, numpy's BLAS is held to one thread (its threads
    would fight our kernels' spinning workers for the cores), and released after."""
    from threadpoolctl import threadpool_info

    from tunecache.compiler.native import program as native_program

    seen: list[int] = []
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("numpy has no BLAS that threadpoolctl controls here")
    before = blas[0]["num_threads"]
    original = native_program.single_threaded_blas

    class Watched:
        def __enter__(self) -> None:
            self.inner = original()
            self.inner.__enter__()
            seen.append(next(i for i in threadpool_info()
                             if i["user_api"] == "blas")["num_threads"])

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], "r",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)],
                                   ir_version=8)
    compiled = _compiled(model, tmp_path)
    native_program.single_threaded_blas = Watched  # type: ignore[assignment]
    try:
        compiled.run({"x": np.ones((1, 2, 4, 4), np.float32)})
    finally:
        native_program.single_threaded_blas = original
    assert seen == [1]
    assert next(i for i in threadpool_info() if i["user_api"] == "blas")["num_threads"] == before
