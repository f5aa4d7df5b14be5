"""Compile-time consultation: an ONNX model compiled against the cache
(:mod:`~tunecache.tuner.deploy.compile`), deciding per miss what to do
(:mod:`~tunecache.tuner.deploy.policy`), and saved with its kernels for a machine with no
compiler (:mod:`~tunecache.tuner.deploy.package`)."""

from tunecache.tuner.deploy.compile import CompiledModel, PlanEntry, compile_model
from tunecache.tuner.deploy.package import SavedPackage, load_compiled, save_compiled
from tunecache.tuner.deploy.package_file import PackageError
from tunecache.tuner.deploy.policy import (
    COMPILE_S,
    GUESS_LOSS,
    MEASURE_OVERHEAD_S,
    POLICIES,
    Decision,
    Guess,
    Policy,
    PolicyConfig,
    PolicyError,
    best_guess,
)

__all__ = [
    "COMPILE_S",
    "GUESS_LOSS",
    "MEASURE_OVERHEAD_S",
    "POLICIES",
    "CompiledModel",
    "Decision",
    "Guess",
    "PackageError",
    "PlanEntry",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "SavedPackage",
    "best_guess",
    "compile_model",
    "load_compiled",
    "save_compiled",
]
