"""Named workload suites: the kernel-worthy ops of real models, with shapes and counts.

A :class:`Suite` is a tuple of :class:`Workload` values (op signature, how many times the
model runs it, and where). Nightly jobs tune a suite's distinct ops
(``tunecache tune --suite bert_base``), weighting the time budget by FLOPs x count;
benchmarks report them.

Transformer suites are batch 1 with the sequence length in their description.

Convolution suites are batch 1 at 224x224 with batch-norm folded into the convolution (hence
``bias``), ReLU fused (MobileNet-v2's ReLU6 is listed as ``relu``, as it was before the
``clip6`` epilogue existed, so the suite's ops and their tuning data stay the same), and the
residual add fused into the convolution that precedes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature


class UnknownSuiteError(TunecacheError, KeyError):
    """No suite has this name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown suite"


@dataclass(frozen=True, slots=True)
class Workload:
    """One distinct op of a model: the signature, its count per inference, and a label."""

    op: OpSignature
    count: int
    label: str

    @property
    def weight(self) -> float:
        """Expected benefit of tuning it: FLOPs per inference spent in this op."""
        return float(self.op.flops * self.count)


@dataclass(frozen=True, slots=True)
class Suite:
    """A named list of workloads (one per distinct op signature)."""

    name: str
    description: str
    workloads: tuple[Workload, ...]

    @property
    def ops(self) -> tuple[OpSignature, ...]:
        return tuple(w.op for w in self.workloads)

    @property
    def flops(self) -> int:
        """FLOPs of one inference over the suite's ops (counts included)."""
        return sum(w.op.flops * w.count for w in self.workloads)


def _merge(name: str, description: str, items: list[tuple[str, OpSignature, int]]) -> Suite:
    merged: dict[OpSignature, Workload] = {}
    for label, op, count in items:
        if op in merged:
            old = merged[op]
            merged[op] = Workload(op, old.count + count, f"{old.label}; {label}")
        else:
            merged[op] = Workload(op, count, label)
    return Suite(name, description, tuple(merged.values()))


def _conv(c: int, hw: int, f: int, k: int, stride: int = 1, groups: int = 1,
          epilogue: str = "bias+relu") -> OpSignature:
    pad = k // 2
    return conv2d_op(1, c, hw, hw, f, k, k, stride=stride, pads=pad, groups=groups,
                              epilogue=epilogue)


def _resnet50() -> Suite:
    items: list[tuple[str, OpSignature, int]] = [
        ("conv1 7x7/2", _conv(3, 224, 64, 7, 2), 1),
    ]
    # (stage, input size, in channels of the stage, bottleneck width, out channels, blocks)
    stages = [(1, 56, 64, 64, 256, 3), (2, 56, 256, 128, 512, 4), (3, 28, 512, 256, 1024, 6),
              (4, 14, 1024, 512, 2048, 3)]
    for stage, size, cin, width, cout, blocks in stages:
        stride = 1 if stage == 1 else 2
        out = size // stride
        tag = f"layer{stage}"
        # torchvision ResNet-50 v1.5: the stride sits on the 3x3 convolution.
        items += [
            (f"{tag}.0 conv1 1x1", _conv(cin, size, width, 1), 1),
            (f"{tag}.0 conv2 3x3/{stride}", _conv(width, size, width, 3, stride), 1),
            (f"{tag}.0 conv3 1x1 +residual", _conv(width, out, cout, 1, epilogue="bias+add+relu"),
             1),
            (f"{tag}.0 downsample 1x1/{stride}", _conv(cin, size, cout, 1, stride, epilogue="bias"),
             1),
        ]
        if blocks > 1:
            n = blocks - 1
            items += [
                (f"{tag}.1+ conv1 1x1", _conv(cout, out, width, 1), n),
                (f"{tag}.1+ conv2 3x3", _conv(width, out, width, 3), n),
                (f"{tag}.1+ conv3 1x1 +residual",
                 _conv(width, out, cout, 1, epilogue="bias+add+relu"), n),
            ]
    items.append(("fc 2048->1000 (Gemm transB)",
                  matmul_op(1, 1000, 2048, trans_b=True, epilogue="bias"), 1))
    return _merge("resnet50", "ResNet-50 v1.5 convolutions and classifier, batch 1, 224x224",
                  items)


