"""Per-layer time of a compiled CNN against onnxruntime's, the two interleaved in one process.

On a VM whose core shares its FMA units with a neighbour's hyperthread, a whole model's
latency moves by 20-40% between minutes, so per-engine processes timed minutes apart cannot
say which layer is slower. This runs both in one process, alternating one inference of each:
ours through :meth:`CompiledModel.profile` (each step of the native program timed inside the
runner), onnxruntime's with its node profiler on. Each convolution is matched to the
onnxruntime node that ends its fused chain (Conv, BatchNormalization, Relu, Add), and the
table lists per layer the medians and ours ÷ onnxruntime, the largest losses first.

    python benchmarks/layers_vs_onnxruntime.py [--model resnet50] [--threads 1] [--runs 40]
        [--policy analytic] [--store PATH] [--no-write]

``--store`` compiles against a tuned store (``tunecache tune --model``) instead of an empty
one, so the table shows where a tuned model still loses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import git_revision, machine_summary, write_section  # noqa: E402
from cnn_zoo import ZOO  # noqa: E402

FUSED_TAILS = ("BatchNormalization", "Relu", "Add", "Clip")


@dataclass(frozen=True, slots=True)
class Layer:
    """One convolution: its node, a short shape, and both engines' median milliseconds."""

    node: str
    shape: str
    ours_ms: float
    ort_ms: float


def _ort_node(consumers: Mapping[str, list[onnx.NodeProto]], conv: onnx.NodeProto,
              names: set[str]) -> str | None:
    """The onnxruntime node name that ends ``conv``'s fused chain: onnxruntime names a
    fused NCHWc node after its last output, with ``_nchwc`` appended."""
    out = conv.output[0]
    for _ in range(len(FUSED_TAILS) + 1):
        if out + "_nchwc" in names:
            return out + "_nchwc"
        following = consumers.get(out, [])
        if len(following) != 1 or following[0].op_type not in FUSED_TAILS:
            return None
        out = following[0].output[0]
    return None


def _shape(conv: onnx.NodeProto, weights: Mapping[str, list[int]],
           dims: Mapping[str, list[int]]) -> str:
    f, c, r, s = weights[conv.input[1]]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    group, stride = attrs.get("group", 1), attrs.get("strides", [1, 1])[0]
    h, w = dims.get(conv.input[0], [0, 0, 0, 0])[2:4]
    return f"{c * group}x{h}x{w} -> {f}, {r}x{s}/{stride}" + (f" g{group}" if group > 1 else "")


def measure(key: str, threads: int, runs: int, policy: str,
            store: Path | None = None) -> list[Layer]:
    """Both engines' per-layer medians over ``runs`` alternating inferences."""
    import onnxruntime as ort

    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.tuner.deploy import compile_model

    work = Path(tempfile.mkdtemp(prefix="layers_"))
    model = onnx.shape_inference.infer_shapes(ZOO[key](224))
    path = work / f"{key}.onnx"
    onnx.save(model, path)
    hw = replace(local_spec(), cores=threads)
    ours = compile_model(path, store=Store(store or work / "store"), policy=policy,
                         record_wanted=False, hw=hw)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling, options.profile_file_prefix = True, str(work / "ort")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0]
    feeds = {first.name: np.random.default_rng(0).standard_normal(first.shape)
             .astype(np.float32)}
    for _ in range(3):
        session.run(None, feeds)
    steps: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        for step in ours.profile(feeds, runs=1).steps:
            steps[step.step.node].append(step.seconds * 1e3)
        session.run(None, feeds)
    nodes: dict[str, list[float]] = defaultdict(list)
    for event in json.loads(Path(session.end_profiling()).read_text()):
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            nodes[name.removesuffix("_kernel_time")].append(event["dur"] / 1e3)
    return _layers(model, steps, {k: v[3:] for k, v in nodes.items()})


def _layers(model: onnx.ModelProto, steps: Mapping[str, list[float]],
            nodes: Mapping[str, list[float]]) -> list[Layer]:
    graph = model.graph
    convs = {n.name: n for n in graph.node if n.op_type == "Conv"}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    weights = {t.name: list(t.dims) for t in graph.initializer}
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*graph.value_info, *graph.input]}
    layers = []
    for name, times in steps.items():
        conv = convs.get(name)
        peer = _ort_node(consumers, conv, set(nodes)) if conv is not None else None
        if conv is not None and peer is not None and nodes[peer]:
            layers.append(Layer(name, _shape(conv, weights, dims), statistics.median(times),
                                statistics.median(nodes[peer])))
    return sorted(layers, key=lambda layer: layer.ort_ms - layer.ours_ms)


def report(key: str, threads: int, runs: int, policy: str, layers: list[Layer],
           store: Path | None = None) -> str:
    ours, peer = sum(x.ours_ms for x in layers), sum(x.ort_ms for x in layers)
    rows = [f"| {x.node} | {x.shape} | {x.ours_ms:.3f} | {x.ort_ms:.3f} | "
            f"**{x.ours_ms / x.ort_ms:.2f}** |" for x in layers]
    return "\n".join([
        machine_summary(),
        f"Revision `{git_revision()}`.",
        "",
        f"{key}, batch 1, 224x224, {threads} thread(s), policy {policy} ("
        + (f"the tuned store `{store}`" if store else "empty store: the seed and the tiler")
        + f"). {runs} inferences of each engine alternating in one process; "
        "per layer the median of ours (the compiled program's step, timed in the runner) "
        "and of onnxruntime's fused node (its profiler's kernel time), largest losses first.",
        "",
        "| node | layer (C x H x W -> F, kernel/stride) | ours ms | onnxruntime ms | ours ÷ ORT |",
        "|---|---|---|---|---|",
        *rows,
        f"| **all {len(layers)} convolutions** | | {ours:.2f} | {peer:.2f} | "
        f"**{ours / peer:.3f}** |",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50", choices=sorted(ZOO))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--policy", default="analytic", choices=("analytic", "balanced"))
    parser.add_argument("--store", type=Path, help="a tuned store to compile against")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    layers = measure(args.model, args.threads, args.runs, args.policy, args.store)
    text = report(args.model, args.threads, args.runs, args.policy, layers, args.store)
    print(text)
    if not args.no_write:
        write_section(text, args.model)


if __name__ == "__main__":
    main()
