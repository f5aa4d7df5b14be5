"""The epilogue renderer and the micro-kernel generator, in compiled C against numpy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tunecache.compiler.backends.cpu.clib import CLibrary, c_library
from tunecache.compiler.backends.cpu.isa import BASE_FLAGS, dialect
from tunecache.compiler.codegen.epilogue import (
    CHANNEL_STEPS,
    STEPS,
    operand_tensors,
    reference,
    render,
    scalar_helpers,
)
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, micro_kernel, store
from tunecache.compiler.hardware import local_spec, runnable_isas

ISAS = runnable_isas(local_spec())
# Every ordered subsequence of the steps, as an op's epilogue is; the chain steps that follow
# them (channel rows, the quantizer's rounding) have their own test. Activations added since
# the set reached 2**10 epilogues (each doubles the C compiled) join every ordered
# subsequence of the operand steps and one other activation instead.
LATER = ("mish",)
ORDERED = tuple(step for step in STEPS if step not in (*CHANNEL_STEPS, "qround", *LATER))
OPERAND_STEPS = tuple(step for step in ORDERED if STEPS[step].operand)
EPILOGUES = [combo for n in range(len(ORDERED) + 1)
             for combo in itertools.combinations(ORDERED, n)]
EPILOGUES += [tuple(s for s in STEPS if s in (*combo, later, *other))
              for later in LATER for n in range(len(OPERAND_STEPS) + 1)
              for combo in itertools.combinations(OPERAND_STEPS, n)
              for other in ((), ("relu",))]


_ERF = np.vectorize(math.erf)
# Written out independently of the table's own numpy forms (silu and the GELUs in float64).
_UNARY = {"relu": lambda y: np.maximum(y, np.float32(0)),
          "clip6": lambda y: np.minimum(np.maximum(y, np.float32(0)), np.float32(6)),
          "silu": lambda y: (y / (1.0 + np.exp(-y.astype(np.float64)))).astype(np.float32),
          "gelu_erf": lambda y: (0.5 * y * (1.0 + _ERF(y.astype(np.float64) / math.sqrt(2.0))))
          .astype(np.float32),
          "gelu_tanh": lambda y: (0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (
              y.astype(np.float64) + 0.044715 * y.astype(np.float64) ** 3)))).astype(np.float32),
          "hardswish": lambda y: (y * np.clip(y.astype(np.float64) / 6 + 0.5, 0, 1))
          .astype(np.float32),
          "hardsigmoid": lambda y: np.clip(y.astype(np.float64) / 6 + 0.5, 0, 1)
          .astype(np.float32),
          "mish": lambda y: (y * np.tanh(np.log1p(np.exp(y.astype(np.float64)))))
          .astype(np.float32)}
_POLYNOMIAL = ("silu", "gelu_erf", "gelu_tanh", "hardswish", "hardsigmoid", "mish")
"""Steps computed with exp / erf / tanh polynomials, or a float32 1/6: float32 rounding, not
exact."""


def _numpy(steps: tuple[str, ...], x: np.ndarray, operands: dict[str, np.ndarray]) -> np.ndarray:
    y = x.copy()
    for step in steps:
        if step == "dequant":
            y = y * operands["scale"]
        else:
            y = _UNARY[step](y) if step in _UNARY else y + operands[str(STEPS[step].operand)]
    return y


def _elementwise(isa: str) -> CLibrary:
    """``run_<k>``: ``y = epilogue(x)`` over n floats for ``EPILOGUES[k]``, whole vectors
    then a scalar tail (one library for every epilogue)."""
    d = dialect(isa)
    functions = []
    for k, steps in enumerate(EPILOGUES):
        vector = render(steps, "t", {"bias": "VLOADU(bias + i)", "add": "VLOADU(add + i)",
                                     "scale": "VLOADU(scale + i)"}, vector=True)
        scalar = render(steps, "v", {"bias": "bias[i]", "add": "add[i]", "scale": "scale[i]"},
                        vector=False)
        functions.append(f"""