def _mobilenet_v2() -> Suite:
    items: list[tuple[str, OpSignature, int]] = [
        ("stem 3x3/2", _conv(3, 224, 32, 3, 2), 1),
    ]
    size, cin = 112, 32
    # (expansion t, out channels c, repeats n, first stride s) from the paper's table 2.
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]
    for block, (t, c, n, s) in enumerate(settings):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            tag = f"block{block}.{i}"
            if t != 1:
                items.append((f"{tag} expand 1x1", _conv(cin, size, hidden, 1), 1))
            items.append((f"{tag} depthwise 3x3/{stride}",
                          _conv(hidden, size, hidden, 3, stride, groups=hidden), 1))
            size //= stride
            residual = stride == 1 and cin == c
            items.append((f"{tag} project 1x1" + (" +residual" if residual else ""),
                          _conv(hidden, size, c, 1, epilogue="bias+add" if residual else "bias"),
                          1))
            cin = c
    items.append(("last 1x1", _conv(cin, size, 1280, 1), 1))
    items.append(("classifier 1280->1000 (Gemm transB)",
                  matmul_op(1, 1000, 1280, trans_b=True, epilogue="bias"), 1))
    return _merge("mobilenet_v2",
                  "MobileNet-v2 (width 1.0) convolutions and classifier, batch 1, 224x224", items)


MM, BMM = matmul_op, batch_matmul_op


def _transformer(name: str, description: str, seq: int, hidden: int, heads: int, ffn: int,
                 layers: int) -> Suite:
    head = hidden // heads
    items: list[tuple[str, OpSignature, int]] = [
        ("Q/K/V/output projections", MM(seq, hidden, hidden, epilogue="bias"), 4 * layers),
        ("attention Q·Kᵀ", BMM(heads, seq, seq, head, trans_b=True), layers),
        ("attention P·V", BMM(heads, seq, head, seq), layers),
        ("FFN up", MM(seq, ffn, hidden, epilogue="bias"), layers),
        ("FFN down", MM(seq, hidden, ffn, epilogue="bias"), layers),
    ]
    return _merge(name, description, items)


def _gpt2() -> Suite:
    items: list[tuple[str, OpSignature, int]] = [
        ("attention QKV (fused)", MM(64, 2304, 768, epilogue="bias"), 12),
        ("attention Q·Kᵀ", BMM(12, 64, 64, 64, trans_b=True), 12),
        ("attention P·V", BMM(12, 64, 64, 64), 12),
        ("attention output", MM(64, 768, 768, epilogue="bias"), 12),
        ("MLP up", MM(64, 3072, 768, epilogue="bias"), 12),
        ("MLP down", MM(64, 768, 3072, epilogue="bias"), 12),
        ("decode QKV", MM(1, 2304, 768, epilogue="bias"), 12),
        ("decode MLP up", MM(1, 3072, 768, epilogue="bias"), 12),
        ("decode MLP down", MM(1, 768, 3072, epilogue="bias"), 12),
    ]
    return _merge("gpt2", "GPT-2 small (12 layers, hidden 768, 12 heads): a 64-token prompt and "
                  "the per-token decode GEMMs, batch 1", items)


def _smoke() -> Suite:
    return _merge("smoke", "Four small GEMMs that tune in seconds (quickstart, CI)", [
        ("small dense + relu", MM(64, 128, 96, epilogue="bias+relu"), 4),
        ("small dense, Wᵀ", MM(32, 256, 64, trans_b=True, epilogue="bias"), 2),
        ("small attention scores", BMM(4, 32, 32, 16, trans_b=True), 2),
        ("vector × matrix", MM(1, 256, 128, epilogue="bias"), 1),
    ])


SUITES: dict[str, Suite] = {s.name: s for s in (
    _resnet50(),
    _mobilenet_v2(),
    _transformer("bert_base", "BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072), "
                 "sequence 128, batch 1", 128, 768, 12, 3072, 12),
    _transformer("bert_layer", "One BERT-base encoder layer, sequence 128, batch 1",
                 128, 768, 12, 3072, 1),
    _gpt2(),
    _smoke(),
)}
"""Every named suite, by name."""


def get_suite(name: str) -> Suite:
    """The suite called ``name``; :class:`UnknownSuiteError` lists the known names."""
    try:
        return SUITES[name]
    except KeyError:
        raise UnknownSuiteError(
            f"unknown suite {name!r}; known suites: {', '.join(sorted(SUITES))}"
        ) from None
