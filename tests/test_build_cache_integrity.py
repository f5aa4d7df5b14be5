"""The artifact cache trusts only bytes that match their build record: a truncated, replaced
or unrecorded shared object is rebuilt, never loaded, and a world-writable cache is refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_support import planted_object

from tunecache.compiler.backends.cpu.build import Artifact, build
from tunecache.compiler.codegen import KernelSource, generate
from tunecache.compiler.errors import BuildError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.runtime import check_result, load_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule

pytestmark = pytest.mark.fault

OP = matmul_op(16, 24, 8)
HW = local_spec()


def kernel() -> KernelSource:
    return generate(OP, default_schedule(OP, HW), HW)


def runs_correctly(artifact: Artifact) -> bool:
    inputs = random_inputs(OP)
    result = load_kernel(OP, artifact)(*inputs)
    return check_result(OP, inputs, result, reference(OP, inputs)) is None


def test_build_records_the_digest_of_the_object(tmp_path: Path) -> None:
    art = build(kernel(), cache_dir=tmp_path / "cache")
    record = json.loads(art.path.with_suffix(".json").read_text())
    assert record["bytes"] == art.path.stat().st_size
    assert record["sha256"] == art.sha256 and len(art.sha256) == 64
    assert len(record["source_sha256"]) == 64
    assert build(kernel(), cache_dir=tmp_path / "cache").cached


def test_truncated_artifact_is_rebuilt_and_runs(tmp_path: Path) -> None:
    cold = build(kernel(), cache_dir=tmp_path / "cache")
    data = cold.path.read_bytes()
    cold.path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BuildError, match="does not match the digest"):
        load_kernel(OP, cold.path)
    again = build(kernel(), cache_dir=tmp_path / "cache")
    assert not again.cached and again.path == cold.path
    assert again.sha256 == hashlib.sha256(again.path.read_bytes()).hexdigest()
    assert runs_correctly(again)
    assert build(kernel(), cache_dir=tmp_path / "cache").cached


@pytest.mark.parametrize("how", ["in_place", "renamed_over"])
def test_replaced_artifact_is_never_loaded(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "constructor-ran"
    planted = planted_object(tmp_path, marker)
    cache = tmp_path / "cache"
    art = build(kernel(), cache_dir=cache)
    if how == "in_place":
        shutil.copyfile(planted, art.path)
    else:
        planted.replace(art.path)
    # Loading it directly is refused before any of its code runs...
    with pytest.raises(BuildError, match="does not match the digest"):
        load_kernel(OP, art.path)
    assert not marker.exists()
    # ...and a lookup rebuilds it.
    again = build(kernel(), cache_dir=cache)
    assert not again.cached
    assert runs_correctly(again)
    assert not marker.exists()


def test_artifact_without_a_record_is_rebuilt(tmp_path: Path) -> None:
    cold = build(kernel(), cache_dir=tmp_path / "cache")
    cold.path.with_suffix(".json").unlink()
    with pytest.raises(BuildError, match="does not match the digest"):
        load_kernel(OP, cold.path)
    again = build(kernel(), cache_dir=tmp_path / "cache")
    assert not again.cached and runs_correctly(again)
    # A garbled record counts as none.
    again.path.with_suffix(".json").write_text("[" * 100_000)
    assert not build(kernel(), cache_dir=tmp_path / "cache").cached


def test_tampered_source_copy_is_not_compiled(tmp_path: Path) -> None:
    cold = build(kernel(), cache_dir=tmp_path / "cache")
    source = cold.path.with_suffix(".c")
    source.write_text("#error planted\n")
    cold.path.unlink()
    again = build(kernel(), cache_dir=tmp_path / "cache")
    assert source.read_text() == kernel().code and runs_correctly(again)


def test_world_writable_cache_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    art = build(kernel(), cache_dir=cache)
    for directory in (cache, art.path.parent):
        directory.chmod(0o777)
        with pytest.raises(BuildError, match=r"writable by every user.*chmod go-w"):
            build(kernel(), cache_dir=cache)
        with pytest.raises(BuildError, match="writable by every user"):
            load_kernel(OP, art.path)
        directory.chmod(0o755)
    assert build(kernel(), cache_dir=cache).cached


def test_new_cache_folders_are_not_world_writable(tmp_path: Path) -> None:
    import os

    old = os.umask(0)
    try:
        art = build(kernel(), cache_dir=tmp_path / "fresh")
    finally:
        os.umask(old)
    assert not (art.path.parent.stat().st_mode & 0o002)
    assert not ((tmp_path / "fresh").stat().st_mode & 0o002)
    assert np.isfinite(load_kernel(OP, art)(*random_inputs(OP))).all()


@pytest.mark.parametrize("planted", ["record", "object"])
def test_a_fifo_in_place_of_a_kernel_file_neither_hangs_nor_loads(tmp_path: Path,
                                                                    planted: str) -> None:
    # Opening a FIFO for reading waits for a writer: a planted one hung `tunecache run`
    # (issue 55). In a child process, so a regression fails on its timeout, not forever.
    cold = build(kernel(), cache_dir=tmp_path / "cache")
    target = cold.path.with_suffix(".json") if planted == "record" else cold.path
    target.unlink()
    os.mkfifo(target)
    script = (
        "from pathlib import Path\n"
        "from tunecache.compiler.backends.cpu.build import build\n"
        "from tunecache.compiler.codegen import generate\n"
        "from tunecache.compiler.hardware import local_spec\n"
        "from tunecache.compiler.kinds.matmul import matmul_op\n"
        "from tunecache.compiler.schedule import default_schedule\n"
        "op, hw = matmul_op(16, 24, 8), local_spec()\n"
        f"cache = Path({str(tmp_path / 'cache')!r})\n"
        "art = build(generate(op, default_schedule(op, hw), hw), cache_dir=cache)\n"
        "print(art.path)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rebuilt = Path(out.stdout.strip())
    assert rebuilt.is_file() and runs_correctly(build(kernel(), cache_dir=tmp_path / "cache"))
