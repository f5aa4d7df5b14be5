"""The CNN zoo of ``benchmarks/cnn_zoo.py`` compiled end to end (analytic schedules, real
generated kernels) against onnxruntime, at a small input size: every network family's
layers (bottlenecks, ReLU6 as Clip, dense concatenations, inception branches, fire modules,
channel shuffle, LRN, squeeze-excitation with SiLU) load, fold, build and agree within
rtol = atol = 1e-4 of the output's scale (max |reference|)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from cnn_zoo import _INCEPTIONS, MIN_SIZE, PUBLISHED_PARAMS, ZOO, param_count  # noqa: E402
from onnx_support import assert_close, ort_run, random_feeds  # noqa: E402

from tunecache.cache.store import Store  # noqa: E402
from tunecache.compiler.frontend import load_graph  # noqa: E402
from tunecache.tuner.deploy import compile_model  # noqa: E402

SIZE = 32
"""Input size for the comparison: every model's pooling chain allows 32 but AlexNet's."""

XFAIL: dict[str, str] = {}
"""Zoo models tunecache cannot compile yet, with the reason it gives."""

CI_SUBSET = ("squeezenet1_1", "shufflenet_v2", "alexnet_lrn", "mobilenet_v3_small")
"""Families whose ops no other test covers (fire modules with ceil-mode pooling, channel
split and shuffle, LRN and grouped convs, HardSwish and HardSigmoid epilogues with
squeeze-excitation): compiled on every run. The others
(about 40 more distinct kernels each to build, minutes on a 2-core machine) run with
``TUNECACHE_TEST_ZOO=all`` and in ``benchmarks/model_zoo_latency.py``."""


def _zoo_cases() -> list[Any]:
    everything = os.environ.get("TUNECACHE_TEST_ZOO") == "all"
    cases = []
    for key in ZOO:
        marks = [pytest.mark.xfail(reason=XFAIL[key], strict=True)] if key in XFAIL else []
        if not everything and key not in CI_SUBSET:
            marks.append(pytest.mark.skip(reason="set TUNECACHE_TEST_ZOO=all"))
        cases.append(pytest.param(key, marks=marks))
    return cases


def _size(key: str) -> int:
    return max(SIZE, MIN_SIZE.get(key, SIZE))


def _bn_after_conv(model: Any) -> int:
    """BatchNormalization nodes whose input is a Conv's output (the frontend folds these)."""
    conv_outputs = {n.output[0] for n in model.graph.node if n.op_type == "Conv"}
    return sum(n.op_type == "BatchNormalization" and n.input[0] in conv_outputs
               for n in model.graph.node)


@pytest.mark.slow
@pytest.mark.parametrize("key", _zoo_cases())
def test_zoo_model_matches_onnxruntime(key: str, tmp_path: Path) -> None:
    model = ZOO[key](_size(key))
    path = tmp_path / f"{key}.onnx"
    onnx.save(model, path)

    graph = load_graph(path)
    ops = [n.op_type for n in model.graph.node]
    assert not [s.name for s in graph.onnx_nodes if s.op_type == "BatchNormalization"]
    # every BN a conv does not fold is an elementwise kernel of its own (mul+add, ...)
    bn_names = {n.name for n in model.graph.node if n.op_type == "BatchNormalization"}
    bn_kernels = sum(k.op.kind == "elementwise" and k.nodes[0] in bn_names
                     for k in graph.kernel_nodes)
    assert bn_kernels == ops.count("BatchNormalization") - _bn_after_conv(model)
    conv_kernels = sum(k.op.kind == "conv2d" for k in graph.kernel_nodes)
    assert conv_kernels == ops.count("Conv")

    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             record_wanted=False)
    assert set(compiled.kernels) == {k.name for k in compiled.graph.kernel_nodes}
    feeds = random_feeds(model)
    expected = ort_run(model, feeds)
    got = compiled.run(feeds)
    scale = max(float(np.max(np.abs(e))) for e in expected)
    assert np.isfinite(scale) and scale > 0
    names = [o.name for o in model.graph.output]
    assert_close({n: got[n] / scale for n in names}, [e / scale for e in expected], names,
                 rtol=1e-4, atol=1e-4)


