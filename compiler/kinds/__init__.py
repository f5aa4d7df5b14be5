"""The op-kind registry of the compiler layer: everything the compiler knows about one kind.

Each kind lives in its own module (``compiler/kinds/<name>.py`` or a package of that name)
and registers one :class:`OpKind` when imported: its signature spec, argument shapes, FLOPs,
schedule class and legal space, default schedule, C emitter and numpy reference. Generic
code (ops, schedules, codegen, runtime, records, store, tuner) finds a kind with
:func:`op_kind` and never branches on a kind's name.

Adding a kind: write its module, add its name to :data:`BUILTIN_KINDS` (or, from another
package, expose it under the ``tunecache.kinds`` entry-point group), and give it a module in
``costmodel/kinds/`` and ``tuner/kinds/`` too. See docs/ARCHITECTURE.md, "Adding an op kind".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from tunecache.compiler.errors import OpSignatureError

if TYPE_CHECKING:
    import numpy as np

    from tunecache.compiler.codegen.isa import IsaDialect
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg
    from tunecache.compiler.schedule import ScheduleData

BUILTIN_KINDS = ("matmul", "batch_matmul", "conv2d", "softmax", "layernorm", "pool2d",
                 "elementwise", "attention", "reorder", "rotary", "lrn", "pwdw")
"""Modules of ``tunecache.compiler.kinds`` loaded on first use, in this order."""

ENTRY_POINT_GROUP = "tunecache.kinds"
"""Third-party kinds: an entry point in this group names a module that registers kinds."""


Emit = Callable[["OpSignature", Any, "IsaDialect"], str]
"""An emitter: (op, validated schedule, dialect) -> the kernel's source body."""


@dataclass(frozen=True, slots=True)
class ChannelView:
    """A kernel's output seen as the ``elementwise`` kind's ``rows x cols``, where an operand
    holding one value per channel broadcasts as ``per_channel`` (an operand mode of that
    kind: ``col``, one value per row, or ``row``, one per column) over ``channels``."""

    rows: int
    cols: int
    per_channel: str
    channels: int


@dataclass(frozen=True, slots=True)
class ChainView:
    """An element-wise chain: ``steps`` over ``rows x cols``, every binary step reading the
    next extra input, broadcast as ``operand`` (an operand mode of the ``elementwise``
    kind)."""

    rows: int
    cols: int
    operand: str
    steps: tuple[str, ...]


@dataclass(frozen=True)
class OpKind:
    """What the compiler knows about one op kind (all of it, in one value).

    * ``spec`` — dims, parameters, attributes and epilogue steps of its signature.
    * ``arguments(op)`` — the kernel's arrays in call order: inputs, then the output.
    * ``flops(op)`` — floating-point operations (a multiply-add counts as two).
    * ``schedule`` — the schedule class (its ``family`` names it in JSON); several kinds may
      share one (``batch_matmul`` uses matmul's).
    * ``problems(op, schedule, hw)`` — every reason a schedule is illegal (empty: legal).
    * ``default_schedule(op, hw, threads)`` — a reasonable schedule without any tuning.
    * ``emit(op, schedule, dialect)`` — the C body of the kernel (the ABI of
      docs/ARCHITECTURE.md), for a schedule already validated.
    * ``reference(op, inputs)`` — the op in numpy, in the inputs' dtype: float64 inputs give
      the ground truth kernels are checked against, float32 inputs the executor's fallback.
    * ``reduction_length(op)`` — terms summed per output (scales the float32 tolerance).
    * ``dim_columns`` — the record column each dim is stored in (see datasets/schema.py).
    * ``baseline`` — what ``bench-op`` compares with: ``numpy`` (the reference in float32,
      timed), ``onnxruntime`` (a one-node model), or ``none``.
    * ``prepacked_timing`` — kernels are timed with their weights (second input) packed once,
      as compiled models run them.
    * ``tolerance(op, inputs)`` — optional (rtol, atol) override for non-reduction kinds.
    * ``random_inputs(op, rng)`` — optional: inputs for tuning and checks where standard
      normal values are not valid (a positive epsilon, say).
    * ``examples`` — op texts of typical uses (model shapes); the registry's contract tests
      and ``tunecache kinds`` use them.
    * ``layout_slots(op)`` — optional, for kinds whose activations may be stored in a blocked
      layout (:mod:`~tunecache.compiler.kinds.layouts`): for each input argument, ``"in"``
      (stored in the op's input layout), ``"out"`` (in its output layout, e.g. a residual)
      or None (layout-free: weights, vectors, scalars). The model's layout planner reads it.
    * ``relayout(op, src, dst)`` — optional, with ``layout_slots``: the same computation
      reading its ``"in"`` activations stored in ``src`` and writing ``dst`` (its ``"out"``
      inputs in ``dst`` too), or None when the kind cannot.
    * ``packed_weights_layout(op, schedule)`` — optional, for kinds with pre-packed weights:
      a value naming the layout ``tc_pack_weights`` writes. Kernels with equal values pack
      the same weights to the same bytes, so a model planned at several input shapes packs
      each weight once per layout.
    * ``fuses(producer, reader)`` — optional: this kind's op computing ``producer`` and then
      ``reader`` (whose first input is the producer's output) in one kernel, or None when it
      cannot. The fused op's inputs are the producer's, then the reader's other inputs
      (:func:`tunecache.compiler.fusion.fuse_pairs` asks every kind after layout planning).
    * ``in_model(op, schedule)`` — optional: the schedule as it runs inside a compiled model,
      where a kernel's input was just written by the kernels before it (the thread split
      that keeps each thread's share of that input in its own core's caches, say), legal
      wherever the given one is (the contract tests check it). Tuning measures, and
      compiles serve, these schedules (:func:`tunecache.compiler.schedule.in_model`).
    * ``bf16_variant(op, hw)`` — optional: for a float32 op with constant weights (its
      second input), the same computation as a bf16 kernel reading the float32 activations,
      and whether it reads those weights transposed (2-D), or None in that place for an op
      without weights whose bf16 kernel rounds its float32 inputs itself (attention); None
      where the kind has no such kernel for ``op``, or none that pays on ``hw``. The
      precision policy (:mod:`tunecache.compiler.precision`) asks it.
    * ``channel_view(op)`` — optional: how ``op``'s output lines up with an element-wise chain
      that could follow in its epilogue (``codegen.epilogue.CHAIN_STEPS`` in its spec's
      ``epilogue_tail``), or None where its kernel has no such epilogue for ``op``.
    * ``chain_view(op)`` — optional: ``op`` as an element-wise chain such an epilogue can
      take, or None (:mod:`tunecache.compiler.lowering.chains` asks both).
    * ``with_narrow(op, tensors)`` — optional: an int8 op holding the named activations (``x``,
      its quantized input, ``y``, its output, ``add``, its residual) as uint8, or None
      where its kernel cannot (:mod:`tunecache.compiler.lowering.u8` asks it).
    """

    name: str
    spec: KindSpec
    arguments: Callable[[OpSignature], tuple[TensorArg, ...]]
    flops: Callable[[OpSignature], int]
    schedule: type[ScheduleData]
    problems: Callable[[OpSignature, Any, HardwareSpec], list[str]]
    default_schedule: Callable[[OpSignature, HardwareSpec, int], ScheduleData]
    emit: Emit
    reference: Callable[[OpSignature, tuple[np.ndarray, ...]], np.ndarray]
    reduction_length: Callable[[OpSignature], int]
    dim_columns: Mapping[str, str]
    baseline: str = "numpy"
    prepacked_timing: bool = False
    tolerance: Callable[[OpSignature, tuple[np.ndarray, ...]], tuple[float, float]] | None = None
    random_inputs: Callable[[OpSignature, np.random.Generator], tuple[np.ndarray, ...]] | None = None
    examples: tuple[str, ...] = ()
    layout_slots: Callable[[OpSignature], tuple[str | None, ...]] | None = None
    relayout: Callable[[OpSignature, str, str], OpSignature | None] | None = None
    packed_weights_layout: Callable[[OpSignature, Any], Hashable] | None = None
    fuses: Callable[[OpSignature, OpSignature], OpSignature | None] | None = None
    in_model: Callable[[OpSignature, Any], Any] | None = None
    bf16_variant: Callable[[OpSignature, HardwareSpec],
                           tuple[OpSignature, bool | None] | None] | None = None
    channel_view: Callable[[OpSignature], ChannelView | None] | None = None
    chain_view: Callable[[OpSignature], ChainView | None] | None = None
    with_narrow: Callable[[OpSignature, frozenset[str]], OpSignature | None] | None = None


