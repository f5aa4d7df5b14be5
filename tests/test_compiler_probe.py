"""The peak and bandwidth probes: real generated kernels, sized to the register file."""

from __future__ import annotations

import math
import re

import pytest

from tunecache.compiler.backends.cpu.isa import X86_LEVELS
from tunecache.compiler.backends.cpu.probe import (
    _source,
    chains,
    measure_bandwidth_gbs,
    measure_peak_gflops,
)
from tunecache.compiler.hardware import isa_level, local_spec


@pytest.mark.parametrize("isa", sorted(level.name for level in X86_LEVELS))
def test_the_fma_chains_and_their_operands_fit_the_register_file(isa: str) -> None:
    """Sixteen chains plus two operands spilled on AVX2's sixteen registers, and the probe
    read 57% of the core's real peak; every ISA now keeps at least the 8 chains two FMA
    pipes of latency 4 need."""
    n = chains(isa)
    assert n >= 8 and n + 2 <= isa_level(isa).vector_registers
    assert len(re.findall(r"a\d+ = VFMA\(a\d+, x, y\);", _source(isa))) == n


def test_the_probes_measure_on_this_machine() -> None:
    hw = local_spec()
    peak = measure_peak_gflops(hw, threads=1, seconds=0.05)
    bandwidth = measure_bandwidth_gbs(hw, threads=1, mib=8)
    assert math.isfinite(peak) and peak > 0
    assert math.isfinite(bandwidth) and bandwidth > 0
