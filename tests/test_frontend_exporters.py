"""Models as users export them: transformers' BERT, GPT-2, Llama and ViT (tiny, random
weights; the decoders also as a decode step with past keys and values), through
torch.onnx.export's TorchScript path (opset 17) and dynamo path (opset 18), with symbolic
batch and sequence axes. The fixtures in tests/data/exporters come from
tools/export_fixtures.py; each must load, compile and match onnxruntime. Also the ops those
exports need, each against onnxruntime."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx
from onnx_support import F32, I64, Builder, assert_close, ort_run

from tunecache.cache.store import Store
from tunecache.compiler.executor import Executor
from tunecache.compiler.frontend import ModelInfo, inspect_model, load_graph
from tunecache.tuner.deploy import CompiledModel, compile_model

DATA = Path(__file__).parent / "data" / "exporters"
MODELS = ("bert", "gpt2", "gpt2_past", "llama", "llama_past", "vit")
PATHS = {"torchscript17": 17, "dynamo18": 18}
FIXTURES = [f"{m}_{p}" for m in MODELS for p in PATHS]
VOCAB = 100
# Ops of the shape computations the exporters emit: none may survive folding.
SHAPE_ONLY_OPS = {"Shape", "Size", "ConstantOfShape", "Range", "Equal", "GatherElements",
                  "Cos", "Sin"}


def exporter_feeds(info: ModelInfo, batch: int, seq: int, past: int = 3,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for a fixture: token ids, a mask with one padded position, past keys and
    values of ``past`` positions, or images."""
    rng = np.random.default_rng(seed)
    has_past = any(i.name.startswith("past.") for i in info.inputs)
    feeds: dict[str, np.ndarray] = {}
    for i in info.inputs:
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
        elif i.name == "attention_mask":
            mask = np.ones((batch, seq + (past if has_past else 0)), np.int64)
            mask[0, 0] = 0
            feeds[i.name] = mask
        elif i.name.startswith("past."):
            feeds[i.name] = rng.standard_normal((batch, i.shape[1], past, i.shape[3])).astype(
                np.float32)
        else:
            feeds[i.name] = rng.standard_normal((batch, *i.shape[1:])).astype(np.float32)
    return feeds


def check(ours: Mapping[str, np.ndarray], model: onnx.ModelProto,
          feeds: Mapping[str, np.ndarray]) -> None:
    assert_close(ours, ort_run(model, feeds), [o.name for o in model.graph.output])


def checked_runs(name: str, tmp_path: Path, shapes: Sequence[tuple[int, int]]
                 ) -> Iterator[tuple[CompiledModel, dict[str, np.ndarray], int, int]]:
    """Compile fixture ``name`` and run it at each ``(batch, seq)`` on :func:`exporter_feeds`
    (seeded ``batch + seq``), checking its outputs against onnxruntime's; yields the compiled
    model, the feeds, ``batch`` and ``seq`` after each checked run."""
    path = DATA / f"{name}.onnx"
    model = onnx.load(str(path))
    compiled = compile_model(path, store=Store(tmp_path), policy="analytic")
    assert compiled.info is not None
    for batch, seq in shapes:
        feeds = exporter_feeds(compiled.info, batch, seq, seed=batch + seq)
        check(compiled.run(feeds), model, feeds)
        yield compiled, feeds, batch, seq


def test_fixtures_are_all_there_and_small() -> None:
    sizes = {name: (DATA / f"{name}.onnx").stat().st_size for name in FIXTURES}
    assert max(sizes.values()) < 300 * 1024, sizes
    assert sum(sizes.values()) < 3 * 1024 * 1024
    for name in FIXTURES:
        model = onnx.load(str(DATA / f"{name}.onnx"), load_external_data=False)
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        assert opset == PATHS[name.rsplit("_", 1)[1]], name


@pytest.mark.parametrize("name", FIXTURES)
def test_compiles_and_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    path = DATA / f"{name}.onnx"
    compiled = compile_model(path, store=Store(tmp_path), policy="analytic")
    assert compiled.info is not None and compiled.info.dynamic
    feeds = exporter_feeds(compiled.info, batch=2, seq=5)
    check(compiled.run(feeds), onnx.load(str(path)), feeds)
    [stats] = compiled.shape_stats()
    assert stats.kernel_nodes > 0
    assert stats.inputs == {k: v.shape for k, v in feeds.items()}


@pytest.mark.parametrize(("name", "gelu"), [("bert_torchscript17", "gelu_erf"),
                                            ("vit_dynamo18", "gelu_erf"),
                                            ("gpt2_torchscript17", "gelu_tanh")])
