"""Plain C functions of a harness (the dialect's vocabulary under test, a probe), built
through the build cache and called with numpy arrays and numbers: the CPU backend's way of
running C that is not a kernel, so that callers name no ctypes types."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tunecache.compiler.backends.cpu.build import build_source, open_verified
from tunecache.compiler.backends.cpu.threads import configure_openmp
from tunecache.compiler.buffers import address_of

_TYPES: dict[str, Any] = {"ptr": ctypes.c_void_p, "long": ctypes.c_long, "int": ctypes.c_int,
                          "float": ctypes.c_float, "double": ctypes.c_double, "void": None}


class CLibrary:
    """A loaded shared object whose functions are declared by C type names."""

    def __init__(self, path: Path) -> None:
        configure_openmp()
        with open_verified(path) as loadable:
            self._lib = ctypes.CDLL(loadable)

    def function(self, name: str, args: tuple[str, ...], returns: str = "int"
                 ) -> Callable[..., Any]:
        """``name`` taking ``args`` (``ptr``, ``long``, ``int``, ``float``, ``double``) and
        returning ``returns`` (or ``void``); a numpy array passed for a ``ptr`` is passed
        by its address."""
        function = getattr(self._lib, name)
        function.argtypes = [_TYPES[a] for a in args]
        function.restype = _TYPES[returns]

        def call(*values: Any) -> Any:
            return function(*(address_of(v) if isinstance(v, np.ndarray) else v
                              for v in values))
        return call


def c_library(source: str, flags: tuple[str, ...]) -> CLibrary:
    """``source`` built with ``flags`` (``-shared -fPIC`` among them) and loaded."""
    return CLibrary(build_source(source, flags).path)


def compile_library(source: str, flags: tuple[str, ...]) -> CLibrary:
    """:func:`c_library` for a harness that adds its own flags to the CPU backend's
    ``-shared -fPIC`` (``-O2``, ``-fopenmp``)."""
    return c_library(source, ("-shared", "-fPIC", *flags))
