"""Kernels' OpenMP threads wait politely unless the user chose a policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tunecache.compiler.backends.cpu.threads import DEFAULT_SPINCOUNT, configure_openmp

_LOAD_A_KERNEL = (
    "import os; from tunecache.compiler.hardware import local_spec;"
    "from tunecache.compiler.ops import OpSignature as O;"
    "from tunecache.compiler.runtime import compile_kernel;"
    "from tunecache.compiler.schedule import default_schedule;"
    "op = O.parse('matmul(M=8,N=8,K=8)');"
    "compile_kernel(op, default_schedule(op, local_spec()), local_spec());"
    "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
)


def test_a_short_spin_is_set_only_when_the_user_set_nothing(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    configure_openmp()
    assert os.environ["GOMP_SPINCOUNT"] == str(DEFAULT_SPINCOUNT)
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    configure_openmp()
    assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize(("env", "expected"), [
    ({}, f"{DEFAULT_SPINCOUNT} None"),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "None PASSIVE"),
    ({"GOMP_SPINCOUNT": "7"}, "7 None"),
])
def test_loading_a_kernel_sets_the_policy_before_libgomp_reads_it(env: dict[str, str],
                                                                   expected: str) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", _LOAD_A_KERNEL], env={**base, **env},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == expected