_KINDS: dict[str, OpKind] = {}
_EMITTERS: dict[tuple[str, str], Emit] = {}
_loaded = False


def narrow_tensors(op: OpSignature) -> frozenset[str]:
    """The tensors ``op`` holds narrow (its ``narrow`` attribute, in the ``with_narrow``
    vocabulary; none for a kind without the attribute)."""
    held = dict(op.attrs).get("narrow", "none")
    return frozenset() if held == "none" else frozenset(held.split("+"))


def register(kind: OpKind) -> OpKind:
    """Add ``kind`` to the registry (a kind module calls this when imported)."""
    other = _KINDS.get(kind.name)
    if other is not None and other is not kind:
        raise ValueError(f"op kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind
    return kind


def register_emitter(kind: str, dialect: str, emit: Emit) -> Emit:
    """Emit ``kind``'s kernels in ``dialect`` with ``emit`` instead of the kind's own
    emitter (``OpKind.emit``, written in the shared vocabulary): a backend whose dialect
    needs another template for a kind (a CUDA kernel, say) registers it from its own
    package, and neither the kind nor generic code changes."""
    _EMITTERS[(kind, dialect)] = emit
    return emit


def emitter(kind: str, dialect: str) -> Emit:
    """The emitter of ``kind``'s kernels in ``dialect``: a registered one, else the kind's."""
    return _EMITTERS.get((kind, dialect)) or op_kind(kind).emit


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in BUILTIN_KINDS:
        importlib.import_module(f"{__name__}.{name}")
    for point in entry_points(group=ENTRY_POINT_GROUP):
        importlib.import_module(point.value)


def op_kind(name: str) -> OpKind:
    """The registered kind ``name``; :class:`OpSignatureError` naming the known kinds if none."""
    kind = _KINDS.get(name)
    if kind is None:
        _load()
        kind = _KINDS.get(name)
    if kind is None:
        raise OpSignatureError(
            f"unknown kind {name!r}; supported kinds: {', '.join(kind_names())}"
        )
    return kind


def kind_names() -> tuple[str, ...]:
    """Every registered kind, builtins first."""
    return tuple(kind.name for kind in all_kinds())


def all_kinds() -> tuple[OpKind, ...]:
    """Every registered kind, builtins first (in :data:`BUILTIN_KINDS` order)."""
    _load()
    rank = {name: i for i, name in enumerate(BUILTIN_KINDS)}
    return tuple(sorted(_KINDS.values(), key=lambda k: rank.get(k.name, len(rank))))


def schedule_classes() -> dict[str, type[ScheduleData]]:
    """Schedule family name -> class, over every registered kind."""
    out: dict[str, type[ScheduleData]] = {}
    for kind in all_kinds():
        out.setdefault(kind.schedule.family, kind.schedule)
    return out
