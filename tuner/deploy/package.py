"""A compiled model saved for deployment: the model, its plan's decisions, its built kernels
and the runtime they run on, in one file that runs on a machine with no C compiler.

``tunecache compile model.onnx --save model.tcm`` (:func:`save_compiled`) writes the ONNX
model, a manifest (the hardware spec and backend the kernels were built for, the toolchain's
identity, the compile's options and input shapes, and per kernel node its op and schedule
and the artifact that runs it) and the artifacts themselves, each with its SHA-256.
``tunecache run model.tcm`` / :func:`load_compiled` checks the file's digest, refuses a
package built for instructions this CPU lacks, installs the artifacts into the build cache
(each checked against its digest first, then loaded like any built kernel), plans the model
again with the saved options and loads each node's kernel from the package: no store, no
cost model, no compiler. A plan that comes out different (another tunecache version) is
refused, naming the node. The package holds the input shape planned at compile time;
another shape of a dynamic model is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tunecache.compiler import frontend
from tunecache.compiler.backends import Artifact, Backend, backend_for, backend_named
from tunecache.compiler.codegen import CODEGEN_VERSION, generate
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.executor import Kernel, numpy_kernel
from tunecache.compiler.files import matching_digest
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.precision import PRECISIONS
from tunecache.compiler.schedule import Schedule, problems, schedule_from_dict
from tunecache.tuner.deploy.compile import CompiledModel, PlanEntry, plan_model
from tunecache.tuner.deploy.package_file import (
    PackageError,
    PackageFile,
    open_package,
    write_package,
)

FORMAT = 1
MANIFEST = "manifest.json"
MODEL = "model.onnx"
MAX_MANIFEST_BYTES = 64 << 20
MAX_MODEL_BYTES = 2 << 30  # protobuf's own limit
MAX_OBJECT_BYTES = 256 << 20


@dataclass(frozen=True)
class SavedPackage:
    """What :func:`save_compiled` wrote."""

    path: Path
    bytes: int
    kernel_nodes: int
    objects: int
    hw_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "bytes": self.bytes, "kernel_nodes": self.kernel_nodes,
                "objects": self.objects, "hw_id": self.hw_id}


def save_compiled(compiled: CompiledModel, path: str | Path) -> SavedPackage:
    """Write ``compiled`` (its compile-time input shape) to ``path`` as a package."""
    path = Path(path)
    if compiled.source is None or any(d < 0 for i in compiled.graph.inputs for d in i.shape):
        raise PackageError("only a model compiled from its file at a known input shape can be "
                           "saved; give its dynamic dimensions with --input-shape")
    backend = backend_for(compiled.hw)
    objects: dict[str, Artifact] = {}
    kernels = []
    for entry in compiled.plan:
        key = None
        if entry.schedule is not None:
            art = backend.build(generate(entry.op, entry.schedule, compiled.hw))
            objects[art.key], key = art, art.key
        kernels.append({"node": entry.node, "op": entry.op.text, "object": key,
                        "schedule": entry.schedule.to_dict() if entry.schedule else None})
    runtime = backend.runtime_artifacts()
    objects.update((art.key, art) for art in runtime)
    model = frontend.model_bytes(compiled.source)
    members = {f"objects/{key}": _artifact_bytes(art) for key, art in objects.items()}
    manifest = _manifest(compiled, backend, kernels, model, members, [a.key for a in runtime])
    size = write_package(path, {MANIFEST: json.dumps(manifest, indent=1).encode(),
                                MODEL: model, **members})
    return SavedPackage(path, size, len(kernels), len(objects), compiled.hw.hw_id)


def _manifest(compiled: CompiledModel, backend: Backend, kernels: list[dict[str, Any]],
              model: bytes, members: dict[str, bytes], runtime: list[str]) -> dict[str, Any]:
    return {
        "format": FORMAT, "tunecache": _version(), "codegen": CODEGEN_VERSION,
        "model": {"name": compiled.source.name if compiled.source else "model",
                  "sha256": hashlib.sha256(model).hexdigest()},
        "backend": backend.name, "toolchain": backend.toolchain(),
        "hw": json.loads(compiled.hw.to_json()),
        "inputs": {i.name: list(i.shape) for i in compiled.graph.inputs},
        "options": {"threads": compiled.threads, "blocked_layouts": compiled.blocked_layouts,
                    "precision": compiled.precision.requested, "native": compiled.native},
        "kernels": kernels, "runtime": runtime,
        "objects": {name.removeprefix("objects/"): hashlib.sha256(data).hexdigest()
                    for name, data in members.items()},
    }


def _artifact_bytes(art: Artifact) -> bytes:
    if matching_digest(art.path) is None:
        raise PackageError(f"built artifact {art.path} does not match its build record; "
                           "compile the model again")
    return art.path.read_bytes()


def _version() -> str:
    try:
        return version("tunecache")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class _Manifest:
    hw: HardwareSpec
    backend: str
    toolchain: str
    name: str
    inputs: dict[str, tuple[int, ...]]
    options: dict[str, Any]
    kernels: list[dict[str, Any]]
    objects: dict[str, str]
    model_sha256: str


def load_compiled(path: str | Path) -> CompiledModel:
    """The compiled model saved at ``path``, ready to run here (see the module doc)."""
    t0 = time.perf_counter()
    package = open_package(Path(path))
    try:
        manifest = _read_manifest(package)
        model = package.read(MODEL, MAX_MODEL_BYTES)
        if hashlib.sha256(model).hexdigest() != manifest.model_sha256:
            raise PackageError(f"{path}: its model does not match its manifest")
        backend = backend_named(manifest.backend)
        backend.ensure_runnable(manifest.hw)
        backend.adopt_toolchain(manifest.toolchain)
        installed = {key: _install(package, backend, key, digest)
                     for key, digest in manifest.objects.items()}
    finally:
        package.close()
    t_install = time.perf_counter()
    compiled = _planned(frontend.read_model_bytes(model, manifest.name), manifest, backend,
                        installed)
    done = time.perf_counter()
    compiled.timings = {"install_s": t_install - t0, "load_s": done - t_install,
                        "total_s": done - t0}
    return compiled


def saved_model(path: str | Path) -> bytes:
    """The ONNX model a package holds (for another engine to run beside it)."""
    package = open_package(Path(path))
    try:
        return package.read(MODEL, MAX_MODEL_BYTES)
    finally:
        package.close()


def _install(package: PackageFile, backend: Backend, key: str, digest: str) -> Artifact:
    data = package.read(f"objects/{key}", MAX_OBJECT_BYTES)
    if hashlib.sha256(data).hexdigest() != digest:
        raise PackageError(f"{package.path}: artifact {key} does not match its digest")
    return backend.install_artifact(key, data)


def _planned(source: frontend.ModelSource, manifest: _Manifest, backend: Backend,
             installed: dict[str, Artifact]) -> CompiledModel:
    """The model planned again as saved, each kernel node's kernel from the package."""
    options = manifest.options
    _, graph, lowered = plan_model(source, manifest.inputs, manifest.hw,
                                   options["blocked_layouts"], options["precision"])
    nodes = graph.kernel_nodes
    if len(nodes) != len(manifest.kernels):
        raise PackageError(f"the model plans {len(nodes)} kernel nodes here, the package "
                           f"{len(manifest.kernels)}: it was saved by another tunecache "
                           "version; save it again with this one")
    plan: list[PlanEntry] = []
    kernels: dict[str, Kernel] = {}
    loaded: dict[str, Kernel] = {}
    for node, saved in zip(nodes, manifest.kernels, strict=True):
        if (node.name, node.op.text) != (saved["node"], saved["op"]):
            raise PackageError(f"kernel node {node.name} ({node.op.text}) differs from the "
                               f"package's {saved['node']} ({saved['op']}): it was saved by "
                               "another tunecache version; save it again with this one")
        schedule = _schedule(node.op, saved, manifest.hw)
        key = saved["object"]
        if (schedule is None) != (key is None) or (key is not None and key not in installed):
            raise PackageError(f"kernel node {node.name}: schedule and artifact disagree")
        if key is not None and key not in loaded:
            loaded[key] = backend.load(node.op, installed[key].path)
        kernels[node.name] = loaded[key] if key is not None else numpy_kernel(node.op)
        plan.append(PlanEntry(node.name, node.nodes, node.op, "package", "package",
                              "saved with the compiled model", None, schedule))
    return CompiledModel(graph, plan, kernels, manifest.hw, threads=options["threads"],
                         precision=lowered, native=options["native"],
                         blocked_layouts=options["blocked_layouts"], source=source)


