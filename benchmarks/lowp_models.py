"""Low-precision models: tunecache's int8 and bf16 against onnxruntime's and OpenVINO's.

Models (batch 1, random weights from fixed seeds): a BERT-base encoder (12 layers, hidden
768, 12 heads, sequence 128, built with onnx.helper as ``tests/onnx_support.py`` builds one
layer), ResNet-50 and MobileNet-v2 (``benchmarks/cnn_zoo.py``, 224x224). Each is measured as
the float32 file, and quantized by ``onnxruntime.quantization`` the usual way: static QDQ
(u8 activations, s8 per-channel weights, calibrated on four seeded random inputs) and, for
BERT, dynamic (MatMulInteger, s8 weights); and as float16 (onnxruntime's float16
converter, float16 inputs and outputs).

Engines, each in its own process, every process open at once and timed in lockstep rounds
(``model_zoo_latency.py``'s ``_Server`` and ``_wait_idle``; the order rotates):

* ``tunecache``: the file compiled untuned (``analytic``, a fresh store: the shipped seed);
* ``tunecache-bf16`` (float32 files): the same with ``precision="bf16"``;
* ``onnxruntime``: the same file, all graph optimisations, ``intra_op_num_threads``;
* ``openvino``: the same file with OpenVINO's defaults (latency hint): its default inference
  precision, named in the table (bf16 on AMX, f32 elsewhere);
* ``openvino-f32`` (float32 files): ``INFERENCE_PRECISION_HINT=f32``.

Ratios are medians over rounds of ours ÷ the best peer in the same round. Error columns are
max |x - onnxruntime| ÷ max |onnxruntime| on the same input.

    python benchmarks/lowp_models.py [--only bert_base,resnet50] [--threads 1,2]
        [--repeat 20] [--tune TRIALS] [--no-write] [--section lowp_models_avx2]

Needs onnxruntime and OpenVINO (``pip install 'tunecache[onnxruntime,openvino]'``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import model_zoo_latency as mzl  # noqa: E402

Feeds = dict[str, np.ndarray]
MODELS = ("bert_base", "resnet50", "mobilenet_v2")
FLOAT_ENGINES = ("onnxruntime", "tunecache", "tunecache-bf16", "openvino", "openvino-f32")
QUANT_ENGINES = ("onnxruntime", "tunecache", "openvino")
INSTALL_HINT = ("error: this benchmark needs onnxruntime and OpenVINO: "
                "pip install 'tunecache[onnxruntime,openvino]'")


# -- models ----------------------------------------------------------------------------------


def _float_model(key: str, work: Path) -> Feeds:
    """Write ``{key}.onnx``; returns one inference's inputs."""
    import onnx

    rng = np.random.default_rng(0)
    if key == "bert_base":
        from onnx_support import bert_layer_model

        onnx.save(bert_layer_model(batch=1, seq=128, hidden=768, heads=12, layers=12),
                  work / f"{key}.onnx")
        return {"hidden": rng.standard_normal((1, 128, 768)).astype(np.float32),
                "mask": np.zeros((1, 1, 1, 128), np.float32)}
    from cnn_zoo import ZOO

    onnx.save(ZOO[key](224), work / f"{key}.onnx")
    return {"image": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def _calibration(feeds: Feeds) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.batches = iter([{name: (rng.standard_normal(v.shape).astype(v.dtype)
                                         if name != "mask" else v) for name, v in feeds.items()}
                                 for _ in range(4)])

        def get_next(self) -> Feeds | None:
            return next(self.batches, None)

    return Reader()


def _quantized(key: str, feeds: Feeds, work: Path) -> list[str]:
    """Write the quantized files of ``key``; returns their keys."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    source = str(work / f"{key}.onnx")
    quantize_static(source, str(work / f"{key}.int8.onnx"), _calibration(feeds),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    keys = [f"{key}.int8"]
    if key == "bert_base":
        quantize_dynamic(source, str(work / f"{key}.dyn.onnx"), weight_type=QuantType.QInt8)
        keys.append(f"{key}.dyn")
    for k in keys:
        np.savez(work / f"{k}-feeds.npz", **feeds)
    return keys


def _float16(key: str, feeds: Feeds, work: Path) -> list[str]:
    """Write ``{key}.fp16.onnx`` (onnxruntime's float16 converter, float16 inputs and
    outputs); returns its key."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(work / f"{key}.onnx"), keep_io_types=False)
    onnx.save(model, work / f"{key}.fp16.onnx")
    np.savez(work / f"{key}.fp16-feeds.npz",
             **{name: v.astype(np.float16) for name, v in feeds.items()})
    return [f"{key}.fp16"]


# -- child processes -------------------------------------------------------------------------


def _open(engine: str, path: Path, feeds: Feeds, threads: int, work: Path) -> mzl.Opened:
    if engine.endswith("-tuned"):
        return _open_tuned(path, feeds, threads, work, _precision(engine))
    if engine.startswith("tunecache"):
        return _open_tunecache(path, feeds, threads, work, engine.removeprefix("tunecache-")
                               if engine != "tunecache" else "fp32")
    if engine == "onnxruntime":
        return mzl._open_onnxruntime(path, feeds, threads)
    if engine == "openvino-f32":
        return mzl._open_openvino(path, feeds, threads)
    return _open_openvino_default(path, feeds, threads)


def _open_tunecache(path: Path, feeds: Feeds, threads: int, work: Path,
                    precision: str) -> mzl.Opened:
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.tuner.deploy import compile_model

    hw = replace(local_spec(), cores=threads)
    start = time.perf_counter()
    compiled = compile_model(path, store=Store(work / f"store-{path.stem}-{threads}"),
                             policy="analytic", record_wanted=False, hw=hw,
                             input_shapes={k: v.shape for k, v in feeds.items()},
                             precision=precision)
    return mzl.Opened(lambda: compiled.run(feeds), lambda: mzl._first_output(compiled, feeds),
                      {"cold_s": time.perf_counter() - start})


def _precision(engine: str) -> str:
    return "bf16" if engine.startswith("tunecache-bf16") else "fp32"


def _tuned_store(path: Path, threads: int, precision: str, work: Path) -> Path:
    return work / f"tuned-{path.stem}-{threads}-{precision}"


def tune(path: Path, threads: int, work: Path, trials: int, precision: str) -> None:
    """``--tune``'s job (a child process): the ops ``path`` compiled at ``precision`` runs,
    ``trials`` candidates each, into a fresh store, published."""
    from tunecache.cache.store import Store
    from tunecache.compiler.frontend import kernel_ops
    from tunecache.compiler.hardware import local_spec
    from tunecache.datasets.suites import Workload
    from tunecache.tuner.jobs import JobOptions, run_job

    with np.load(work / f"{path.stem}-feeds.npz", allow_pickle=False) as data:
        shapes = {name: data[name].shape for name in data.files}
    hw = replace(local_spec(), cores=threads)
    store = Store(_tuned_store(path, threads, precision, work))
    workloads = [Workload(op, count, label) for op, count, label
                 in kernel_ops(path, shapes, hw=hw, precision=precision)]
    run_job(workloads, hw, store, JobOptions(trials=trials, refine=False, baseline=False))
    store.publish(hw.hw_id)


def _open_tuned(path: Path, feeds: Feeds, threads: int, work: Path,
                precision: str) -> mzl.Opened:
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.tuner.deploy import compile_model

    hw = replace(local_spec(), cores=threads)
    compiled = compile_model(path, store=Store(_tuned_store(path, threads, precision, work)),
                             policy="balanced", record_wanted=False, hw=hw,
                             input_shapes={k: v.shape for k, v in feeds.items()},
                             precision=precision)
    return mzl.Opened(lambda: compiled.run(feeds), lambda: mzl._first_output(compiled, feeds),
                      {})


def _open_openvino_default(path: Path, feeds: Feeds, threads: int) -> mzl.Opened:
    import openvino as ov  # type: ignore[import-untyped]

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    precision = getattr(hint, "type_name", None) or str(hint)  # "bf16", "f32"
    request = compiled.create_infer_request()

    def output() -> np.ndarray:
        request.infer(feeds)
        return np.array(request.get_output_tensor(0).data)

    (Path(path).parent / "openvino-precision.txt").write_text(precision)
    return mzl.Opened(lambda: request.infer(feeds), output, {})


def child(engine: str, path: Path, threads: int, work: Path) -> None:
    """Open ``engine`` on ``path`` and time inferences on request (``mzl._serve``); then
    save its output and print its figures as one JSON line."""
    with np.load(work / f"{path.stem}-feeds.npz", allow_pickle=False) as data:
        feeds = {name: data[name] for name in data.files}
    try:
        opened = _open(engine, path, feeds, threads, work)
        opened.run()
        ms = statistics.median(mzl._serve(opened) or [float("nan")])
        np.save(work / f"{path.stem}-{engine}-{threads}.npy", opened.output(),
                allow_pickle=False)
    except Exception as exc:  # a value: the row says which engine failed, and why
        print(mzl._error_line(exc), flush=True)
        return
    print(json.dumps({"ms": ms, "rss_mib": mzl._peak_rss_mib(), **opened.extra}), flush=True)


# -- parent ----------------------------------------------------------------------------------


def _start(engine: str, key: str, threads: int, work: Path) -> mzl._Server:
    stderr = work / f"{key}-{engine}-{threads}.err"
    env = mzl._child_env(engine, key, threads, work)
    argv = [sys.executable, __file__, "--child", engine, str(work / f"{key}.onnx"),
            "--threads", str(threads), "--work", str(work)]
    with stderr.open("w") as sink:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=sink, text=True)
    server = mzl._Server(engine, proc, stderr)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if not first.startswith('{"ready"'):
        server.error = mzl._figures(first).error if first else ""
        server.fail()
    return server


