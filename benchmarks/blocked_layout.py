"""What keeping activations blocked saves: conv2d kernels with NCHW input and output against
the same convolutions on ``nchw{x}c`` tensors (x = the machine's vector width), each with its
kind's default schedule at 1 thread, weights packed once (as compiled models run).

For every layer the two kernels are timed alternately, ``--repeats`` times each (every
repeat the median of a few in-kernel timed runs), and the median ratio is printed. A
figure, not a test: on a shared machine the numbers are noisy. Extra rows:

* depthwise layers also time the NCHW *plane* kernel (``pack_w=0``), what tuning picks for
  them in NCHW;
* 3x3 layers with padding also time the blocked kernel on an input that already holds its
  zero border (``pads=0`` on a 58x58 input), which isolates what the kernel's row copy of a
  padded blocked input costs.

    python benchmarks/blocked_layout.py [--repeats 15] [--block 8]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, default_conv2d_schedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import compile_kernel, random_inputs

HW = local_spec()


@dataclass(frozen=True)
class Layer:
    """A square convolution at batch 1 (bias and relu fused)."""

    label: str
    C: int
    H: int
    F: int
    R: int
    stride: int = 1
    pads: int = 0
    groups: int = 1

    def op(self, layout: str = "nchw", border: int = 0) -> OpSignature:
        """The layer on ``layout`` tensors; ``border`` moves the padding into the input."""
        return conv2d_op(1, self.C, self.H + 2 * border, self.H + 2 * border, self.F, self.R,
                         self.R, stride=self.stride, pads=self.pads - border,
                         groups=self.groups, epilogue="bias+relu", layout=layout,
                         out_layout=layout)


LAYERS = [
    Layer("ResNet-50 3x3 64->64 56x56", 64, 56, 64, 3, pads=1),
    Layer("ResNet-50 1x1 256->64 56x56", 256, 56, 64, 1),
    Layer("ResNet-50 3x3/2 128->128 56x56", 128, 56, 128, 3, stride=2, pads=1),
    Layer("MobileNet-v2 dw 3x3 144ch 56x56", 144, 56, 144, 3, pads=1, groups=144),
]


def timer(op: OpSignature, schedule: Conv2dSchedule) -> Callable[[], float]:
    """Seconds per call of ``op`` under ``schedule`` (weights bound when the kernel packs
    them; median of 5 runs of a batch of calls sized to about 20 ms)."""
    kernel = compile_kernel(op, schedule, HW)
    inputs = random_inputs(op, seed=0)
    out = np.empty(op.arguments()[-1].shape, dtype=np.float32)
    if kernel.prepacks_weights:
        bound = kernel.bind_weights(inputs[1])
        rest = (inputs[0], *inputs[2:])

        def calls(iters: int) -> float:
            return bound.time(*rest, out=out, iters=iters)
    else:
        def calls(iters: int) -> float:
            return kernel.time(*inputs, out=out, iters=iters)
    iters = max(1, int(0.02 / max(calls(3) / 3, 1e-7)))

    def run() -> float:
        return statistics.median(calls(iters) / iters for _ in range(5))
    return run


def compare(timers: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median seconds of each timer, the timers interleaved repeat by repeat."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, run in timers.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--block", type=int, default=HW.lanes,
                        help="channel block x of nchw{x}c (default: the vector width)")
    args = parser.parse_args()
    blocked = f"nchw{args.block}c"
    print(f"{HW.cpu_model}, {HW.isa}, 1 thread, weights bound, {args.repeats} repeats "
          f"(medians; a shared machine: noisy)")
    print(f"{'layer':34} {'nchw µs':>9} {blocked + ' µs':>12} {'ratio':>6}  extra")
    for layer in LAYERS:
        plain, block = layer.op(), layer.op(blocked)
        timers = {"nchw": timer(plain, default_conv2d_schedule(plain, HW)),
                  blocked: timer(block, default_conv2d_schedule(block, HW))}
        if layer.groups > 1:
            plane = Conv2dSchedule(oc_block=HW.lanes, ow_block=2 * HW.lanes, oh_block=2,
                                   ic_block=1, pack_w=0)
            timers["nchw plane"] = timer(plain, plane)
        if layer.pads and layer.stride == 1:
            pre = layer.op(blocked, border=layer.pads)
            timers["pre-padded"] = timer(pre, default_conv2d_schedule(pre, HW))
        got = compare(timers, args.repeats)
        extra = "  ".join(f"{name} {got[name] * 1e6:.0f} µs" for name in timers
                          if name not in ("nchw", blocked))
        print(f"{layer.label:34} {got['nchw'] * 1e6:9.0f} {got[blocked] * 1e6:12.0f} "
              f"{got['nchw'] / got[blocked]:6.2f}  {extra}")


if __name__ == "__main__":
    main()
