"""``LSTM``, ``GRU`` and ``RNN`` unrolled over their (static) sequence into the nodes they
compute, so the gate products become matmul kernels and the gate arithmetic element-wise
kernels.

Per direction, the input projection of every time step is one ``MatMul`` of the whole
sequence by the transposed input weights, the biases added (a matmul kernel with a fused
bias: the large product of a recurrent layer); a ``Split`` cuts it into steps. Each step
multiplies the previous hidden state by the transposed recurrence weights (a small matmul
kernel), adds its projection and applies the gates as ONNX defines them (``Split`` into
gates, ``Sigmoid``/``Tanh``/``Relu``, ``Mul``, ``Add``: element-wise chains). The hidden
states are concatenated into ``Y`` (in time order for either direction), the last ones into
``Y_h`` (and ``Y_c``). Missing initial states are zero constants.

``clip`` is a Clip before every activation; LSTM's ``input_forget`` computes ``f = 1 - i``.
Left to the reference implementation: weights or biases that are not constants, a
``sequence_lens`` that is not a constant equal to the sequence length everywhere,
activations other than Sigmoid/Tanh/Relu (or with parameters), shapes not known at load,
and sequences longer than :data:`MAX_STEPS` steps over all directions (the unrolled graph
grows with them). The reference ignores ``clip``, ``input_forget``, ``sequence_lens`` and
LSTM's and GRU's ``activations``: :func:`reference_problem` says why such a node left over
would be answered wrongly, and the loader refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import NodeChain, RewriteTensors, rewrite_each

__all__ = ["MAX_STEPS", "recurrent_layers", "reference_problem"]

MAX_STEPS = 512
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"),
                        "RNN": ("Tanh",)}
_ACTIVATIONS = {"Sigmoid", "Tanh", "Relu"}
_UNROLL_HINT = ("is not supported (ONNX's reference implementation ignores it, and the node "
                "could not be unrolled into kernels: its weights must be constants and its "
                "shapes known)")


@dataclass(frozen=True)
class _Layer:
    """What one recurrent node computes, read from its inputs and attributes."""

    op: str
    seq: int
    batch: int
    hidden: int
    directions: int
    reverse: bool        # a single direction run backwards
    batch_first: bool
    activations: tuple[str, ...]
    before_reset: bool   # GRU's linear_before_reset
    clip: float | None   # bound on every activation's input
    input_forget: bool   # LSTM's forget gate coupled to the input gate: f = 1 - i

    @property
    def gates(self) -> int:
        return _GATES[self.op]

    def state_shape(self) -> tuple[int, int, int]:
        return (1, self.batch, self.hidden)


def recurrent_layers(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each LSTM, GRU and RNN this module handles unrolled."""
    return rewrite_each(nodes, tensors, _layer, _unroll)