def _lockstep(engines: Sequence[str], key: str, threads: int, repeat: int,
              work: Path) -> dict[str, mzl.Measurement]:
    servers = [_start(engine, key, threads, work) for engine in engines]
    for i in range(repeat):
        for server in servers[i % len(servers):] + servers[:i % len(servers)]:
            answer = "" if server.error else server.request("run")
            if not answer:
                if not server.error:
                    server.fail()
                server.times.append(float("nan"))
                continue
            server.times.append(float(answer))
            mzl._wait_idle(server.proc.pid)
    out = {}
    for server in servers:
        figures = mzl.Measurement(error=server.error)
        if not server.error:
            last = server.request("finish")
            server.proc.wait()
            figures = mzl._figures(last) if last else mzl.Measurement(error="no figures")
        out[server.engine] = replace(figures, rounds=tuple(server.times))
    return out


def _rows(key: str, threads: int, m: dict[str, mzl.Measurement], work: Path,
          ov_precision: str) -> list[str]:
    """One row per tunecache variant measured on ``key``."""
    def err(engine: str) -> str:
        if m[engine].error or m["onnxruntime"].error:
            return "-"
        return f"{mzl._rel_err(work, key, engine, threads):.1e}"

    def ms(engine: str) -> str:
        return "failed" if engine not in m or m[engine].error else f"{m[engine].ms:.2f}"

    rows = []
    for ours in [e for e in m if e.startswith("tunecache")]:
        peers = [m[e] for e in _peers(ours, m) if not m[e].error]
        best = mzl.paired_ratio(m[ours], peers)
        failures = "; ".join(f"{e}: {x.error}" for e, x in m.items() if x.error) or "-"
        rows.append(f"| {key} | {ours} | {threads} | {ms(ours)} | {ms('onnxruntime')} | "
                    f"{ms('openvino')} ({ov_precision}) | "
                    f"{ms('openvino-f32') if 'openvino-f32' in m else '-'} | "
                    f"{best:.2f} | {err(ours)} | {err('openvino')} | {failures} |")
    return rows


