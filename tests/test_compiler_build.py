"""The artifact cache: content addressing, warm hits, concurrent builders, compiler errors."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import stat
from pathlib import Path

import pytest

from tunecache.compiler.backends.cpu.build import build, build_source, find_compiler
from tunecache.compiler.codegen import generate
from tunecache.compiler.errors import BuildError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import default_schedule

OP = matmul_op(24, 40, 16, epilogue="bias")


def counting_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A wrapper around the real compiler that logs each invocation."""
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "cc-wrapper"
    real = find_compiler().path
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return wrapper, log


def calls(log: Path, language: str = "c") -> int:
    """How many compiler runs ``log`` holds on ``language`` sources (``c``: kernels;
    ``c-header``: precompiled headers)."""
    if not log.exists():
        return 0
    runs = [line.split() for line in log.read_text().splitlines()]
    return sum(1 for words in runs if "-o" in words
               and any(a == "-x" and b == language for a, b in itertools.pairwise(words)))


def test_warm_build_does_not_run_the_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper, log = counting_compiler(tmp_path)
    monkeypatch.setenv("CC", str(wrapper))
    hw = local_spec()
    kernel = generate(OP, default_schedule(OP, hw), hw)
    cold = build(kernel, cache_dir=tmp_path / "cache")
    assert not cold.cached and cold.path.exists() and calls(log) == 1
    warm = build(kernel, cache_dir=tmp_path / "cache")
    assert warm.cached and warm.path == cold.path and calls(log) == 1
    assert (cold.path.with_suffix(".c")).read_text() == kernel.code
    # Another schedule is another artifact.
    other = generate(OP, default_schedule(OP, hw).replace(unroll=2), hw)
    assert build(other, cache_dir=tmp_path / "cache").path != cold.path
    assert calls(log) == 2


def test_key_covers_flags_and_compiler(tmp_path: Path) -> None:
    src = "int f(void) { return 1; }\n"
    a = build_source(src, ("-O2", "-fPIC", "-shared"), cache_dir=tmp_path)
    b = build_source(src, ("-O1", "-fPIC", "-shared"), cache_dir=tmp_path)
    assert a.key != b.key
    c = build_source(src + "\n", ("-O2", "-fPIC", "-shared"), cache_dir=tmp_path)
    assert c.key != a.key


def _build_in_child(args: tuple[str, str]) -> str:
    cache, text = args
    hw = local_spec()
    op = OpSignature.parse(text)
    return str(build(generate(op, default_schedule(op, hw), hw), cache_dir=Path(cache)).path)


def test_concurrent_builds_of_one_kernel_are_safe(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with mp.get_context("spawn").Pool(4) as pool:
        paths = pool.map(_build_in_child, [(str(cache), OP.text)] * 8)
    assert len(set(paths)) == 1
    files = sorted(p.name for p in Path(paths[0]).parent.iterdir())
    assert [f for f in files if f.endswith(".so")] == [Path(paths[0]).name]
    assert not [f for f in files if f.startswith(".")], f"temporary files left: {files}"
    # The published object is complete and loadable.
    from tunecache.compiler.runtime import load_kernel, random_inputs

    load_kernel(OP, Path(paths[0]))(*random_inputs(OP))


def test_missing_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(BuildError, match="no C compiler found"):
        build_source("int x;", ("-shared",), cache_dir=tmp_path)


def test_compiler_failure_includes_its_message(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as info:
        build_source("int f(void) { return undeclared_thing; }\n", ("-fPIC", "-shared"),
                     cache_dir=tmp_path)
    assert "undeclared_thing" in str(info.value)
    leftovers = [p for p in tmp_path.rglob("*") if p.suffix == ".so" or p.name.endswith(".tmp")]
    assert not leftovers


def test_unwritable_cache_dir_is_a_clear_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("")
        target = blocker / "sub"
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
    with pytest.raises(BuildError, match="cannot create build cache folder"):
        build_source("int y;", ("-fPIC", "-shared"), cache_dir=target)
