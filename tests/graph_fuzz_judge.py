"""Judging tunecache against onnxruntime on a generated graph (``graph_fuzz.py``,
``graph_fuzz_invalid.py``): a bound on each tensor's float32 error propagated node by node
(:func:`error_bounds`), and :func:`run_case`, which compiles, runs and compares a case."""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from graph_fuzz import F32, FuzzCase
from onnx import helper, numpy_helper

# -- tolerance: a bound on each tensor's float32 error, propagated node by node --------------

UNIT_ROUNDOFF = 2.0 ** -24
"""float32's unit roundoff: one rounding errs by at most this much of its result."""
APPROX = 1e-6
"""The error of a transcendental function's float32 approximation, absolute on outputs of
magnitude up to 1 and relative above (docs/ONNX.md: erf within 1e-6; the kernels' exp,
tanh and erf within 4e-7)."""
SAFETY = 4.0
"""Both implementations err by up to the bound; twice that again for the bounds' own
approximations (a norm's extreme rows, a pool's window)."""


@dataclass
class _Arg:
    value: np.ndarray
    err: float

    @property
    def mag(self) -> float:
        return _finite_max(self.value)


def _finite_max(array: np.ndarray) -> float:
    finite = np.asarray(array, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.abs(finite).max()) if finite.size else 0.0


def _dot_bound(k: int, a: _Arg, b: _Arg) -> float:
    """A length-``k`` sum of products: the operands' errors carried through, plus the
    rounding of the sum (``k`` roundings of partial sums up to ``sqrt(k)`` products large:
    between the typical and the worst case, whatever the summation order)."""
    carried = k * (a.err * b.mag + b.err * a.mag + a.err * b.err)
    return carried + 2 * UNIT_ROUNDOFF * k * math.sqrt(k) * a.mag * b.mag


