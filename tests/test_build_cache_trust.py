"""The build cache holds code this process loads, so it must be private: owned by this user
and writable by no one else, on a path no one else may rearrange (issue 55, item 1).

The planting tests drop privileges in a child process (another user, or a member of the
cache's group) to write an object and a matching record side by side, as the probe did;
they need root to do so and are skipped otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kernel_support import planted_object

from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import KernelSource, generate
from tunecache.compiler.errors import BuildError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.runtime import check_result, load_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule

pytestmark = pytest.mark.fault

OP = matmul_op(8, 16, 8)
HW = local_spec()
OTHER = 65534  # nobody / nogroup
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root")


def kernel() -> KernelSource:
    return generate(OP, default_schedule(OP, HW), HW)


def runs_correctly(path: Path) -> bool:
    inputs = random_inputs(OP)
    return check_result(OP, inputs, load_kernel(OP, path)(*inputs), reference(OP, inputs)) is None


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder other users may reach (pytest's own is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="tc-trust-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def plant_as(user: int, group: int, target: Path, data: bytes) -> None:
    """Write ``data`` over ``target`` in a child process running as ``user``:``group``."""
    subprocess.run(["sh", "-c", 'rm -f "$1" && cat > "$1"', "sh", str(target)], input=data,
                   user=user, group=group, extra_groups=[], check=True, capture_output=True)


def plant_object_and_record(user: int, group: int, artifact: Path, planted: Path) -> None:
    data = planted.read_bytes()
    record = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    plant_as(user, group, artifact.with_suffix(".json"), json.dumps(record).encode())
    plant_as(user, group, artifact, data)


def test_new_folders_and_objects_are_private_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)  # Debian's and Ubuntu's default for users with their own group
    try:
        art = build(kernel(), cache_dir=tmp_path / "a" / "b" / "cache")
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", art.path.parent.parent,
                   art.path.parent):
        assert mode(folder) == 0o700, folder
    for path in art.path.parent.iterdir():
        assert mode(path) & 0o077 == 0 and mode(path) & 0o600 == 0o600, path
    assert runs_correctly(art.path)


@pytest.mark.parametrize(("which", "chmod"), [("root", 0o770), ("key", 0o775),
                                              ("root", 0o757)])
def test_a_folder_others_may_write_is_refused_with_the_fix(tmp_path: Path, which: str,
                                                           chmod: int) -> None:
    cache = tmp_path / "cache"
    art = build(kernel(), cache_dir=cache)
    folder = cache if which == "root" else art.path.parent
    folder.chmod(chmod)
    who = "its group" if chmod & 0o020 else "every user"
    with pytest.raises(BuildError, match=rf"{folder} is writable by {who}.*chmod go-w"):
        build(kernel(), cache_dir=cache)
    with pytest.raises(BuildError, match="not private"):
        load_kernel(OP, art.path)
    folder.chmod(0o700)
    assert build(kernel(), cache_dir=cache).cached


def test_a_folder_above_the_cache_that_others_may_write_is_refused(tmp_path: Path) -> None:
    above = tmp_path / "shared"
    above.mkdir()
    art = build(kernel(), cache_dir=above / "cache")
    above.chmod(0o775)
    with pytest.raises(BuildError, match=rf"{above} is writable by its group"):
        load_kernel(OP, art.path)
    above.chmod(0o1777)  # sticky, as /tmp: others cannot move what is not theirs
    assert runs_correctly(art.path)


def test_a_key_folder_replaced_by_a_link_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    art = build(kernel(), cache_dir=cache)
    elsewhere = tmp_path / "elsewhere"
    art.path.parent.rename(elsewhere)
    art.path.parent.symlink_to(elsewhere)
    with pytest.raises(BuildError, match="is not a directory"):
        load_kernel(OP, art.path)


@dataclass(frozen=True)
class Plant:
    """A built cache, and a planted object that creates ``marker`` if it is ever loaded."""

    cache: Path
    artifact: Path
    planted: Path
    marker: Path


@pytest.fixture
def plant(shared_tmp: Path) -> Plant:
    cache = shared_tmp / "cache"
    marker = shared_tmp / "planted-ran"
    return Plant(cache, build(kernel(), cache_dir=cache).path,
                 planted_object(shared_tmp, marker), marker)


@as_root
def test_a_cache_owned_by_another_user_is_refused_and_its_plant_never_runs(plant: Plant) -> None:
    cache, art, planted, marker = plant.cache, plant.artifact, plant.planted, plant.marker
    for path in [cache, *cache.rglob("*")]:
        os.chown(path, OTHER, OTHER)
    plant_object_and_record(OTHER, OTHER, art, planted)
    with pytest.raises(BuildError, match=rf"{cache} is owned by uid {OTHER}, not by this user"):
        load_kernel(OP, art)
    with pytest.raises(BuildError, match="not private"):
        build(kernel(), cache_dir=cache)
    assert not marker.exists()


@as_root
def test_a_group_member_can_plant_in_a_group_writable_cache_which_is_then_refused(
        plant: Plant) -> None:
    for folder in (plant.cache, plant.artifact.parent):
        os.chown(folder, 0, OTHER)
        folder.chmod(0o770)
    plant_object_and_record(OTHER, OTHER, plant.artifact, plant.planted)  # a member's write
    with pytest.raises(BuildError, match="writable by its group"):
        load_kernel(OP, plant.artifact)
    assert not plant.marker.exists()


@as_root
def test_a_private_cache_cannot_be_planted_in(shared_tmp: Path) -> None:
    art = build(kernel(), cache_dir=shared_tmp / "cache")
    with pytest.raises(subprocess.CalledProcessError):
        plant_as(OTHER, OTHER, art.path, b"not an object")
    assert runs_correctly(art.path)
