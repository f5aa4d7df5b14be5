"""Reading ONNX model files: :class:`ModelSource`, a model read once and loaded many times,
from a file (:func:`read_model`) or its bytes (:func:`read_model_bytes`); a float16 model is
read as the same graph in float32 (:mod:`tunecache.compiler.float16`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunecache.compiler.float16 import holds_float16, widen_float16
from tunecache.compiler.graph import ModelError
from tunecache.compiler.memo import IdentityMemo
from tunecache.compiler.onnx_nodes import ReadNode

if TYPE_CHECKING:
    import onnx

__all__ = ["ModelSource", "import_onnx", "model_bytes", "read_model", "read_model_bytes",
           "source_of"]


def import_onnx() -> Any:
    try:
        import onnx
        import onnx.numpy_helper
        import onnx.shape_inference
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError(
            "reading ONNX models needs the onnx package: pip install onnx"
        ) from exc
    return onnx


@dataclass(eq=False)
class ModelSource:
    """A model read once and loaded many times (once per input shape): the ``ModelProto``
    without its external data, the folder that data is read from, and a default name.

    Its initializers are converted to arrays once, on the first load, and every later load
    shares those (read-only) arrays: the weights of a model planned at many shapes are held
    once. A source that read its own file (``owned``, :func:`read_model`) then also drops
    the large float initializers' bytes from its proto, which is not handed out."""

    model: Any
    base_dir: str
    name: str
    owned: bool = False
    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    derived: IdentityMemo[np.ndarray] = field(default_factory=IdentityMemo, repr=False)
    """Constants a lowering computed from others (weight slices, say), kept for the next
    load while the arrays they came from live."""
    nodes: list[ReadNode] = field(default_factory=list, repr=False)
    """The graph's nodes as read and checked by the first load; later loads copy them
    instead of parsing every attribute again."""
    path: str | None = None
    """The file it was read from (:func:`read_model`), for whoever needs its bytes again
    (a compiled model's package)."""

    def slimmed(self) -> Any:
        """Replace the proto by a copy parsed anew from its bytes, and return it: a cleared
        field's bytes stay in the message's arena (protobuf's upb backend) until the whole
        message goes, so dropping the weights' bytes frees nothing until then (BERT-base:
        414 MB held twice, as arrays and in the proto)."""
        self.model = type(self.model).FromString(self.model.SerializeToString())
        return self.model


def read_model(path: str | Path) -> ModelSource:
    """Read a model file once (external data stays on disk, read at each load)."""
    onnx = import_onnx()
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"ONNX model {str(path)!r} does not exist or is not a file")
    try:
        # External data is read per initializer by numpy_helper.to_array (relative to the
        # model's folder), straight into arrays, instead of into the proto and then again.
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {str(path)!r}: not a valid ONNX protobuf "
                         f"({type(exc).__name__}: {exc})") from exc
    _float32_compute(onnx, model, str(path.parent))
    return ModelSource(model, str(path.parent), path.stem, owned=True, path=str(path))


def read_model_bytes(data: bytes, name: str) -> ModelSource:
    """A model from its serialized bytes (external data inlined), as :func:`read_model`
    reads a file."""
    onnx = import_onnx()
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {name!r}: not a valid ONNX protobuf "
                         f"({type(exc).__name__}: {exc})") from exc
    _float32_compute(onnx, model, "")
    return ModelSource(model, "", name, owned=True)


def model_bytes(source: ModelSource) -> bytes:
    """The serialized model ``source`` was read from, its external data inlined; ModelError
    where it was not read from a file or that file cannot be read again."""
    if source.path is None:
        raise ModelError(f"model {source.name!r} was not read from a file, so its bytes "
                         "cannot be packaged; compile it from its .onnx file")
    onnx = import_onnx()
    try:
        return bytes(onnx.load(source.path).SerializeToString())
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {source.path!r} again to package it "
                         f"({type(exc).__name__}: {exc})") from exc


def _float32_compute(onnx: Any, model: Any, base_dir: str) -> None:
    """A float16 model as the same graph in float32 (:mod:`tunecache.compiler.float16`)."""
    try:
        widen_float16(onnx, model, base_dir)
    except Exception as exc:
        raise ModelError(f"cannot read the float16 tensors of model {model.graph.name!r}: "
                         f"{exc}") from exc


def source_of(path_or_model: str | Path | onnx.ModelProto | ModelSource) -> ModelSource:
    onnx = import_onnx()
    if isinstance(path_or_model, ModelSource):
        return path_or_model
    if isinstance(path_or_model, (str, Path)):
        return read_model(path_or_model)
    if isinstance(path_or_model, onnx.ModelProto):
        model = path_or_model
        if model.HasField("graph") and holds_float16(model.graph):
            model = onnx.ModelProto()
            model.CopyFrom(path_or_model)  # the caller's proto stays as it was
            _float32_compute(onnx, model, "")
        return ModelSource(model, "", "model")
    raise ModelError(f"load_graph needs a path or an onnx.ModelProto, got "
                     f"{type(path_or_model).__name__}")