def _schedule(op: Any, saved: dict[str, Any], hw: HardwareSpec) -> Schedule | None:
    if saved["schedule"] is None:
        return None
    try:
        schedule = schedule_from_dict(saved["schedule"], op.kind)
    except TunecacheError as exc:
        raise PackageError(f"kernel node {saved['node']}: {exc}") from None
    found = problems(op, schedule, hw)
    if found:
        raise PackageError(f"kernel node {saved['node']}: schedule refused: {found[0]}")
    return schedule


def _read_manifest(package: PackageFile) -> _Manifest:
    try:
        data = json.loads(package.read(MANIFEST, MAX_MANIFEST_BYTES))
    except (ValueError, RecursionError) as exc:
        raise PackageError(f"{package.path}: manifest is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PackageError(f"{package.path}: manifest format {_get(data, 'format')!r} is not "
                           f"{FORMAT}; save the model again with this tunecache")
    try:
        return _Manifest(
            HardwareSpec.from_dict(_typed(data, "hw", dict)), _typed(data, "backend", str),
            _typed(data, "toolchain", str), _typed(_typed(data, "model", dict), "name", str),
            _inputs(_typed(data, "inputs", dict)), _options(_typed(data, "options", dict)),
            _kernels(_typed(data, "kernels", list)), _objects(_typed(data, "objects", dict)),
            _typed(_typed(data, "model", dict), "sha256", str))
    except TunecacheError as exc:
        if isinstance(exc, PackageError):
            raise
        raise PackageError(f"{package.path}: manifest: {exc}") from None


