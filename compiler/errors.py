"""The exceptions tunecache raises for bad input and unusable environments.

Every error a user can cause derives from :class:`TunecacheError`, so the CLI can print it
as one clear line instead of a traceback.
"""

from __future__ import annotations


class TunecacheError(Exception):
    """Base class of every error tunecache raises on purpose."""


class OpSignatureError(TunecacheError, ValueError):
    """An operator signature (object or text) is malformed or unsupported."""


class HardwareError(TunecacheError):
    """The hardware could not be detected, or a hardware spec is malformed."""


class ScheduleError(TunecacheError, ValueError):
    """A schedule is malformed or illegal for its operator and hardware."""


class BuildError(TunecacheError):
    """The C compiler is missing or failed; the message includes its output."""


class KernelArgumentError(TunecacheError, ValueError):
    """Arrays passed to a kernel have the wrong dtype, shape or memory layout."""