def _peers(ours: str, m: dict[str, mzl.Measurement]) -> tuple[str, ...]:
    """What ``ours`` is compared with: float32 against float32 (onnxruntime, OpenVINO f32),
    ``--precision bf16`` against OpenVINO at its default precision, a quantized file against
    both peers running it."""
    if ours.startswith("tunecache-bf16"):
        return ("openvino",)
    if "openvino-f32" in m:
        return ("onnxruntime", "openvino-f32")
    return ("onnxruntime", "openvino")


def _tuned_engine(key: str, variant: str) -> str | None:
    """What ``--tune`` adds for ``variant``: the float file tuned at bf16 (the precision the
    bar compares), a quantized file as it is; the float16 files are not tuned."""
    if variant == key:
        return "tunecache-bf16-tuned"
    return None if variant.endswith(".fp16") else "tunecache-tuned"


def _tune_child(variant: str, n: int, work: Path, trials: int, engine: str) -> None:
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--tune-child", _precision(engine),
                    str(work / f"{variant}.onnx"), "--threads", str(n), "--work", str(work),
                    "--tune", str(trials)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    print(f"{variant}: tuned at {n} thread(s) in {time.perf_counter() - start:.0f} s",
          file=sys.stderr, flush=True)


def _measure(keys: Sequence[str], threads: Sequence[int], repeat: int, work: Path,
             trials: int = 0) -> list[str]:
    rows = []
    for key in keys:
        print(f"{key}: preparing", file=sys.stderr, flush=True)
        feeds = _float_model(key, work)
        np.savez(work / f"{key}-feeds.npz", **feeds)
        for variant in [key, *_quantized(key, feeds, work), *_float16(key, feeds, work)]:
            engines = FLOAT_ENGINES if variant == key else QUANT_ENGINES
            tuned = _tuned_engine(key, variant) if trials else None
            for n in threads:
                if tuned:
                    _tune_child(variant, n, work, trials, tuned)
                m = _lockstep((*engines, *([tuned] if tuned else [])), variant, n, repeat, work)
                precision_file = work / "openvino-precision.txt"
                ov = precision_file.read_text() if precision_file.exists() else "?"
                for row in _rows(variant, n, m, work, ov):
                    rows.append(row)
                    print(row, flush=True)
    return rows


