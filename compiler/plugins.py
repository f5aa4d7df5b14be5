"""Loading the backend plug-ins: the builtin backend modules, then those named by the
``tunecache.backends`` entry-point group. A backend module registers its ISA levels
(:func:`tunecache.compiler.hardware.register_isa_level`) and itself
(:func:`tunecache.compiler.backends.register_backend`) when imported; both registries load
them through here, by name, so neither imports the other's plug-ins."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

BUILTIN_BACKENDS = ("tunecache.compiler.backends.cpu",)
"""Backend modules of this package, loaded first."""
ENTRY_POINT_GROUP = "tunecache.backends"
"""Other backends: each entry point names a module that registers itself."""

_loaded = False


def load_backends() -> None:
    """Import every backend module once (later calls do nothing)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in BUILTIN_BACKENDS:
        importlib.import_module(name)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        importlib.import_module(point.value)