void run_{k}(const float *x, const float *bias, const float *add, const float *scale,
             float *y, long n) {{
  (void)bias; (void)add; (void)scale;
  long i = 0;
  for (; i + {d.lanes} <= n; i += {d.lanes}) {{ vec t = VLOADU(x + i); {vector} VSTOREU(y + i, t); }}
  for (; i < n; i++) {{ float v = x[i]; {scalar} y[i] = v; }}
}}
""")
    code = d.prelude + scalar_helpers(tuple(STEPS)) + "".join(functions)
    return c_library(code, BASE_FLAGS + d.flags)


@pytest.mark.parametrize("isa", ISAS)
def test_vector_and_scalar_renderings_match_numpy(isa: str) -> None:
    rng = np.random.default_rng(0)
    n = 37  # whole vectors and a scalar tail on every ISA
    x = (4 * rng.standard_normal(n)).astype(np.float32)  # past both of clip6's bounds
    x[:3] = (-100.0, 90.0, 0.0)  # silu where e**-x underflows, saturates, and at 0
    x[[5, n - 1]] = np.nan  # NaN stays NaN through every step, vector and scalar tail
    bias, add, scale = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    lib = _elementwise(isa)
    for k, steps in enumerate(EPILOGUES):
        y = np.full(n, np.nan, dtype=np.float32)
        run = lib.function(f"run_{k}", ("ptr", "ptr", "ptr", "ptr", "ptr", "long"), "void")
        run(x, bias, add, scale, y, n)
        expected = _numpy(steps, x, {"bias": bias, "add": add, "scale": scale})
        # dequant's product may fuse with a following add into one FMA (-ffp-contract).
        if set(steps) & {*_POLYNOMIAL, "dequant"}:
            np.testing.assert_allclose(y, expected, rtol=2e-6, atol=1e-6,
                                       err_msg=f"{isa} {steps}")
        else:
            assert np.array_equal(y, expected, equal_nan=True), (isa, steps)
        assert np.isnan(y[[5, n - 1]]).all(), (isa, steps)
    assert len(EPILOGUES) == 2 ** len(ORDERED) + len(LATER) * 2 ** (len(OPERAND_STEPS) + 1)


@pytest.mark.parametrize("isa", ISAS)
def test_chain_steps_render_like_numpy_and_agree_on_nan(isa: str) -> None:
    # A quantize-dequantize pair and a BatchNormalization, each step its own row; ties of
    # the rounding (x / s = k + 0.5) go to even in C as in numpy; a NaN meets max/min the way
    # the vector instruction does in both renderings (the row's value, as the elementwise
    # kind's max/min, so folding a chain changes no result).
    steps = ("cdiv", "cmax", "cmin", "qround", "cmul", "cmul", "cadd", "csub")
    d, n = dialect(isa), 37
    rows = np.array([0.5, -8.0, 7.0, 0.5, 1.5, 0.25, 3.0], np.float32)[:, None].repeat(n, 1)
    x = np.concatenate([np.arange(-6, 6) * 0.25, 8 * np.random.default_rng(2).standard_normal(
        n - 13), [np.nan]]).astype(np.float32)
    chan = np.ascontiguousarray(rows)
    vector = render(steps, "t", {"chan": "VLOADU(chan + {i} * n + i)"}, vector=True)
    scalar = render(steps, "v", {"chan": "chan[{i} * n + i]"}, vector=False)
    code = d.prelude + f"""