def _report(rows: Sequence[str], repeat: int, versions: str, trials: int = 0) -> str:
    from _report import git_revision, machine_summary

    return "\n".join([
        machine_summary(), "",
        f"Revision `{git_revision()}`. {versions}. Batch 1; BERT-base encoder (12 layers, "
        "sequence 128), ResNet-50 and MobileNet-v2 at 224x224, random weights; `.int8` = "
        "static QDQ by onnxruntime.quantization (u8 activations, s8 per-channel weights), "
        "`.dyn` = dynamic (MatMulInteger), `.fp16` = onnxruntime's float16 converter "
        "(ours computes it in float32). Every engine in its own process, all open at "
        f"once, {repeat} lockstep rounds; ours untuned (analytic, shipped seed)"
        + (f", and `-tuned` after a job of {trials} trials per op the compiled file runs "
           "(the float file at bf16), in a store of its own per file and thread count"
           if trials else "") + ". Ratio = "
        "median over rounds of ours ÷ the fastest peer in the same round on the same file: "
        "ours f32 against onnxruntime and OpenVINO f32, ours `--precision bf16` against "
        "OpenVINO at its default precision, a quantized file against onnxruntime and "
        "OpenVINO running it; error = max |x - onnxruntime| ÷ max |onnxruntime|.", "",
        "| model | ours | threads | ours ms | onnxruntime ms | OpenVINO ms (its default) | "
        "OpenVINO f32 ms | ours ÷ peer | error (ours) | error (OpenVINO) | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--section", default=None,
                        help="write a block of its own (one per machine: lowp_models_avx2)")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="also measure ours tuned: TRIALS candidates per op, a job per "
                             "file and thread count (the float files tuned at bf16)")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL"))
    parser.add_argument("--tune-child", nargs=2, metavar=("PRECISION", "MODEL"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]), int(args.threads), args.work)
        return 0
    if args.tune_child:
        tune(Path(args.tune_child[1]), int(args.threads), args.work, args.tune,
             args.tune_child[0])
        return 0
    keys = [k for k in args.only.split(",") if k]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        print(f"error: unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}",
              file=sys.stderr)
        return 2
    try:
        import onnxruntime
        import openvino  # type: ignore[import-untyped]
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    versions = f"onnxruntime {onnxruntime.__version__}, OpenVINO {openvino.__version__}"
    with tempfile.TemporaryDirectory(prefix="lowp-models-") as tmp:
        rows = _measure(keys, [int(t) for t in args.threads.split(",")], args.repeat,
                        Path(tmp), args.tune)
    markdown = _report(rows, args.repeat, versions, args.tune)
    print(markdown)
    if not args.no_write:
        from _report import write_section

        write_section(markdown, args.section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
