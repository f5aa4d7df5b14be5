"""Compile-time consultation: an ONNX model compiled against the cache
(:mod:`~tunecache.tuner.deploy.compile`), deciding per miss what to do
(:mod:`~tunecache.tuner.deploy.policy`)."""

from tunecache.tuner.deploy.compile import CompiledModel, PlanEntry, compile_model
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
    "PlanEntry",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "best_guess",
    "compile_model",
]