def test_the_ffn_gelu_runs_in_the_matmul_epilogue(name: str, gelu: str, tmp_path: Path) -> None:
    """The exported GELU after the FFN's first matmul (+ bias) fuses into that matmul, also
    through GPT-2's Reshape between them: no GELU kernel of its own is left, and the model
    still matches onnxruntime."""
    [(compiled, feeds, _, _)] = checked_runs(name, tmp_path, [(2, 5)])
    plan = compiled.prepare({k: v.shape for k, v in feeds.items()}).plan
    kinds = {(e.op.kind, e.op.epilogue) for e in plan}
    assert any(kind == "matmul" and gelu in epi for kind, epi in kinds), kinds
    assert not any(kind == "elementwise" and gelu in epi for kind, epi in kinds), kinds


@pytest.mark.parametrize("name", FIXTURES)
def test_shape_only_subgraphs_fold_away(name: str) -> None:
    path = DATA / f"{name}.onnx"
    model = onnx.load(str(path))
    exported = {n.op_type for n in model.graph.node}
    assert exported & SHAPE_ONLY_OPS, "the export has shape computations to fold"
    info = inspect_model(path)
    feeds = exporter_feeds(info, batch=3, seq=4, past=2)
    graph = load_graph(path, {k: v.shape for k, v in feeds.items()})
    assert not {n.op_type for n in graph.onnx_nodes} & SHAPE_ONLY_OPS
    check(Executor(graph).run(feeds), model, feeds)


# -- the ops the exports need, one node each, against onnxruntime ---------------------------


def _single(op: str, inputs: list[tuple[str, np.ndarray]], opset: int = 18,
            **attrs: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    b = Builder(opset)
    names = []
    feeds = {}
    for name, value in inputs:
        dtype = {np.dtype(np.float32): F32, np.dtype(np.int64): I64,
                 np.dtype(np.bool_): onnx.TensorProto.BOOL}[value.dtype]
        names.append(b.input(name, list(value.shape), dtype))
        feeds[name] = value
    out = b.node(op, names, name="under_test", **attrs)
    model = b.model([out])
    # The output's element type follows from the op; let onnxruntime infer it.
    model.graph.output[0].type.tensor_type.elem_type = 0
    return onnx.shape_inference.infer_shapes(model), feeds


RNG = np.random.default_rng(7)
SPECIAL = np.array([[np.nan, np.inf, -np.inf, 0.0], [1.5, -2.0, np.nan, 3.0]], np.float32)
DATA_3D = RNG.standard_normal((2, 3, 4)).astype(np.float32)
OP_CASES: dict[str, tuple[str, list[tuple[str, np.ndarray]], dict[str, Any]]] = {
    "isnan": ("IsNaN", [("x", SPECIAL)], {}),
    "isinf": ("IsInf", [("x", SPECIAL)], {}),
    "isinf_negative_only": ("IsInf", [("x", SPECIAL)], {"detect_positive": 0}),
    "cos": ("Cos", [("x", DATA_3D)], {}),
    "sin": ("Sin", [("x", DATA_3D)], {}),
    "sign": ("Sign", [("x", SPECIAL[1:])], {}),
    "gathernd": ("GatherND", [("x", DATA_3D), ("i", np.array([[1, -1], [0, 2]], np.int64))], {}),
    "gathernd_full_index": ("GatherND", [("x", DATA_3D),
                                         ("i", np.array([[[1, 2, 3]], [[0, 0, -4]]], np.int64))],
                            {}),
    "gathernd_batch_dims": ("GatherND", [("x", DATA_3D),
                                         ("i", np.array([[[2], [0]], [[1], [1]]], np.int64))],
                            {"batch_dims": 1}),
    "gatherelements": ("GatherElements",
                       [("x", DATA_3D), ("i", np.array([[[0, 2, -1, 1]], [[1, 1, 0, -3]]],
                                                       np.int64))], {"axis": 1}),
    "trilu_upper": ("Trilu", [("x", DATA_3D), ("k", np.array(1, np.int64))], {}),
    "trilu_lower": ("Trilu", [("x", DATA_3D), ("k", np.array(-1, np.int64))], {"upper": 0}),
    "cumsum": ("CumSum", [("x", DATA_3D), ("a", np.array(1, np.int64))], {}),
    "cumsum_exclusive_reverse": ("CumSum", [("x", DATA_3D), ("a", np.array(-1, np.int64))],
                                 {"exclusive": 1, "reverse": 1}),
    "mod_int": ("Mod", [("a", np.array([7, -7, 5, -5], np.int64)),
                        ("b", np.array([3, 3, -3, -3], np.int64))], {}),
    "fmod": ("Mod", [("a", np.array([7.5, -7.5, 5.0], np.float32)),
                     ("b", np.array([2.0, 2.0, -3.0], np.float32))], {"fmod": 1}),
    "xor": ("Xor", [("a", np.array([True, False, True])), ("b", np.array([True, True, False]))],
            {}),
}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_exporter_ops_match_onnxruntime(case: str) -> None:
    op, inputs, attrs = OP_CASES[case]
    model, feeds = _single(op, inputs, **attrs)
    graph = load_graph(model)
    assert [n.op_type for n in graph.onnx_nodes] == [op]  # run, not folded
    check(Executor(graph).run(feeds), model, feeds)
