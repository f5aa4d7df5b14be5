"""A model's input shapes on the command line: ``--input-shape NAME=D1,...`` flags and
``--inputs FILE.npz`` arrays checked against the model's declared inputs, shared by
``tune``, ``compile`` and ``run``. Errors name the flag at fault."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np

from tunecache.compiler import frontend
from tunecache.compiler.errors import TunecacheError

F = TypeVar("F", bound=Callable[..., Any])


class InputShapeError(TunecacheError):
    """A malformed --input-shape, or shapes that do not fit the model."""


def parse_input_shapes(values: tuple[str, ...]) -> dict[str, list[int]] | None:
    """``--input-shape NAME=D1,D2,...`` flags as a mapping (None when there are none)."""
    shapes: dict[str, list[int]] = {}
    for value in values:
        name, sep, dims = value.partition("=")
        try:
            shape = [int(d) for d in dims.split(",")] if sep and dims else []
        except ValueError:
            shape = []
        if not name or not shape or any(d < 1 for d in shape):
            raise InputShapeError(f"--input-shape {value!r}: expected NAME=D1,D2,... with "
                                  "positive integers, e.g. input=1,3,224,224")
        shapes[name] = shape
    return shapes or None


def input_shape_option(func: F) -> F:
    return click.option("--input-shape", "input_shapes", multiple=True,
                        metavar="NAME=D1,D2,...",
                        help="Fix a dynamic input's shape. Repeatable.")(func)


@dataclass(frozen=True)
class Inputs:
    """The arrays of ``--inputs FILE``."""

    path: Path
    arrays: dict[str, np.ndarray]


def resolve_shapes(info: frontend.ModelInfo, flags: dict[str, list[int]],
                   inputs: Inputs | None) -> dict[str, list[int]] | None:
    """The input shapes to plan now: --input-shape, then the shapes of the --inputs arrays,
    then what dimension names imply; None when some dynamic dimension stays open. Errors
    name the flag at fault."""
    declared = {i.name: i for i in info.inputs}
    listing = ", ".join(f"{n} {info.describe(n)}" for n in declared) or "none"

    def fits(name: str, shape: Sequence[int]) -> bool:
        want = declared[name].shape
        return len(want) == len(shape) and all(w < 0 or w == d for w, d in zip(want, shape,
                                                                               strict=True))

    for name, shape in flags.items():
        if name not in declared:
            raise InputShapeError(f"--input-shape names {name!r}, which is not an input of "
                                  f"{info.name!r}; its inputs: {listing}")
        if not fits(name, shape):
            raise InputShapeError(f"--input-shape {name}={','.join(map(str, shape))}: the "
                                  f"model declares {name} {info.describe(name)}")
    shapes = dict(flags)
    if inputs is not None:
        where = f"--inputs {inputs.path}"
        missing = [n for n in declared if n not in inputs.arrays]
        extra = sorted(set(inputs.arrays) - set(declared))
        if missing or extra:
            parts = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + (
                [f"unknown {', '.join(map(repr, extra))}"] if extra else [])
            raise InputShapeError(f"{where}: {'; '.join(parts)}; the model's inputs are "
                                  f"{listing}")
        for name, array in inputs.arrays.items():
            if not fits(name, array.shape):
                raise InputShapeError(f"{where}: {name!r} has shape {list(array.shape)}; the "
                                      f"model declares {name} {info.describe(name)}")
            if name in flags and tuple(flags[name]) != array.shape:
                raise InputShapeError(f"--input-shape {name}={','.join(map(str, flags[name]))} "
                                      f"contradicts {name!r} in {where}, of shape "
                                      f"{list(array.shape)}")
            shapes[name] = list(array.shape)
    complete = info.complete(shapes)
    return None if complete is None else {k: list(v) for k, v in complete.items()}


def open_inputs(info: frontend.ModelInfo,
                how: str = "give --inputs FILE.npz or --input-shape") -> str:
    """The dynamic inputs left open, then ``how`` to fix them, naming the flags."""
    shown = [i.name for i in info.inputs if any(d < 0 for d in i.shape)]
    example = shown[0] if shown else "NAME"
    verb = "have" if len(shown) > 1 else "has"
    return (", ".join(f"{n!r} {info.describe(n)}" for n in shown) + f" {verb} dynamic "
            f"dimensions; {how} {example}=D1,D2,...")
