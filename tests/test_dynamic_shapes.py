"""Dynamic shapes: a model with symbolic batch/sequence axes compiles once and runs at any
shape (each planned on first use, kept in a bounded LRU, recorded as wanted); shape-only
subgraphs fold before ops are checked; the CLI takes its shapes from --inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tunecache.compiler.buffers import address_of
from tunecache.compiler.kinds.matmul import matmul_op

pytest.importorskip("onnxruntime")

from onnx_support import F32, Builder, assert_close, ort_run
from test_frontend_exporters import DATA, exporter_feeds

from tunecache.cache.store import Store
from tunecache.cache.wanted import load_wanted
from tunecache.compiler.executor import Executor
from tunecache.compiler.frontend import inspect_model, load_graph
from tunecache.compiler.graph import ModelError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.schedule import Schedule
from tunecache.tuner.deploy import CompiledModel, compile_model

LLAMA = DATA / "llama_dynamo18.onnx"
GPT2 = DATA / "gpt2_torchscript17.onnx"
LLAMA_PAST = DATA / "llama_past_torchscript17.onnx"


def count_plans(compiled: CompiledModel) -> list[dict[str, tuple[int, ...]]]:
    """Wrap ``compiled.specialise`` to log the shapes it plans."""
    planned: list[dict[str, tuple[int, ...]]] = []
    inner = compiled.specialise
    assert inner is not None

    def logged(shapes: Mapping[str, tuple[int, ...]],
               siblings: Mapping[str, Schedule]) -> CompiledModel:
        planned.append(dict(shapes))
        return inner(shapes, siblings)
    compiled.specialise = logged
    return planned


def test_compiles_once_and_runs_any_batch_and_sequence(tmp_path: Path) -> None:
    compiled = compile_model(LLAMA, store=Store(tmp_path), policy="analytic")
    assert compiled.info is not None and compiled.info.dynamic
    assert compiled.plan == []  # nothing planned before a shape is known
    planned = count_plans(compiled)
    model = onnx.load(str(LLAMA))
    shapes = [(1, 3), (2, 5), (3, 8), (1, 3)]
    for batch, seq in shapes:
        feeds = exporter_feeds(compiled.info, batch, seq, seed=batch * seq)
        assert_close(compiled.run(feeds), ort_run(model, feeds), ["logits"])
    assert [p["input_ids"] for p in planned] == [(1, 3), (2, 5), (3, 8)]
    stats = compiled.shape_stats()
    # Least recently run first; the repeated shape ran twice and was planned once.
    assert [(s.inputs["input_ids"], s.runs) for s in stats] == [((2, 5), 1), ((3, 8), 1),
                                                                ((1, 3), 2)]
    assert all(s.compile_s >= 0 and s.kernel_nodes > 0 for s in stats)
    summary = compiled.summary()
    assert summary["dynamic"] and summary["inputs"]["input_ids"] == "[batch, sequence]"
    assert len(summary["shapes"]) == 3


def test_a_profile_times_the_program_planned_for_its_inputs(tmp_path: Path) -> None:
    """A dynamic model's profile plans the inputs' shape (once) and times that program."""
    compiled = compile_model(LLAMA, store=Store(tmp_path), policy="analytic")
    assert compiled.info is not None
    planned = count_plans(compiled)
    feeds = exporter_feeds(compiled.info, 2, 5, seed=1)
    profile = compiled.profile(feeds, runs=2)
    assert [p["input_ids"] for p in planned] == [(2, 5)]
    program = compiled.prepare({"input_ids": (2, 5)}).program
    assert program is not None
    assert len(profile.steps) == program.native_steps + program.numpy_steps > 0
    assert profile.seconds_by("where").get("kernel", 0) > 0


def test_planned_shapes_are_bounded_least_recently_run_first(tmp_path: Path) -> None:
    compiled = compile_model(GPT2, store=Store(tmp_path), policy="cache-only", max_shapes=2)
    assert compiled.info is not None
    planned = count_plans(compiled)
    for seq in (2, 3, 4, 2):
        compiled.run(exporter_feeds(compiled.info, 1, seq))
    # 2 fell out when 4 came in (3 and 4 were kept), so its second run plans it again.
    assert [p["input_ids"] for p in planned] == [(1, 2), (1, 3), (1, 4), (1, 2)]
    assert compiled.evicted == 2
    assert [s.inputs["input_ids"] for s in compiled.shape_stats()] == [(1, 4), (1, 2)]


def test_each_new_shape_records_its_own_misses_as_wanted(tmp_path: Path) -> None:
    store = Store(tmp_path)
    compiled = compile_model(GPT2, store=store, policy="analytic")
    assert compiled.info is not None
    hw_id = local_spec().hw_id
    assert load_wanted(store.location, hw_id) == []
    for batch, seq in ((2, 5), (3, 7)):
        compiled.run(exporter_feeds(compiled.info, batch, seq))
        wanted = {w.op for w in load_wanted(store.location, hw_id)}
        planned = compiled.prepare({"input_ids": (batch, seq)}).plan
        assert {e.op for e in planned} <= wanted
        assert any(e.op.kind == "matmul" and e.op.dim("M") == batch * seq for e in planned)


def test_shape_given_at_compile_time_is_planned_then_others_on_first_run(tmp_path: Path) -> None:
    # input_shapes names input_ids only; attention_mask [batch, sequence] follows by name.
    compiled = compile_model(GPT2, store=Store(tmp_path), policy="cache-only",
                             input_shapes={"input_ids": [2, 4]})
    assert compiled.plan and [i.shape for i in compiled.graph.inputs] == [(2, 4), (2, 4)]
    assert compiled.info is not None
    planned = count_plans(compiled)
    model = onnx.load(str(GPT2))
    for batch, seq in ((2, 4), (1, 6)):
        feeds = exporter_feeds(compiled.info, batch, seq)
        assert_close(compiled.run(feeds), ort_run(model, feeds), ["logits"])
    assert [p["input_ids"] for p in planned] == [(1, 6)]
    assert compiled.prepare({"input_ids": (2, 4)}) is compiled


def test_decode_step_with_past_runs_at_several_lengths(tmp_path: Path) -> None:
    compiled = compile_model(LLAMA_PAST, store=Store(tmp_path), policy="cache-only")
    assert compiled.info is not None
    model = onnx.load(str(LLAMA_PAST))
    for batch, seq, past in ((1, 1, 4), (2, 1, 6), (2, 3, 2)):
        feeds = exporter_feeds(compiled.info, batch, seq, past=past)
        names = [o.name for o in model.graph.output]
        assert_close(compiled.run(feeds), ort_run(model, feeds), names)
    with pytest.raises(ModelError, match=r"the shapes of 'attention_mask' \[batch, "
                                         r"total_sequence\], .* are not determined"):
        compiled.prepare({"input_ids": (1, 1)})


def test_inputs_are_checked_against_the_declared_dims(tmp_path: Path) -> None:
    compiled = compile_model(GPT2, store=Store(tmp_path), policy="cache-only")
    ids = np.zeros((2, 3), np.int64)
    with pytest.raises(ModelError, match=r"input 'input_ids' has shape \[2, 3, 1\]; the model "
                                         r"expects \[batch, sequence\]"):
        compiled.run({"input_ids": ids[..., None], "attention_mask": ids})
    with pytest.raises(ModelError, match=r"input 'attention_mask' has dtype float32"):
        compiled.run({"input_ids": ids, "attention_mask": ids.astype(np.float32)})
    with pytest.raises(ModelError, match=r"missing 'attention_mask'.* 'input_ids' int64 "
                                         r"\[batch, sequence\]"):
        compiled.run({"input_ids": ids})
    with pytest.raises(ModelError, match=r"'ids' is not an input of"):
        compiled.prepare({"ids": (1, 2)})


# -- folding before the op check -----------------------------------------------------------


def masked_model(data_op: str | None = None) -> onnx.ModelProto:
    """x [batch, seq] plus a causal mask built from x's shape alone: Shape, Gather, Range,
    Unsqueeze, GreaterOrEqual, Concat, ConstantOfShape, Where, IsNaN, Cast, Equal, Expand, and
    an If (a subgraph op, which the executor does not run) on that shape. ``data_op`` puts an
    op of a domain tunecache does not know on the data path too."""
    b = Builder(17, seed=3)
    x = b.input("x", ["batch", "seq"])
    shape = b.node("Shape", [x])
    seq = b.node("Gather", [shape, b.ints([1])], axis=0)                        # [1]
    batch = b.node("Gather", [shape, b.ints([0])], axis=0)                      # [1]
    r = b.node("Range", [b.const(np.int64(0)), b.node("Squeeze", [seq, b.ints([0])]),
                         b.const(np.int64(1))])
    causal = b.node("GreaterOrEqual", [b.unsqueeze(r, [1]), b.unsqueeze(r, [0])])
    square = b.node("Concat", [seq, seq], axis=0)
    zeros = b.node("ConstantOfShape", [square],
                   value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)))
    mask = b.node("Where", [causal, zeros, b.const(np.float32(-1e4))])
    mask = b.node("Where", [b.node("IsNaN", [mask]), zeros, mask])
    # A float scale from the sequence length, through an If: computed from the shape only.
    length = b.node("Cast", [seq], to=F32)
    branches = {branch: helper.make_graph(
        [helper.make_node("Constant", [], [f"{branch}_out"],
                          value=onnx.numpy_helper.from_array(np.full(1, value, np.float32)))],
        branch, [], [helper.make_tensor_value_info(f"{branch}_out", F32, [1])])
        for branch, value in (("then_branch", 0.5), ("else_branch", 2.0))}
    short = b.node("Less", [seq, b.ints([4])])
    scale = b.node("Mul", [b.node("If", [b.node("Squeeze", [short])], **branches),
                           b.node("Div", [length, b.const(np.float32(100.0))])])
    same = b.node("Cast", [b.node("Equal", [batch, batch])], to=F32)
    full = b.node("Expand", [mask, b.node("Concat", [batch, seq, seq], axis=0)])
    y = b.node("Add", [b.unsqueeze(x, [1]), b.node("Mul", [full, b.node("Mul", [scale, same])])])
    if data_op:
        y = b.node(data_op, [y], name="on_data", domain="com.example")
    model = b.model([b.node("Softmax", [y], axis=-1)], "masked")
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    return model


def test_folding_removes_shape_only_subgraphs() -> None:
    model = masked_model()
    assert inspect_model(model).dynamic  # checked without shapes: the If is shape-only
    for batch, seq in ((1, 3), (2, 5), (4, 2)):
        graph = load_graph(model, {"x": [batch, seq]})
        assert [n.op_type for n in graph.onnx_nodes] == ["Unsqueeze"]
        # the mask Add and the Softmax after it: one softmax kernel with a mask row per batch
        [softmax] = graph.kernel_nodes
        assert softmax.op.kind == "softmax" and softmax.op.dim("mask_rows") == batch
        feeds = {"x": np.random.default_rng(seq).standard_normal((batch, seq)).astype(np.float32)}
        assert_close(Executor(graph).run(feeds), ort_run(model, feeds),
                     [o.name for o in model.graph.output])


def test_unsupported_op_after_folding_names_node_and_op(tmp_path: Path) -> None:
    model = masked_model(data_op="Softplus")
    message = (r"op types tunecache cannot run: 'com.example.Softplus' \(node 'on_data'\)")
    with pytest.raises(ModelError, match=message):
        load_graph(model, {"x": [2, 3]})
    with pytest.raises(ModelError, match=message):
        inspect_model(model)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match=message):  # at compile time, before any shape
        compile_model(path, store=Store(tmp_path / "s"), policy="cache-only")


# -- the CLI -------------------------------------------------------------------------------


def tunecache(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_run_takes_its_shapes_from_inputs(tmp_path: Path) -> None:
    path = DATA / "bert_dynamo18.onnx"
    feeds = exporter_feeds(inspect_model(path), batch=3, seq=6)
    npz = tmp_path / "in.npz"
    np.savez(npz, **feeds)
    out = tunecache("run", str(path), "--inputs", str(npz), "--root", str(tmp_path / "s"),
                    "--policy", "analytic", "--compare", "onnxruntime", "--repeat", "1",
                    "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["outputs"] == {"last_hidden_state": [3, 6, 32]}
    [shape] = report["shapes"]
    assert shape["inputs"] == {"input_ids": [3, 6], "attention_mask": [3, 6]}
    assert shape["compile_s"] >= 0 and shape["kernel_nodes"] > 0
    assert all(e["max_abs"] < 1e-4 for e in report["onnxruntime"]["errors"].values())


def test_cli_shape_errors_name_the_flags(tmp_path: Path) -> None:
    path = DATA / "gpt2_dynamo18.onnx"
    partial = tmp_path / "partial.npz"
    np.savez(partial, input_ids=np.zeros((1, 4), np.int64))
    root = ("--root", str(tmp_path / "s"))
    for args, fragments in [
        ((), ("--inputs FILE.npz", "--input-shape input_ids=", "[batch, sequence]")),
        (("--inputs", str(partial)), ("--inputs", "missing 'attention_mask'")),
        (("--input-shape", "ids=1,4"), ("--input-shape names 'ids'",)),
        (("--input-shape", "input_ids=1,4,1"), ("--input-shape input_ids=1,4,1",)),
    ]:
        out = tunecache("run", str(path), *root, "--policy", "cache-only", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert all(f in out.stderr for f in fragments), (args, out.stderr)
        assert "input_shapes" not in out.stderr and "Traceback" not in out.stderr


def test_cli_compile_of_a_dynamic_model_says_when_shapes_are_planned(tmp_path: Path) -> None:
    out = tunecache("compile", str(DATA / "gpt2_dynamo18.onnx"), "--root", str(tmp_path / "s"),
                    "--policy", "cache-only")
    assert out.returncode == 0, out.stderr
    assert ("have dynamic dimensions; each shape is planned on its first run; --input-shape "
            "input_ids=D1,D2,... plans one now") in out.stdout


def test_shapes_share_the_weights_and_their_packed_copies(tmp_path: Path) -> None:
    """Every shape planned from one compile reads the same weight arrays (read once from the
    file, whose proto then drops their bytes), and a weight packed in the same layout for
    two shapes is packed once: the programs point at one buffer."""
    compiled = compile_model(GPT2, store=Store(tmp_path), policy="analytic")
    assert compiled.info is not None
    model = onnx.load(str(GPT2))
    planned = []
    for batch, seq in ((1, 4), (1, 6), (2, 4)):
        feeds = exporter_feeds(compiled.info, batch, seq, seed=seq)
        assert_close(compiled.run(feeds), ort_run(model, feeds), ["logits"])
        planned.append(compiled.prepare({k: v.shape for k, v in feeds.items()}))
    first, *others = planned
    weights = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    shared = [n for n in first.graph.constants if n in weights]
    assert shared
    for other in others:
        assert all(other.graph.constants[n] is first.graph.constants[n] for n in shared)
        # every matmul's weights, the slices of the fused Q/K/V projection (split.py) too
        assert all(other.graph.constants[k.inputs[1]] is first.graph.constants[k.inputs[1]]
                   for k in other.graph.kernel_nodes if k.op.kind == "matmul")
    assert all(not a.flags.writeable for a in first.graph.constants.values())

    def packed(c: CompiledModel) -> dict[str, int]:
        program = c.program
        assert program is not None
        return {name[len("packed:"):]: address_of(array)
                for name, array in program._constants.items() if name.startswith("packed:")}

    layouts = [c._packed_layouts() for c in planned]
    buffers = [packed(c) for c in planned]
    assert buffers[0]
    same = [node for node in buffers[0] if node in buffers[1]
            and layouts[0].get(node) == layouts[1].get(node) is not None]
    assert same, "no weight kept its packed layout across the two sequence lengths"
    assert all(buffers[0][node] == buffers[1][node] for node in same)
    differ = [node for node in buffers[0] if layouts[0].get(node) != layouts[1].get(node)]
    assert all(buffers[0][node] != buffers[1][node] for node in differ)


def test_a_new_shape_shares_packed_weights_when_the_estimate_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A guess for a new shape takes the node's schedule at another planned shape when the
    guess would re-pack the weights and the sibling is estimated within the tolerance;
    never an illegal sibling, and never for a kind without packed weights."""
    from tunecache.compiler.kinds import op_kind
    from tunecache.compiler.ops import OpSignature
    from tunecache.costmodel.analytic import estimate
    from tunecache.tuner.deploy import compile as deploy
    from tunecache.tuner.deploy.policy import Decision
    from tunecache.tuner.search import candidates

    hw = local_spec()
    op = matmul_op(64, 768, 3072)
    layout = op_kind("matmul").packed_weights_layout
    assert layout is not None
    pool = [c.schedule for c in candidates(op, hw, k=10)]
    guess = pool[0]
    sibling = next(s for s in pool[1:] if layout(op, s) != layout(op, guess))
    ratio = estimate(op, sibling, hw).seconds / estimate(op, guess, hw).seconds
    decision = Decision("guess", guess, "tiler", "cache miss", estimate(op, guess, hw).seconds)

    monkeypatch.setattr(deploy, "SHARE_PACKED_TOLERANCE", ratio - 1 + 1e-9)
    shared = deploy._sharing_packed(op, decision, sibling, hw)
    assert shared.schedule == sibling and "shares the weights" in shared.reason
    monkeypatch.setattr(deploy, "SHARE_PACKED_TOLERANCE", ratio - 1 - 1e-6)
    assert deploy._sharing_packed(op, decision, sibling, hw) == decision
    illegal = sibling.replace(mr=64)
    assert deploy._sharing_packed(op, decision, illegal, hw) == decision
    rows = OpSignature.parse("layernorm(M=64,N=768,norm=layer,affine=gamma_beta)")
    row_guess = candidates(rows, hw, k=2)
    kept = Decision("guess", row_guess[0].schedule, "tiler", "cache miss", None)
    assert deploy._sharing_packed(rows, kept, row_guess[1].schedule, hw) == kept


def test_a_model_read_from_its_file_keeps_its_weights_once(tmp_path: Path) -> None:
    """Once the first load has read the weights into arrays, the source's proto is a slim
    copy without their bytes (a cleared field's bytes would stay in the original message's
    arena), and later loads at other shapes share the arrays and still run right."""
    from tunecache.compiler.frontend import read_model

    model = onnx.load(str(LLAMA))
    weights = sum(i.ByteSize() for i in model.graph.initializer)
    source = read_model(LLAMA)
    original = source.model
    first = load_graph(source, {"input_ids": (1, 3), "attention_mask": (1, 3)})
    assert source.model is not original
    assert sum(i.ByteSize() for i in source.model.graph.initializer) < weights // 10
    second = load_graph(source, {"input_ids": (2, 5), "attention_mask": (2, 5)})
    shared = [n for n, a in first.constants.items() if a.size >= 1024]
    assert shared and all(second.constants[n] is first.constants[n] for n in shared)
    compiled = compile_model(LLAMA, store=Store(tmp_path), policy="analytic")
    feeds = exporter_feeds(compiled.info, 2, 5, seed=1)
    assert_close(compiled.run(feeds), ort_run(model, feeds), ["logits"])