void run(const float *x, const float *chan, float *y, long n, long split) {{
  long i = 0;
  for (; i + {d.lanes} <= split; i += {d.lanes}) {{ vec t = VLOADU(x + i); {vector} VSTOREU(y + i, t); }}
  for (; i < n; i++) {{ float v = x[i]; {scalar} y[i] = v; }}
}}
"""
    run = c_library(code, BASE_FLAGS + d.flags).function(
        "run", ("ptr", "ptr", "ptr", "long", "long"), "void")
    want = reference(steps, x.copy(), {"chan": chan}).copy()
    want[-1] = -8.0 * 0.5 * 1.5 + 0.25 - 3.0  # NaN clamped to cmax's row, as VMAX does
    for split in (0, n):  # all scalar, then all vector (a masked tail is the emitters' own)
        y = np.full(n, np.nan, np.float32)
        run(x, chan, y, n, split - split % d.lanes)
        np.testing.assert_allclose(y, want, rtol=1e-6, err_msg=f"{isa} split {split}")


def test_reference_applies_the_steps_in_order() -> None:
    rng = np.random.default_rng(1)
    x, bias, add, scale = ((4 * rng.standard_normal((3, 5))).astype(np.float32)
                           for _ in range(4))
    operands = {"bias": bias, "add": add, "scale": scale}
    for steps in EPILOGUES:
        got = reference(steps, x.copy(), operands)
        # the float32 GELU of a large negative x takes 1 + (-1 + tiny), the hard ones x / 6
        # + 1/2 near x = -3: absolute error only
        atol = 1e-5 if {"gelu_erf", "gelu_tanh", "hardswish", "hardsigmoid", "mish"} & \
            set(steps) \
            else 0
        np.testing.assert_allclose(got, _numpy(steps, x, operands),
                                   rtol=1e-6, atol=atol, err_msg=str(steps))
    with pytest.raises(ValueError, match="reads tensor 'add', but the reference got only bias"):
        reference(("add",), x.copy(), {"bias": bias})


def test_render_names_what_was_wrong() -> None:
    assert render((), "v", {}, vector=False) == ""
    assert operand_tensors(("bias", "relu", "add")) == ("bias", "add")
    with pytest.raises(ValueError, match="unknown epilogue step 'gelu6'; known steps: bias"):
        render(("gelu6",), "v", {}, vector=True)
    with pytest.raises(ValueError, match="reads tensor 'add', but the emitter gave only bias"):
        render(("add",), "v", {"bias": "b"}, vector=False)


def test_store_reads_only_the_operands_its_epilogue_uses() -> None:
    tile = Tile(("0", "1"), 2, 8)
    spec = Store(("c", "c + ldc"), accumulate="!first", epilogue=("relu",), epilogue_if="last",
                 operands={"bias": "VLOADU(bias + {o})", "add": "VLOADU(add + {r} * ldc + {o})"})
    code = "\n".join(store(tile, spec))
    assert "bias" not in code and "add" not in code and code.count("VRELU") == 4
    # An operand the same for every row is loaded once per column, under the epilogue's guard.
    hoisted = "\n".join(store(tile, Store(spec.rows, epilogue=("bias",), epilogue_if="last",
                                          operands=spec.operands)))
    assert hoisted.count("VLOADU(bias") == 2 and "if (last) { ep_bias0 =" in hoisted


def test_micro_kernel_checks_its_rows() -> None:
    tile = Tile(("0", "1"), 1, 8)
    with pytest.raises(ValueError, match="1 row operands for a tile of 2 rows"):
        micro_kernel("void k(void)", tile, [Loop("for (;;)")], "b", ["a[0]"], Store(("c", "c")))


def test_store_prefetch_touches_every_line_of_every_row_before_the_reduction() -> None:
    # 24 floats a row: lines start at 0 and 16, and an unaligned row also reaches float 23.
    tile = Tile(("0", "1"), 3, 8)
    spec = Store(("c", "c + ldc"), accumulate="!first", prefetch=True)
    code = micro_kernel("void k(long kc, const float *b, const float *a, float *c, long ldc, "
                        "int first)", tile, [Loop("for (long p = 0; p < kc; p++)")],
                        "VLOAD(b + p * 24 + {o})", ["a[p * 2]", "a[p * 2 + 1]"], spec)
    lines = code.splitlines()
    fetched = [line.strip() for line in lines if "__builtin_prefetch" in line]
    assert fetched == [f"__builtin_prefetch({row} + {o}, 1, 3);"
                       for row in ("c", "c + ldc") for o in (0, 16, 23)]
    last_prefetch = max(i for i, line in enumerate(lines) if "__builtin_prefetch" in line)
    assert last_prefetch < next(i for i, line in enumerate(lines) if "for (long p" in line)
    without = micro_kernel("void k(void)", tile, [Loop("for (;;)")], "b", ["a[0]", "a[1]"],
                           Store(("c", "c + ldc")))
    assert "__builtin_prefetch" not in without


@pytest.mark.parametrize("isa", ISAS)
def test_gelu_erf_holds_its_bound_over_the_whole_line(isa: str) -> None:
    # VGELU_ERF: erf by a quartic per quarter, within 2e-7 |x| of GELU; the infinities and
    # NaN as numpy's 0.5 x (1 + erf(x / sqrt 2)) gives them (GELU(-inf) is -inf * 0: NaN).
    d = dialect(isa)
    lib = c_library(d.prelude + f"""
void run(const float *x, float *y, long n) {{
  for (long i = 0; i < n; i += {d.lanes}) VSTOREU(y + i, VGELU_ERF(VLOADU(x + i)));
}}
""", BASE_FLAGS + d.flags)
    x = np.linspace(-14.0, 14.0, 16 * 4001, dtype=np.float32)
    x[:6] = (np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30)
    y = np.empty_like(x)
    lib.function("run", ("ptr", "ptr", "long"), "void")(x, y, x.size)
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = 0.5 * wide * (1.0 + _ERF(wide / math.sqrt(2.0)))
    assert np.array_equal(y[:5], want[:5].astype(np.float32), equal_nan=True)
    assert np.all(np.abs(y[5:] - want[5:]) <= 2e-7 * np.abs(wide[5:]) + 1e-37)
