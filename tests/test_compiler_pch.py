"""Precompiled headers: built once per flag set, used by every kernel with those flags,
never trusted when their bytes do not match their record, and never needed for a build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_compiler_build import calls, counting_compiler

from tunecache.compiler.backends.cpu import pch
from tunecache.compiler.backends.cpu.build import build, build_source, find_compiler
from tunecache.compiler.codegen import generate
from tunecache.compiler.files import matching_digest
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import load_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule

HW = local_spec()
OPS = [matmul_op(24, 40, 16, epilogue=e) for e in ("bias", "relu", "bias+relu")]
"""One shape, so one flag set."""


@pytest.fixture
def logged_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A compiler that logs its runs, and a fresh per-process record of checked headers."""
    wrapper, log = counting_compiler(tmp_path)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setattr(pch, "_known", {})
    return log


def _build_and_check(op: OpSignature, cache: Path) -> None:
    artifact = build(generate(op, default_schedule(op, HW), HW), cache_dir=cache)
    inputs = random_inputs(op, seed=1)
    got = load_kernel(op, artifact)(*inputs)
    np.testing.assert_allclose(got, reference(op, inputs), rtol=1e-4, atol=1e-4)


def _kernel_runs(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "-x c " in line + " "]


def test_one_header_serves_every_kernel_of_a_flag_set(logged_cc: Path, tmp_path: Path) -> None:
    for op in OPS[:2]:
        _build_and_check(op, tmp_path / "cache")
    assert calls(logged_cc, "c-header") == 1 and calls(logged_cc) == 2
    assert all(f"-include {tmp_path / 'cache' / 'pch'}" in run for run in _kernel_runs(logged_cc))
    (gch,) = (tmp_path / "cache" / "pch").glob("*/tc_includes.h.gch")
    assert gch.with_name("tc_includes.h.json").exists()


def test_a_tampered_header_is_built_again_not_used(logged_cc: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _build_and_check(OPS[0], tmp_path / "cache")
    (gch,) = (tmp_path / "cache" / "pch").glob("*/tc_includes.h.gch")
    data = bytearray(gch.read_bytes())
    data[len(data) // 2] ^= 0xFF
    gch.write_bytes(bytes(data))
    monkeypatch.setattr(pch, "_known", {})  # a new process
    _build_and_check(OPS[2], tmp_path / "cache")
    assert calls(logged_cc, "c-header") == 2
    assert matching_digest(gch) is not None


def test_switched_off_and_feature_macros_compile_without_it(
        logged_cc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ("-O2", "-fPIC", "-shared")
    macro = "#define _GNU_SOURCE\n#include <string.h>\nint f(void) { return 1; }\n"
    build_source(macro, flags, cache_dir=tmp_path / "cache")
    monkeypatch.setenv(pch.PCH_ENV, "0")
    build_source("#include <string.h>\nint g(void) { return 2; }\n", flags,
                 cache_dir=tmp_path / "cache")
    assert calls(logged_cc) == 2 and calls(logged_cc, "c-header") == 0
    assert not any("-include" in run for run in _kernel_runs(logged_cc))


def test_a_header_that_cannot_be_built_leaves_the_kernel_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler that fails on the header but not on the kernel: the kernel is built."""
    monkeypatch.setattr(pch, "_known", {})
    wrapper = tmp_path / "cc-no-headers"
    wrapper.write_text('#!/bin/sh\ncase "$*" in *c-header*) exit 1;; esac\n'
                       f'exec {find_compiler().path} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    _build_and_check(OPS[0], tmp_path / "cache")
    assert not list((tmp_path / "cache" / "pch").glob("*/tc_includes.h.gch"))


def test_a_folder_every_user_may_write_is_not_used(logged_cc: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "pch").mkdir(parents=True)
    (cache / "pch").chmod(0o777)
    artifact = build_source("#include <string.h>\nint h(void) { return 3; }\n",
                            ("-O2", "-fPIC", "-shared"), cache_dir=cache)
    assert artifact.path.exists() and calls(logged_cc, "c-header") == 0
    assert not any("-include" in run for run in _kernel_runs(logged_cc))
