"""The backend protocol is the only road to a toolchain and to running code: generic modules
name no ctypes, compiler flags or backend internals, and compiling a kernel, measuring one
and running a whole model all go through the backend registered for the hardware."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx_support import mlp_model, random_feeds

from tunecache.cache.store import Store
from tunecache.compiler import backends
from tunecache.compiler.backends.cpu import CPU
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule
from tunecache.tuner.deploy.compile import compile_model
from tunecache.tuner.measure.runner import Candidate, Runner, TimingConfig

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("compiler", "tuner", "costmodel", "cache", "datasets")
BACKENDS = ROOT / "compiler" / "backends"
# The `tunecache build-cache` command administers the CPU backend's own build cache.
MAY_NAME_A_BACKEND = {ROOT / "tuner" / "cli" / "build_cache.py"}
TOOLCHAIN_WORDS = ("-march", "-fopenmp", "-mtune")


def _generic_modules() -> Iterator[Path]:
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if BACKENDS not in path.parents:
                yield path


def _imports(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names
                        if (ROOT / node.module.replace("tunecache.", "").replace(".", "/")
                            / alias.name).exists())


def test_generic_modules_import_no_ctypes_toolchain_or_backend_internals() -> None:
    offences = []
    for path in _generic_modules():
        text = path.read_text()
        tree = ast.parse(text)
        for name in _imports(tree):
            internal = name.startswith("tunecache.compiler.backends.") and \
                path not in MAY_NAME_A_BACKEND
            if name == "ctypes" or internal:
                offences.append(f"{path.relative_to(ROOT)} imports {name}")
        offences += [f"{path.relative_to(ROOT)} names {word}" for word in TOOLCHAIN_WORDS
                     if word in text]
    assert not offences, "\n".join(offences)


@dataclass(frozen=True)
class RecordingBackend:
    """The CPU backend, counting each protocol call made of it."""

    calls: Counter[str] = field(default_factory=Counter)
    name: str = "cpu"

    def __getattr__(self, attr: str) -> Any:
        self.calls[attr] += 1
        return getattr(CPU, attr)


@pytest.fixture
def recording() -> Iterator[RecordingBackend]:
    backend = RecordingBackend()
    backends.registered_backends()  # the builtins first, so that this one is asked first
    backends.register_backend(backend)  # type: ignore[arg-type]
    try:
        yield backend
    finally:
        backends._BACKENDS.remove(backend)  # type: ignore[arg-type]


def test_compiling_a_kernel_builds_and_loads_through_the_backend(recording) -> None:  # type: ignore[no-untyped-def]
    hw = local_spec()
    op = OpSignature.parse("matmul(M=8,N=32,K=16,epilogue=bias)")
    kernel = compile_kernel(op, default_schedule(op, hw), hw)
    inputs = random_inputs(op)
    np.testing.assert_allclose(kernel(*inputs), reference(op, inputs), rtol=1e-4, atol=1e-4)
    for step in ("dialect", "build_flags", "build", "load"):
        assert recording.calls[step] >= 1, (step, recording.calls)


def test_measuring_builds_through_the_backend_and_names_it_to_the_worker(recording) -> None:  # type: ignore[no-untyped-def]
    hw = local_spec()
    op = OpSignature.parse("matmul(M=8,N=32,K=16)")
    timing = TimingConfig(repeat_s=0.001, min_repeats=2, max_repeats=3, min_time_s=0.0)
    with Runner(hw, timing) as runner:
        [result] = runner.measure([Candidate(op, default_schedule(op, hw))])
    assert result.status == "ok", result.error
    assert result.compiler == CPU.toolchain()
    for step in ("build_flags", "build", "toolchain", "worker_environment"):
        assert recording.calls[step] >= 1, (step, recording.calls)


def test_a_compiled_model_runs_its_plan_on_the_backends_runner(recording, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = mlp_model()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             record_wanted=False)
    feeds = random_feeds(model)
    outputs = compiled.run(feeds)
    assert compiled.executor.run(feeds).keys() == outputs.keys()
    for step in ("build", "load", "plan_runner", "toolchain"):
        assert recording.calls[step] >= 1, (step, recording.calls)


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"no backend named 'tpu'; backends: .*cpu"):
        backends.backend_named("tpu")


def test_a_backend_may_register_its_own_emitter_for_a_kind() -> None:
    """A dialect-specific emitter replaces the kind's own for that dialect alone."""
    from tunecache.compiler import kinds
    from tunecache.compiler.codegen import generate
    from tunecache.compiler.hardware import HardwareSpec

    neon = HardwareSpec(arch="aarch64", isa="neon", vector_bits=128, cores=1,
                        l1d_bytes=64 << 10, l2_bytes=1 << 20, l3_bytes=8 << 20, cpu_model="n1")
    op = OpSignature.parse("softmax(M=4,N=32)")
    own = kinds.op_kind("softmax").emit

    def marked(o: OpSignature, schedule: Any, dialect: Any) -> str:
        return "/* the neon template */\n" + own(o, schedule, dialect)

    kinds.register_emitter("softmax", "neon", marked)
    try:
        assert "/* the neon template */" in generate(op, default_schedule(op, neon), neon).code
        here = local_spec()
        assert "neon template" not in generate(op, default_schedule(op, here), here).code
    finally:
        del kinds._EMITTERS[("softmax", "neon")]