def _b_matmul(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    return _dot_bound(args[0].value.shape[-1], args[0], args[1]) + UNIT_ROUNDOFF * out


def _b_gemm(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    a, b = args[0], args[1]
    k = a.value.shape[0] if attrs.get("transA") else a.value.shape[1]
    c = abs(attrs.get("beta", 1.0)) * args[2].err if len(args) > 2 else 0.0
    return abs(attrs.get("alpha", 1.0)) * _dot_bound(k, a, b) + c + 2 * UNIT_ROUNDOFF * out


def _b_conv(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    k = math.prod(args[1].value.shape[1:])
    bias = args[2].err if len(args) > 2 else 0.0
    return _dot_bound(k, args[0], args[1]) + bias + 2 * UNIT_ROUNDOFF * out


def _b_exact(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    return max((a.err for a in args), default=0.0)


def _b_add(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    return args[0].err + args[1].err + UNIT_ROUNDOFF * out


def _b_mul(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    a, b = args
    return a.err * b.mag + b.err * a.mag + a.err * b.err + UNIT_ROUNDOFF * out


def _b_div(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    a, b = args
    divisor = np.abs(np.asarray(b.value, dtype=np.float64))
    divisor = divisor[np.isfinite(divisor) & (divisor > 0)]
    smallest = float(divisor.min()) if divisor.size else math.inf
    if b.err >= smallest:
        return math.inf
    return (a.err * smallest + (a.mag + a.err) * b.err) / (smallest * (smallest - b.err)) \
        + UNIT_ROUNDOFF * out


def _b_pow(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    x, p = args[0], float(np.asarray(args[1].value).reshape(-1)[0])
    return (x.mag + x.err) ** p - x.mag ** p + 2 * UNIT_ROUNDOFF * out


def _lipschitz(slope: float) -> Callable[[Mapping[str, Any], list[_Arg], float], float]:
    def bound(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
        return slope * args[0].err + APPROX * max(out, 1.0) + UNIT_ROUNDOFF * out
    return bound


def _b_exp(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    return out * (math.expm1(min(args[0].err, 80.0)) + APPROX + UNIT_ROUNDOFF)


def _b_sqrt(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    return math.sqrt(args[0].err) + UNIT_ROUNDOFF * out


def _b_softmax(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    # exp(x + e) / sum(exp(x + e')) is within a factor exp(+-2e) of the exact ratio
    n = args[0].value.shape[int(attrs.get("axis", -1))]
    return min(1.0, math.expm1(min(2 * args[0].err, 80.0))) + UNIT_ROUNDOFF * (n + 4) + APPROX


def _b_layernorm(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    x = args[0]
    axis = int(attrs.get("axis", -1)) % x.value.ndim
    axes = tuple(range(axis, x.value.ndim))
    n = math.prod(x.value.shape[axis:])
    values = np.asarray(x.value, dtype=np.float64)
    finite = np.isfinite(values).all(axis=axes)
    if not finite.any():
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        variance = values.var(axis=axes)
    sigma = math.sqrt(float(variance[finite].min()) + attrs.get("epsilon", 1e-5))
    # x - mean errs by the input's error twice and the mean's rounding; dividing by sigma
    # (itself that wrong) scales it by up to 1 + |z|, |z| <= sqrt(n)
    centred = 2 * x.err + UNIT_ROUNDOFF * (n + 2) * x.mag
    z = (1 + math.sqrt(n)) * centred / sigma + math.sqrt(n) * UNIT_ROUNDOFF * n
    bias = args[2].err if len(args) > 2 else 0.0
    return args[1].mag * z + bias + 2 * UNIT_ROUNDOFF * out


def _b_batchnorm(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    gamma, beta, mean, var = (np.asarray(a.value, dtype=np.float64) for a in args[1:5])
    scale = gamma / np.sqrt(var + attrs.get("epsilon", 1e-5))
    shift = float(np.abs(beta - mean * scale).max())
    big = float(np.abs(scale).max())
    return args[0].err * big + 4 * UNIT_ROUNDOFF * (args[0].mag * big + shift) + UNIT_ROUNDOFF * out


def _b_average(attrs: Mapping[str, Any], args: list[_Arg], out: float) -> float:
    shape = args[0].value.shape
    window = math.prod(attrs.get("kernel_shape", shape[2:]))
    return args[0].err + UNIT_ROUNDOFF * (window + 2) * args[0].mag


_BOUNDS: dict[str, Callable[[Mapping[str, Any], list[_Arg], float], float]] = {
    "MatMul": _b_matmul, "Gemm": _b_gemm, "Conv": _b_conv,
    "Add": _b_add, "Sub": _b_add, "Mul": _b_mul, "Div": _b_div, "Pow": _b_pow,
    "Sigmoid": _lipschitz(0.25), "Tanh": _lipschitz(1.0), "Erf": _lipschitz(2 / math.sqrt(math.pi)),
    "Exp": _b_exp, "Sqrt": _b_sqrt, "Softmax": _b_softmax, "LayerNormalization": _b_layernorm,
    "BatchNormalization": _b_batchnorm, "AveragePool": _b_average, "GlobalAveragePool": _b_average,
    **dict.fromkeys(["Relu", "LeakyRelu", "Abs", "Neg", "Clip", "Max", "Min", "MaxPool",
                     "GlobalMaxPool", "Transpose", "Reshape", "Flatten", "Concat", "Identity"],
                    _b_exact),
}


def error_bounds(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> dict[str, float]:
    """A bound on the absolute float32 error of every tensor of ``model``, from the values
    ``values`` holds for all of them (inputs, initializers, every node's output, as
    onnxruntime computed them): inputs and initializers are exact; each node adds its
    rounding (and its approximations) to the errors of its inputs carried through it, with
    tensor-wide magnitudes (the largest finite values) and reduction lengths."""
    errors = {name: 0.0 for name in values}
    for node in model.graph.node:
        rule = _BOUNDS[node.op_type]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        args = [_Arg(values[t], errors.get(t, 0.0)) for t in node.input if t]
        errors[node.output[0]] = rule(attrs, args, _finite_max(values[node.output[0]]))
    return errors


# -- running and judging a case -----------------------------------------------------------------


@dataclass
class Outcome:
    """What became of a case: ``verdict`` is ``agree``, ``disagree``, or, where
    onnxruntime does not treat the case as it was generated, ``ort-refused-valid`` /
    ``ort-accepted-invalid`` (not counted either way). A disagreement's ``kinds`` say what
    went wrong (:data:`CATEGORIES` for outputs, else how tunecache failed), its ``detail``
    where and by how much."""

    valid: bool
    verdict: str
    detail: str = ""
    seconds: float = 0.0
    kinds: list[str] = field(default_factory=list)


def ort_session(model: onnx.ModelProto) -> Any:
    """An onnxruntime CPU session of ``model``: one thread, no graph optimisations (each
    node computed as written, so its intermediates are the ones the bounds look at)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _with_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    named = {o.name for o in wide.graph.output}
    for node in wide.graph.node:
        for out in node.output:
            if out and out not in named:
                wide.graph.output.append(helper.make_tensor_value_info(out, F32, None))
                named.add(out)
    return wide


def onnxruntime_values(case: FuzzCase) -> dict[str, np.ndarray]:
    """Every tensor of a valid case as onnxruntime computes it (inputs and initializers
    included): one session whose outputs are all the node outputs."""
    wide = _with_all_outputs(case.model)
    results = ort_session(wide).run(None, {k: v.copy() for k, v in case.feeds.items()})
    values = {o.name: np.asarray(r) for o, r in zip(wide.graph.output, results, strict=True)}
    values.update(case.feeds)
    values.update({i.name: numpy_helper.to_array(i) for i in case.model.graph.initializer})
    return values


def run_tunecache(case: FuzzCase, workdir: Path, store: Any) -> dict[str, np.ndarray]:
    """Compile the case's model from a file in ``workdir`` (analytic policy: the tiler's
    schedule for every kernel, real builds, nothing measured) and run it once."""
    from tunecache.tuner.deploy import compile_model

    path = workdir / "case.onnx"
    onnx.save(case.model, str(path))
    compiled = compile_model(path, store=store, policy="analytic", record_wanted=False)
    return dict(compiled.run({k: v.copy() for k, v in case.feeds.items()}))


def _tunecache_or_error(case: FuzzCase, workdir: Path, store: Any
                        ) -> tuple[dict[str, np.ndarray] | None, BaseException | None]:
    try:
        return run_tunecache(case, workdir, store), None
    except Exception as exc:
        return None, exc


def _error_text(exc: BaseException) -> str:
    from tunecache.compiler.errors import TunecacheError

    text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    if not isinstance(exc, TunecacheError):
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text += f" (at {Path(frame.filename).name}:{frame.lineno})"
    return text


def run_case(case: FuzzCase, workdir: Path, store: Any) -> Outcome:
    """Run ``case`` on onnxruntime and on tunecache (kernels built in the build cache,
    schedules looked up in ``store``) and judge it."""
    start = time.perf_counter()
    outcome = _run_valid(case, workdir, store) if case.valid else \
        _run_invalid(case, workdir, store)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _run_invalid(case: FuzzCase, workdir: Path, store: Any) -> Outcome:
    from tunecache.compiler.errors import TunecacheError

    try:
        ort_session(case.model).run(None, {k: v.copy() for k, v in case.feeds.items()})
    except Exception as exc:
        refusal = f"onnxruntime: {str(exc).splitlines()[0][:200]}"
    else:
        return Outcome(False, "ort-accepted-invalid", "onnxruntime ran it")
    outputs, error = _tunecache_or_error(case, workdir, store)
    if error is None:
        shapes = {k: list(np.shape(v)) for k, v in (outputs or {}).items()}
        return Outcome(False, "disagree", f"tunecache ran it (outputs {shapes}); {refusal}",
                       kinds=["ran a graph onnxruntime refuses"])
    if not isinstance(error, TunecacheError):
        return Outcome(False, "disagree", f"tunecache crashed: {_error_text(error)}; {refusal}",
                       kinds=[f"crashed ({type(error).__name__}) on a graph onnxruntime refuses"])
    return Outcome(False, "agree", f"tunecache: {_error_text(error)}; {refusal}")


def _run_valid(case: FuzzCase, workdir: Path, store: Any) -> Outcome:
    try:
        values = onnxruntime_values(case)
    except Exception as exc:
        return Outcome(True, "ort-refused-valid", f"onnxruntime: {str(exc)[:300]}")
    outputs, error = _tunecache_or_error(case, workdir, store)
    if error is not None:
        from tunecache.compiler.errors import TunecacheError

        what = "refused" if isinstance(error, TunecacheError) else \
            f"crashed ({type(error).__name__}) on"
        return Outcome(True, "disagree", f"tunecache {what} a valid graph: {_error_text(error)}",
                       kinds=[f"{what} a valid graph"])
    assert outputs is not None
    bounds = error_bounds(case.model, values)
    # where a NaN or an infinity flows (an input's, or Sqrt(-1)'s, Exp(100)'s), tunecache
    # may have NaN where onnxruntime has none (see compare)
    lenient = not all(np.isfinite(v).all() for v in values.values() if v.dtype.kind == "f")
    problems = []
    for out in case.model.graph.output:
        if out.name not in outputs:
            problems.append(f"{SHAPE} in {out.name}: missing from tunecache's outputs")
            continue
        problems += compare(out.name, outputs[out.name], values[out.name], bounds[out.name],
                            lenient_nan=lenient)
    kinds = sorted({p.split(" in ", 1)[0] for p in problems})
    return Outcome(True, "disagree" if problems else "agree", "; ".join(problems), kinds=kinds)


HIDDEN_NAN = "NaN hidden"
INF_DIFFERS = "infinity differs"
INF_FROM_FINITE = "infinite where onnxruntime is finite"
NAN_FROM_FINITE = "NaN where onnxruntime is finite"
OFF = "beyond the tolerance"
SHAPE = "shape or dtype differs"
CATEGORIES = (HIDDEN_NAN, INF_DIFFERS, INF_FROM_FINITE, NAN_FROM_FINITE, OFF, SHAPE)
"""What a valid graph's output can get wrong; each problem :func:`compare` reports starts
with one of these."""


def compare(name: str, ours: np.ndarray, theirs: np.ndarray, bound: float,
            lenient_nan: bool = False) -> list[str]:
    """What differs between tunecache's output ``ours`` and onnxruntime's ``theirs``, one
    line per :data:`CATEGORIES` entry: NaN must be NaN, an infinity the same infinity, a
    finite value finite and within ``SAFETY * bound`` plus a few ulp of itself. With
    ``lenient_nan`` (NaN or infinities somewhere in the graph), tunecache may have NaN where
    onnxruntime does not: onnxruntime's MaxPool drops NaN in some windows (tunecache's
    never does), and a Winograd tile spreads one to its neighbours."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
        return [f"{SHAPE} in {name}: tunecache gives {ours.dtype}{list(ours.shape)}, "
                f"onnxruntime {theirs.dtype}{list(theirs.shape)}"]
    nan_o, finite_t = np.isnan(ours), np.isfinite(theirs)
    excused = nan_o if lenient_nan else np.zeros_like(nan_o)
    tol = SAFETY * bound + 8 * UNIT_ROUNDOFF * np.abs(theirs.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    masks = {
        HIDDEN_NAN: np.isnan(theirs) & ~nan_o,
        INF_DIFFERS: np.isinf(theirs) & (ours != theirs) & ~excused,
        INF_FROM_FINITE: finite_t & np.isinf(ours),
        NAN_FROM_FINITE: finite_t & nan_o & ~excused,
        OFF: finite_t & np.isfinite(ours) & ~(diff <= tol),
    }
    problems = []
    for category, mask in masks.items():
        if mask.any():
            at = np.unravel_index(int(np.argmax(np.where(mask, diff, -1.0))), ours.shape) \
                if category == OFF else tuple(np.argwhere(mask)[0])
            problems.append(
                f"{category} in {name}: {int(mask.sum())} of {ours.size} (e.g. at "
                f"{[int(i) for i in at]}: ours {ours[at]}, onnxruntime {theirs[at]}"
                + (f", tolerance {float(np.broadcast_to(tol, ours.shape)[at]):.3g})"
                   if category == OFF else ")"))
    return problems