def reference_problem(node: ReadNode, tensors: RewriteTensors) -> str | None:
    """Why ONNX's reference implementation would answer a recurrent node left after the
    rewrite wrongly (it ignores ``clip``, LSTM's ``input_forget``, ``sequence_lens`` and,
    for LSTM and GRU, the ``activations``), or None."""
    if node.domain or node.op_type not in _GATES:
        return None
    attrs = node.attrs
    lengths = tensors.constants.get(_input(node, 4) or "")
    x_shape = tensors.shapes.get(node.inputs[0]) or ()
    seq = x_shape[1 if int(attrs.get("layout", 0)) else 0] if len(x_shape) == 3 else None
    if lengths is not None and seq is not None and not (lengths == seq).all():
        return f"sequence_lens shorter than the sequence {_UNROLL_HINT}"
    if "clip" in attrs:
        return f"clip {_UNROLL_HINT}"
    if int(attrs.get("input_forget", 0)):
        return f"input_forget {_UNROLL_HINT}"
    names = tuple(str(a) for a in attrs.get("activations") or ())
    default = _DEFAULT_ACTIVATIONS[node.op_type]
    if node.op_type != "RNN" and names and names != default * (len(names) // len(default)):
        return f"activations {list(names)} {_UNROLL_HINT}"
    return None


def _input(node: ReadNode, k: int) -> str | None:
    return node.inputs[k] if len(node.inputs) > k and node.inputs[k] else None


def _layer(node: ReadNode, tensors: RewriteTensors) -> _Layer | None:
    if node.domain or node.op_type not in _GATES or _input(node, 1) is None:
        return None
    x_shape = tensors.shapes.get(node.inputs[0])
    weights = [tensors.constants.get(n) if n else None for n in (_input(node, 1),
                                                                  _input(node, 2))]
    if x_shape is None or len(x_shape) != 3 or None in x_shape or \
            any(w is None for w in weights) or \
            tensors.dtypes.get(node.inputs[0]) != np.float32:
        return None
    attrs = node.attrs
    directions = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    batch_first = int(attrs.get("layout", 0)) == 1
    seq, batch = (int(x_shape[1] or 0), int(x_shape[0] or 0)) if batch_first else \
        (int(x_shape[0] or 0), int(x_shape[1] or 0))
    hidden = int(attrs.get("hidden_size", 0))
    names = tuple(str(a) for a in attrs.get("activations") or
                  _DEFAULT_ACTIVATIONS[node.op_type] * directions)
    if hidden < 1 or \
            seq * directions > MAX_STEPS or not set(names) <= _ACTIVATIONS or \
            attrs.get("activation_alpha") or attrs.get("activation_beta") or \
            len(names) != len(_DEFAULT_ACTIVATIONS[node.op_type]) * directions or \
            not _constants_fit(node, tensors, seq, hidden * _GATES[node.op_type]):
        return None
    clip = attrs.get("clip")
    return _Layer(node.op_type, seq, batch, hidden, directions,
                  attrs.get("direction", "forward") == "reverse", batch_first, names,
                  bool(int(attrs.get("linear_before_reset", 0))),
                  None if clip is None else float(clip), bool(int(attrs.get("input_forget", 0))))


def _constants_fit(node: ReadNode, tensors: RewriteTensors, seq: int, rows: int) -> bool:
    """Biases and peepholes constants (or absent), sequence lengths absent or all ``seq``,
    and weights of ``rows`` gate rows."""
    w = tensors.constants[node.inputs[1]]
    if w.dtype != np.float32 or w.shape[1] != rows:
        return False
    lengths = _input(node, 4)
    if lengths is not None:
        value = tensors.constants.get(lengths)
        if value is None or not (value == seq).all():
            return False
    optional = [_input(node, 3)] + ([_input(node, 7)] if node.op_type == "LSTM" else [])
    return all(name is None or name in tensors.constants for name in optional)


def _unroll(node: ReadNode, layer: _Layer, tensors: RewriteTensors) -> list[ReadNode]:
    chain = NodeChain(node, tensors)
    x = node.inputs[0]
    if layer.batch_first:
        x = chain.add("Transpose", (x,), (layer.seq, layer.batch, tensors.shapes[x][2]),
                      perm=(1, 0, 2))
    finals: list[list[str]] = []
    sequences: list[str] = []
    for d in range(layer.directions):
        steps, last = _direction(chain, node, layer, x, d)
        finals.append(last)
        sequences.append(chain.add("Concat", tuple(steps),
                                   (layer.seq, layer.batch, layer.hidden), axis=0))
    _outputs(chain, node, layer, sequences, finals)
    return chain.made


def _direction(chain: NodeChain, node: ReadNode, layer: _Layer, x: str, d: int
               ) -> tuple[list[str], list[str]]:
    """The hidden state of every step of direction ``d`` in time order, and its last
    states (hidden, and the cell's for an LSTM)."""
    tensors, width = chain.tensors, layer.gates * layer.hidden
    w = tensors.constants[node.inputs[1]][d]
    bias, peep = _input(node, 3), _input(node, 7) if layer.op == "LSTM" else None
    b = tensors.constants[bias][d] if bias else np.zeros(2 * width, np.float32)
    p = tensors.constants[peep][d] if peep else None
    weights = _Weights(tensors.constants[node.inputs[2]][d], b,
                       p if p is not None and p.any() else None, d)
    cell = _CELLS[layer.op]
    projected = chain.add(
        "MatMul", (x, chain.constant("w", np.ascontiguousarray(w.T))),
        (layer.seq, layer.batch, width))
    projected = chain.add("Add", (projected, chain.constant("b", _summed_bias(b, layer))),
                          (layer.seq, layer.batch, width))
    step_shape = (1, layer.batch, width)
    inputs = chain.split(projected, 0, [1] * layer.seq, [step_shape] * layer.seq)
    state = [_initial(chain, node, layer, k, d) for k in cell.initial_inputs]
    order = range(layer.seq - 1, -1, -1) if layer.reverse or d == 1 else range(layer.seq)
    hidden: dict[int, str] = {}
    acts = layer.activations[d * len(_DEFAULT_ACTIVATIONS[layer.op]):]
    for t in order:
        state = cell.step(chain, layer, inputs[t], state, weights, acts)
        hidden[t] = state[0]
    return [hidden[t] for t in range(layer.seq)], state


def _initial(chain: NodeChain, node: ReadNode, layer: _Layer, k: int, d: int) -> str:
    """Direction ``d``'s slice of the initial state at input ``k``, or zeros."""
    name = _input(node, k)
    if name is None:
        return chain.shared_constant("zeros", lambda: np.zeros(layer.state_shape(), np.float32))
    if layer.batch_first:  # [batch, directions, hidden]
        name = chain.add("Transpose", (name,), (layer.directions, layer.batch, layer.hidden),
                         perm=(1, 0, 2))
    if layer.directions == 1:
        return name
    return chain.split(name, 0, [1, 1], [layer.state_shape()] * 2)[d]


def _outputs(chain: NodeChain, node: ReadNode, layer: _Layer, sequences: list[str],
             finals: list[list[str]]) -> None:
    """Write the node's outputs: ``Y`` from the sequences, ``Y_h``/``Y_c`` from the last
    states, each in the node's layout."""
    s, b, h, n = layer.seq, layer.batch, layer.hidden, layer.directions
    wanted = [o if k < len(node.outputs) else "" for k, o in enumerate(node.outputs)]
    if wanted and wanted[0]:
        stacked = [chain.reshape(q, (s, 1, b, h)) for q in sequences]
        y = stacked[0] if n == 1 else chain.add("Concat", tuple(stacked), (s, n, b, h), axis=1)
        if layer.batch_first:
            y = chain.add("Transpose", (y,), (b, s, n, h), perm=(2, 0, 1, 3))
        _write(chain, y, wanted[0])
    for k, output in enumerate(wanted[1:3]):
        if not output or k >= len(finals[0]):
            continue
        parts = tuple(f[k] for f in finals)
        last = parts[0] if n == 1 else chain.add("Concat", parts, (n, b, h), axis=0)
        if layer.batch_first:
            last = chain.add("Transpose", (last,), (b, n, h), perm=(1, 0, 2))
        _write(chain, last, output)


def _write(chain: NodeChain, tensor: str, output: str) -> None:
    """Make ``tensor`` the node's ``output``: the producer writes it, or (a graph tensor or a
    state read elsewhere too) an Identity copies it."""
    if any(tensor in m.outputs for m in chain.made) and \
            sum(tensor in m.inputs for m in chain.made) == 0:
        chain.rename(tensor, output)
        return
    identity = chain.add("Identity", (tensor,), chain.tensors.shapes[tensor])
    chain.rename(identity, output)


@dataclass(frozen=True)
class _Weights:
    """One direction's recurrence weights ``[gates*H, H]``, biases ``[2*gates*H]`` and an
    LSTM's peepholes ``[3*H]`` (i, o, f), or None."""

    r: np.ndarray
    b: np.ndarray
    peepholes: np.ndarray | None
    direction: int


@dataclass(frozen=True)
class _Cell:
    """One recurrent cell: the initial-state inputs it reads and one step."""

    initial_inputs: tuple[int, ...]
    step: Callable[[NodeChain, _Layer, str, list[str], _Weights, tuple[str, ...]], list[str]]


def _activate(chain: NodeChain, layer: _Layer, op_type: str, tensor: str) -> str:
    """``op_type`` applied to ``tensor``, clipped first to ``[-clip, clip]`` when the node
    has a clip."""
    shape = layer.state_shape()
    if layer.clip is not None:
        if chain.tensors.opset < 11:
            tensor = chain.add("Clip", (tensor,), shape, min=-layer.clip, max=layer.clip)
        else:
            clip = layer.clip
            bounds = (chain.shared_constant("low", lambda: np.array(-clip, np.float32)),
                      chain.shared_constant("high", lambda: np.array(clip, np.float32)))
            tensor = chain.add("Clip", (tensor, *bounds), shape)
    return chain.add(op_type, (tensor,), shape)


def _recurrence(chain: NodeChain, layer: _Layer, h: str, weights: _Weights, rows: slice,
                name: str) -> str:
    """``h @ r[rows].T``: the step's product with the recurrence weights (one transposed
    copy of them per direction, however many steps read it)."""
    r = weights.r
    weight = chain.shared_constant(f"{name}{weights.direction}_{rows.start}_{rows.stop}",
                                   lambda: np.ascontiguousarray(r[rows].T))
    return chain.add("MatMul", (h, weight), (1, layer.batch, rows.stop - rows.start))


def _lstm_step(chain: NodeChain, layer: _Layer, projected: str, state: list[str],
               weights: _Weights, acts: tuple[str, ...]) -> list[str]:
    h, c = state
    n, shape = layer.hidden, layer.state_shape()
    total = chain.add("Add", (projected, _recurrence(chain, layer, h, weights,
                                                     slice(0, 4 * n), "r")),
                      (1, layer.batch, 4 * n))
    i, o, f, g = chain.split(total, 2, [n] * 4, [shape] * 4)

    def peephole(gate: str, k: int, cell: str) -> str:
        if weights.peepholes is None:
            return gate
        peepholes = weights.peepholes
        p = chain.shared_constant(f"p{weights.direction}_{k}",
                                  lambda: peepholes[k * n:(k + 1) * n].copy())
        return chain.add("Add", (gate, chain.add("Mul", (cell, p), shape)), shape)

    i = _activate(chain, layer, acts[0], peephole(i, 0, c))
    if layer.input_forget:
        one = chain.shared_constant("one", lambda: np.ones(1, np.float32))
        f = chain.add("Sub", (one, i), shape)
    else:
        f = _activate(chain, layer, acts[0], peephole(f, 2, c))
    g = _activate(chain, layer, acts[1], g)
    c = chain.add("Add", (chain.add("Mul", (f, c), shape), chain.add("Mul", (i, g), shape)),
                  shape)
    o = _activate(chain, layer, acts[0], peephole(o, 1, c))
    return [chain.add("Mul", (o, chain.add(acts[2], (c,), shape)), shape), c]


def _gru_step(chain: NodeChain, layer: _Layer, projected: str, state: list[str],
              weights: _Weights, acts: tuple[str, ...]) -> list[str]:
    (h,), b = state, weights.b
    n, shape = layer.hidden, layer.state_shape()
    xz, xr, xh = chain.split(projected, 2, [n] * 3, [shape] * 3)
    parts = 3 if layer.before_reset else 2
    hz, hr, *rest = chain.split(_recurrence(chain, layer, h, weights, slice(0, parts * n), "r"), 2,
                                [n] * parts, [shape] * parts)
    z = _activate(chain, layer, acts[0], chain.add("Add", (xz, hz), shape))
    reset = _activate(chain, layer, acts[0], chain.add("Add", (xr, hr), shape))
    if layer.before_reset:  # r * (h @ Rh.T + Rbh)
        rbh = chain.shared_constant(f"rbh{weights.direction}", lambda: b[5 * n:6 * n].copy())
        hh = chain.add("Mul", (reset, chain.add("Add", (rest[0], rbh), shape)), shape)
    else:  # (r * h) @ Rh.T
        hh = _recurrence(chain, layer, chain.add("Mul", (reset, h), shape), weights,
                         slice(2 * n, 3 * n), "rh")
    candidate = _activate(chain, layer, acts[1], chain.add("Add", (xh, hh), shape))
    # (1 - z) * candidate + z * h = candidate + z * (h - candidate)
    kept = chain.add("Mul", (z, chain.add("Sub", (h, candidate), shape)), shape)
    return [chain.add("Add", (candidate, kept), shape)]


def _rnn_step(chain: NodeChain, layer: _Layer, projected: str, state: list[str],
              weights: _Weights, acts: tuple[str, ...]) -> list[str]:
    (h,) = state
    total = chain.add("Add", (projected, _recurrence(chain, layer, h, weights,
                                                     slice(0, layer.hidden), "r")),
                      layer.state_shape())
    return [_activate(chain, layer, acts[0], total)]


def _summed_bias(b: np.ndarray, layer: _Layer) -> np.ndarray:
    """The input and recurrence biases, added once to the input projection; with GRU's
    ``linear_before_reset`` the candidate's recurrence bias is applied inside the reset
    product instead, so it stays out."""
    width = layer.gates * layer.hidden
    summed = (b[:width] + b[width:]).astype(np.float32)
    if layer.before_reset:
        summed[2 * layer.hidden:] = b[2 * layer.hidden:width]
    return summed


_CELLS = {"LSTM": _Cell((5, 6), _lstm_step), "GRU": _Cell((5,), _gru_step),
          "RNN": _Cell((5,), _rnn_step)}