def _get(data: object, key: str) -> object:
    return data.get(key) if isinstance(data, dict) else None


def _typed(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PackageError(f"manifest field {key} must be a {kind.__name__}, got {value!r}"[:300])
    return value


def _inputs(data: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for name, dims in data.items():
        if not isinstance(dims, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
            raise PackageError(f"manifest input {name!r}: shape must be positive integers")
        shapes[name] = tuple(dims)
    return shapes


def _options(data: dict[str, Any]) -> dict[str, Any]:
    threads = data.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise PackageError(f"manifest option threads must be a positive integer, got {threads!r}")
    if data.get("precision") not in PRECISIONS:
        raise PackageError(f"manifest option precision must be one of {', '.join(PRECISIONS)}")
    _typed(data, "blocked_layouts", bool)
    _typed(data, "native", bool)
    return data


def _kernels(data: list[Any]) -> list[dict[str, Any]]:
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("node"), str) \
                or not isinstance(entry.get("op"), str) \
                or not isinstance(entry.get("object"), (str, type(None))) \
                or not isinstance(entry.get("schedule"), (dict, type(None))):
            raise PackageError("manifest kernels: each needs node, op, object and schedule")
    return data


def _objects(data: dict[str, Any]) -> dict[str, str]:
    for key, digest in data.items():
        if not re.fullmatch(r"[0-9a-f]{32}", key):
            raise PackageError(f"manifest object {key[:80]!r} is not an artifact key "
                               "(32 lowercase hex digits)")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise PackageError(f"manifest object {key!r}: its digest must be SHA-256 hex")
    return data
