"""A compiled model saved with its kernels runs on a machine with no C compiler, matches the
model it was compiled from, and is refused whole when any byte of it changed, when it needs
instructions this CPU lacks, or when this tunecache would plan it differently (issue 55,
item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx_support import Builder, assert_close, ort_run, random_feeds, resnet50_model, resnet_model

from tunecache.compiler.errors import HardwareError, TunecacheError
from tunecache.compiler.hardware import cpu_features, isa_level, local_spec
from tunecache.tuner.deploy import PackageError, compile_model, load_compiled
from tunecache.tuner.deploy.package_file import MAGIC, open_package, write_package

CLI = [sys.executable, "-m", "tunecache.tuner.cli"]


def saved(tmp_path: Path, model: onnx.ModelProto, name: str, **options: Any
          ) -> tuple[Path, Any]:
    """``model`` written, compiled against a private store and saved; (package, compiled)."""
    onnx.save(model, tmp_path / f"{name}.onnx")
    compiled = compile_model(tmp_path / f"{name}.onnx", store=tmp_path / "store", **options)
    package = tmp_path / f"{name}.tcm"
    compiled.save(package)
    return package, compiled


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, onnx.ModelProto]:
    model = resnet_model()
    package, _ = saved(tmp_path_factory.mktemp("small"), model, "small")
    return package, model


def outputs(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def rewritten(package: Path, out: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """``package`` with its manifest edited and its digest made to match again."""
    opened = open_package(package)
    members = {name: opened.read(name, 1 << 30) for name in opened.archive.namelist()}
    opened.close()
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    write_package(out, members)
    return out


@pytest.mark.slow
def test_resnet50_package_runs_without_a_compiler_and_matches(tmp_path: Path) -> None:
    model = resnet50_model(size=64)
    package, compiled = saved(tmp_path, model, "resnet50")
    feeds = random_feeds(model)
    np.savez(tmp_path / "inputs.npz", **feeds)
    empty = tmp_path / "no-compiler"
    empty.mkdir()
    script = (
        "import shutil, sys, numpy as np\n"
        "assert not any(shutil.which(c) for c in ('cc', 'gcc', 'clang'))\n"
        "from tunecache.tuner.deploy import load_compiled\n"
        "model = load_compiled(sys.argv[1])\n"
        "feeds = dict(np.load(sys.argv[2]))\n"
        "np.savez(sys.argv[3], **model.run(feeds))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env |= {"PATH": str(empty), "TUNECACHE_BUILD_CACHE": str(tmp_path / "fresh-cache"),
            "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script, str(package), str(tmp_path / "inputs.npz"),
                    str(tmp_path / "out.npz")], env=env, check=True, timeout=600)
    with np.load(tmp_path / "out.npz") as out:
        ours = {name: out[name] for name in out.files}
    expected = compiled.run(feeds)
    for name, value in expected.items():
        np.testing.assert_array_equal(ours[name], value)
    assert_close(ours, ort_run(model, feeds), outputs(model), rtol=1e-3)
    flipped = tmp_path / "flipped.tcm"
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(data)
    with pytest.raises(PackageError, match="damaged"):
        load_compiled(flipped)


def test_any_flipped_byte_refuses_the_whole_package(small: tuple[Path, onnx.ModelProto],
                                                    tmp_path: Path) -> None:
    package, _ = small
    data = package.read_bytes()
    rng = np.random.default_rng(0)
    places = [0, len(MAGIC) - 1, len(MAGIC) + 9, len(MAGIC) + 70, len(MAGIC) + 80,
              len(data) - 1, len(data) - 22, *rng.integers(0, len(data), 12).tolist()]
    for place in places:
        damaged = bytearray(data)
        damaged[place] ^= 0x10
        (tmp_path / "damaged.tcm").write_bytes(damaged)
        with pytest.raises(PackageError, match=r"damaged|not a tunecache compiled model"):
            load_compiled(tmp_path / "damaged.tcm")


def test_a_loaded_package_matches_onnxruntime_and_says_where_its_plan_came_from(
        small: tuple[Path, onnx.ModelProto]) -> None:
    package, model = small
    loaded = load_compiled(package)
    feeds = random_feeds(model)
    assert_close(loaded.run(feeds), ort_run(model, feeds), outputs(model))
    assert {(e.action, e.source) for e in loaded.plan} == {("package", "package")}
    assert loaded.hw == local_spec()


def test_a_package_needing_instructions_this_cpu_lacks_is_refused(
        small: tuple[Path, onnx.ModelProto], tmp_path: Path) -> None:
    hw = local_spec()
    lacking = sorted(isa_level(hw.isa).features - set(cpu_features()))
    if not lacking:
        pytest.skip(f"this CPU has every optional feature of {hw.isa}")

    def claim(manifest: dict[str, Any]) -> None:
        manifest["hw"]["features"] = sorted({*manifest["hw"]["features"], lacking[0]})
    with pytest.raises(HardwareError, match=f"claims {lacking[0]}"):
        load_compiled(rewritten(small[0], tmp_path / "amx.tcm", claim))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("kernels", "op", "differs from the package's"),
    ("format", 2, "format 2 is not 1"),
    ("objects", "digest", "does not match its digest"),
    ("objects", "key", "is not an artifact key"),
    ("options", "threads", "threads must be a positive integer"),
    ("hw", "cores", "cores must be a positive integer"),
])
def test_a_package_this_tunecache_would_not_plan_alike_is_refused(
        small: tuple[Path, onnx.ModelProto], tmp_path: Path, field: str, value: Any,
        message: str) -> None:
    def edit(manifest: dict[str, Any]) -> None:
        if field == "kernels":
            manifest["kernels"][0]["op"] += " "
        elif field == "objects" and value == "key":
            key = next(iter(manifest["objects"]))
            manifest["objects"]["../" + key] = manifest["objects"].pop(key)
        elif field == "objects":
            key = next(iter(manifest["objects"]))
            manifest["objects"][key] = "0" * 64
        elif field in ("options", "hw"):
            manifest[field][value] = -1
        else:
            manifest[field] = value
    with pytest.raises(TunecacheError, match=message):
        load_compiled(rewritten(small[0], tmp_path / "edited.tcm", edit))


def test_cli_saves_runs_and_refuses_what_a_package_cannot_change(tmp_path: Path) -> None:
    b = Builder(13)
    x = b.input("x", ["n", 16])
    y = b.node("Relu", [b.node("MatMul", [x, b.weight(16, 8)])])
    onnx.save(b.model([y]), tmp_path / "mlp.onnx")
    run = [*CLI, "compile", str(tmp_path / "mlp.onnx"), "--root", str(tmp_path / "store")]
    unplanned = subprocess.run([*run, "--save", str(tmp_path / "mlp.tcm")],
                               capture_output=True, text=True)
    assert unplanned.returncode == 2 and "--input-shape" in unplanned.stderr
    done = subprocess.run([*run, "--input-shape", "x=4,16", "--save", str(tmp_path / "mlp.tcm"),
                           "--json"], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["saved"]["objects"] >= 2
    ran = subprocess.run([*CLI, "run", str(tmp_path / "mlp.tcm"), "--json", "--repeat", "2",
                          "--compare", "onnxruntime"], capture_output=True, text=True,
                         check=True)
    report = json.loads(ran.stdout)
    assert report["outputs"] == {y: [4, 8]}
    assert report["onnxruntime"]["errors"][y]["max_abs"] < 1e-4
    refused = subprocess.run([*CLI, "run", str(tmp_path / "mlp.tcm"), "--precision", "bf16"],
                             capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--precision cannot change" in refused.stderr
    np.savez(tmp_path / "other.npz", x=np.ones((3, 16), np.float32))
    other = subprocess.run([*CLI, "run", str(tmp_path / "mlp.tcm"), "--inputs",
                            str(tmp_path / "other.npz")], capture_output=True, text=True)
    assert other.returncode == 2 and other.stderr.startswith("error:")
    assert "Traceback" not in other.stderr


def test_only_a_model_compiled_from_its_file_can_be_saved(tmp_path: Path) -> None:
    from tunecache.compiler import frontend

    source = frontend.read_model_bytes(resnet_model().SerializeToString(), "in-memory")
    compiled = compile_model(source, store=tmp_path / "store")
    with pytest.raises(TunecacheError, match="was not read from a file"):
        compiled.save(tmp_path / "m.tcm")
    assert not (tmp_path / "m.tcm").exists()


def test_an_artifact_key_that_is_not_one_is_never_installed(tmp_path: Path) -> None:
    from tunecache.compiler.backends.cpu.build import install_artifact
    from tunecache.compiler.errors import BuildError

    with pytest.raises(BuildError, match="not 32 lowercase hex digits"):
        install_artifact("../" + "a" * 29, b"\x7fELF", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