# Inputs of the first fully connected layer at 224, for the nets whose classifier takes the
# last pooling's whole output (their published counts hold at 224 only).
_FC_INPUTS_224 = {"vgg16": 512 * 7 * 7, "alexnet_lrn": 256 * 6 * 6}


@pytest.mark.parametrize("key", list(ZOO))
def test_zoo_model_has_published_parameter_count(key: str) -> None:
    model = ZOO[key](_size(key))
    expected = PUBLISHED_PARAMS[key]
    if key == "googlenet":  # the paper's 5x5 kernels where torchvision has 3x3
        expected += 16 * sum(r5 * c5 for _, _, _, _, r5, c5, _ in _INCEPTIONS)
    if key in _FC_INPUTS_224:
        fc = next(n for n in model.graph.node if n.op_type == "Gemm")
        (weight,) = [i for i in model.graph.initializer if i.name == fc.input[1]]
        expected -= (_FC_INPUTS_224[key] - weight.dims[1]) * 4096
    assert param_count(model) == expected


def test_latency_script_without_openvino_prints_install_hint(tmp_path: Path) -> None:
    blocker = tmp_path / "openvino"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('openvino blocked by the test')\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "model_zoo_latency.py"), "--no-write"],
        capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: OpenVINO is not installed")
    assert "pip install" in lines[0]


def test_latency_script_rejects_unknown_model() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "model_zoo_latency.py"), "--only", "lenet",
         "--no-write"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --only 'lenet' names no single zoo model; choose from "
        + ", ".join(ZOO)]


def _latency_args(repeat: int) -> Any:
    import argparse

    return argparse.Namespace(zoo="cnn", size=SIZE, repeat=repeat, tune=0, rounds=1)


def test_lockstep_times_every_engine_in_the_same_rounds(tmp_path: Path) -> None:
    """Two engines open at once in their own processes, one inference each per round: each
    round has a time from both, the latency is the engine's median, the outputs agree."""
    import model_zoo_latency as zoo

    args = _latency_args(repeat=4)
    np.savez(tmp_path / "squeezenet1_1-feeds.npz", **zoo._prepare(args, "squeezenet1_1",
                                                                   tmp_path))
    got = zoo._lockstep(("onnxruntime", "tunecache"), "squeezenet1_1", 1, args, tmp_path)
    for engine, m in got.items():
        assert not m.error, (engine, m.error)
        assert len(m.rounds) == 4 and all(t > 0 for t in m.rounds)
        assert m.ms == pytest.approx(float(np.median(m.rounds)), rel=1e-6)
        assert m.rss_mib > 0
    assert got["tunecache"].arena_mib > 0
    assert got["tunecache"].kernel_pct > 0
    assert zoo._rel_err(tmp_path, "squeezenet1_1", "tunecache", 1) <= 1e-4
    ratio = zoo.paired_ratio(got["tunecache"], (got["onnxruntime"],))
    per_round = [a / b for a, b in zip(got["tunecache"].rounds, got["onnxruntime"].rounds,
                                               strict=True)]
    assert ratio == pytest.approx(float(np.median(per_round)))


def test_lockstep_reports_an_engine_that_fails_to_open_as_a_value(tmp_path: Path) -> None:
    import model_zoo_latency as zoo

    args = _latency_args(repeat=2)
    np.savez(tmp_path / "broken-feeds.npz", image=np.zeros((1, 3, SIZE, SIZE), np.float32))
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx model")
    got = zoo._lockstep(("onnxruntime",), "broken", 1, args, tmp_path)
    assert got["onnxruntime"].error
    assert len(got["onnxruntime"].rounds) == 2
    assert all(np.isnan(t) for t in got["onnxruntime"].rounds)
