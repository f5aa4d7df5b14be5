"""LSTM, GRU and RNN unrolled into matmul and element-wise kernels match onnxruntime in
every direction and layout, with and without initial states, biases and peepholes; the
forms left to the reference still run and match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import ort_run

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.compiler.graph import ModelError
from tunecache.tuner.deploy import compile_model

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
SEQ, BATCH, INPUT, HIDDEN = 5, 2, 6, 4


def _model(op: str, *, directions: int = 1, layout: int = 0, bias: bool = True,
           initial: bool = False, peepholes: bool = False, outputs: int = 3,
           **attrs: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(GATES[op] + directions + layout)
    rows = GATES[op] * HIDDEN
    inits = {"W": rng.standard_normal((directions, rows, INPUT)),
             "R": rng.standard_normal((directions, rows, HIDDEN)) * 0.5}
    if bias:
        inits["B"] = rng.standard_normal((directions, 2 * rows))
    if peepholes:
        inits["P"] = rng.standard_normal((directions, 3 * HIDDEN))
    x_shape = [BATCH, SEQ, INPUT] if layout else [SEQ, BATCH, INPUT]
    state = [BATCH, directions, HIDDEN] if layout else [directions, BATCH, HIDDEN]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    names = ["x", "W", "R", "B" if bias else "", "", "", "", "P" if peepholes else ""]
    if initial:
        names[5] = "h0"
        feeds["h0"] = rng.standard_normal(state).astype(np.float32)
        if op == "LSTM":
            names[6] = "c0"
            feeds["c0"] = rng.standard_normal(state).astype(np.float32)
        graph_inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, state)
                         for n in names[5:7] if n]
    while names and not names[-1]:
        names.pop()
    outs = ["y", "y_h", "y_c"][:outputs if op == "LSTM" else min(outputs, 2)]
    direction = {1: "forward", 2: "bidirectional"}[directions]
    node = helper.make_node(op, names, outs, hidden_size=HIDDEN, layout=layout,
                            direction=attrs.pop("direction", direction), **attrs)
    graph = helper.make_graph(
        [node], "rnn", graph_inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)],
                              ir_version=8)
    return model, feeds


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path,
           unrolled: bool = True) -> None:
    op = model.graph.node[0].op_type
    graph = load_graph(model)
    assert (op not in {n.op_type for n in graph.onnx_nodes}) == unrolled
    if unrolled:
        assert "matmul" in {k.op.kind for k in graph.kernel_nodes}
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    got = compiled.run(feeds)
    try:
        expected = ort_run(model, feeds)
    except Exception:  # onnxruntime runs no batch-first layer (layout 1): the reference
        from onnx.reference import ReferenceEvaluator

        expected = ReferenceEvaluator(model).run(None, feeds)
    for name, want in zip([o.name for o in model.graph.output], expected, strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


CASES: dict[str, dict[str, Any]] = {
    "forward": {}, "bidirectional": {"directions": 2}, "reverse": {"direction": "reverse"},
    "batch-first": {"layout": 1, "directions": 2, "initial": True},
    "initial-states": {"initial": True}, "no-bias": {"bias": False},
    "only-y": {"outputs": 1},
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("op", sorted(GATES))
def test_unrolled_layers_match_onnxruntime(op: str, case: str, tmp_path: Path) -> None:
    model, feeds = _model(op, **CASES[case])
    _check(model, feeds, tmp_path)


def test_lstm_peepholes(tmp_path: Path) -> None:
    model, feeds = _model("LSTM", peepholes=True, directions=2, initial=True)
    _check(model, feeds, tmp_path)


@pytest.mark.parametrize("before_reset", [0, 1])
def test_gru_reset_forms(before_reset: int, tmp_path: Path) -> None:
    model, feeds = _model("GRU", linear_before_reset=before_reset, initial=True)
    _check(model, feeds, tmp_path)


def test_rnn_relu_activation(tmp_path: Path) -> None:
    model, feeds = _model("RNN", activations=["Relu"])
    _check(model, feeds, tmp_path)


@pytest.mark.parametrize("op", sorted(GATES))
def test_clip_bounds_every_activation_input(op: str, tmp_path: Path) -> None:
    model, feeds = _model(op, clip=0.5, directions=2)
    _check(model, feeds, tmp_path)


def test_lstm_input_forget(tmp_path: Path) -> None:
    model, feeds = _model("LSTM", input_forget=1, initial=True)
    _check(model, feeds, tmp_path)


def test_weights_given_as_inputs_run_in_the_reference(tmp_path: Path) -> None:
    """Not unrollable (the weights are not constants), and a form the reference gets right."""
    model, feeds = _model("GRU", directions=2)
    w = model.graph.initializer[0]
    feeds["W"] = numpy_helper.to_array(w)
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT,
                                                           list(w.dims)))
    del model.graph.initializer[0]
    _check(model, feeds, tmp_path, unrolled=False)


def _with_lengths(model: onnx.ModelProto, lengths: np.ndarray | None) -> onnx.ModelProto:
    """``model`` whose node reads ``sequence_lens``: a constant, or a graph input (None)."""
    node = model.graph.node[0]
    node.input[4:] = ["lengths"]
    if lengths is None:
        model.graph.input.append(helper.make_tensor_value_info(
            "lengths", TensorProto.INT32, [BATCH]))
    else:
        model.graph.initializer.append(numpy_helper.from_array(lengths, "lengths"))
    return model


@pytest.mark.parametrize("attrs", [{"activations": ["HardSigmoid", "Tanh", "Tanh"]},
                                   {"lengths": np.array([SEQ, 2], np.int32)}],
                         ids=["hard-sigmoid", "short-sequence"])
def test_forms_the_reference_gets_wrong_are_refused(attrs: dict[str, Any],
                                                    tmp_path: Path) -> None:
    """onnx.reference ignores these, so rather than a wrong answer: one error naming them."""
    lengths = attrs.pop("lengths", None)
    model, _ = _model("LSTM", **attrs)
    if lengths is not None:
        model = _with_lengths(model, lengths)
    with pytest.raises(ModelError, match=r"node .*\(LSTM\): (activations|sequence_lens)"):
        load_graph(model)


def test_lengths_given_at_run_time_must_be_whole(tmp_path: Path) -> None:
    """sequence_lens as a graph input: the reference runs the layer, and a run whose lengths
    are not the whole sequence fails naming them instead of answering wrongly."""
    model, feeds = _model("LSTM", directions=2)
    model = _with_lengths(model, None)
    feeds["lengths"] = np.full(BATCH, SEQ, np.int32)
    _check(model, feeds, tmp_path, unrolled=False)
    compiled = compile_model(tmp_path / "m.onnx", store=Store(tmp_path / "s"),
                             policy="analytic")
    feeds["lengths"] = np.array([SEQ, 3], np.int32)
    with pytest.raises(ModelError, match=r"sequence_lens \[5, 3\] shorter than the sequence"):
        compiled.run(feeds)
