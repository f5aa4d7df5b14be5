"""The ``tunecache`` command: thin wrappers over the library.

Conventions: data goes to stdout, logs and progress to stderr; every command that reports
something takes ``--json``. Every failure prints exactly one line ``error: ...`` on stderr,
never a traceback, and exits with 2 when the input was wrong (a bad argument, op text,
schedule, file content) or 1 when the environment failed (a file system or memory error, a
missing C compiler, an unreachable store). ``--debug`` (or ``TUNECACHE_DEBUG=1``) adds the
traceback. A warning is one ``warning: ...`` line, without Python's source location. Each
command group lives in a module here that lists its commands in
``COMMANDS``; options several commands share are written once in
:mod:`tunecache.tuner.cli.common`. ``python -m tunecache.tuner.cli`` runs it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import traceback
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any

import click

from tunecache.compiler.errors import BuildError, TunecacheError
from tunecache.tuner.cli import build_cache, compiler, deploy, model, seed, store, tune
from tunecache.tuner.cli.common import EXIT_ENVIRONMENT, EXIT_USER_ERROR

DEBUG_ENV = "TUNECACHE_DEBUG"
EXIT_INTERRUPTED = 130
PROG_NAME = "tunecache"

# Library errors that mean the machine, not the input, is at fault. A TunecacheError
# subclass can also say so itself with a class attribute ``exit_code = 1``.
_ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (BuildError,)
# Exceptions raised by parsers on malformed input the command was given.
_INPUT_ERRORS: tuple[type[BaseException], ...] = (RecursionError, UnicodeError,
                                                  zipfile.BadZipFile)


def _one_line(text: str) -> str:
    """``text`` as one line: its lines joined by `` | ``, blank ones dropped."""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def _warning_line(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, file: Any = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for the CLI: one ``warning:`` line on stderr, no source
    location or source line (a user reads it, not a developer)."""
    click.echo(f"warning: {_one_line(str(message))}", err=True)


def _describe(exc: BaseException) -> tuple[str, int]:
    """The message and exit status for an exception escaping a command."""
    if isinstance(exc, click.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else PROG_NAME
        return f"{exc.format_message()} (see '{where} --help')", EXIT_USER_ERROR
    if isinstance(exc, click.ClickException):
        return exc.format_message(), exc.exit_code
    if isinstance(exc, click.Abort):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, TunecacheError):
        default = EXIT_ENVIRONMENT if isinstance(exc, _ENVIRONMENT_ERRORS) else EXIT_USER_ERROR
        code = getattr(exc, "exit_code", default)
        return str(exc), code if isinstance(code, int) else default
    if isinstance(exc, MemoryError):
        detail = f": {exc}" if str(exc) else ""
        return f"out of memory{detail}", EXIT_ENVIRONMENT
    if isinstance(exc, OSError):
        return _os_error(exc), EXIT_ENVIRONMENT
    if isinstance(exc, RecursionError):
        return "input is nested too deeply to read", EXIT_USER_ERROR
    if isinstance(exc, _INPUT_ERRORS):
        return f"cannot read input: {exc}", EXIT_USER_ERROR
    return (f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
            EXIT_ENVIRONMENT)


def _os_error(exc: OSError) -> str:
    reason = exc.strerror or str(exc) or type(exc).__name__
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{reason}: {' -> '.join(names)}" if names else reason


def _debug_requested(args: Sequence[str]) -> bool:
    """Whether ``--debug`` precedes the command name, or ``$TUNECACHE_DEBUG`` is set."""
    if os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return True
    for arg in args:
        if arg == "--debug":
            return True
        if not arg.startswith("-"):
            return False
    return False


def _silence_stdout() -> None:
    """After EPIPE on stdout (``tunecache ... | head``), send the rest to /dev/null so the
    interpreter's final flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _interrupt_on_sigterm() -> None:
    """Stop on SIGTERM (a farm's scheduler preempting a job, ``docker stop``) as on Ctrl-C:
    a command then reports what it kept instead of vanishing mid-line."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    with contextlib.suppress(ValueError):  # not the main thread (an embedding caller's)
        signal.signal(signal.SIGTERM, interrupt)


class _Group(click.Group):
    """The main group: whatever a command raises becomes one ``error:`` line (see module)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        _interrupt_on_sigterm()
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _warning_line
                code = super().main(argv, prog_name or PROG_NAME, complete_var, False,
                                    **extra)
        except Exception as exc:  # the one place every failure is reported
            sys.exit(self._report(exc, _debug_requested(argv)))
        except KeyboardInterrupt as exc:
            sys.exit(self._report(click.Abort(), _debug_requested(argv), exc))
        sys.exit(code if isinstance(code, int) else 0)

    @staticmethod
    def _report(exc: BaseException, debug: bool, cause: BaseException | None = None) -> int:
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            _silence_stdout()
            return EXIT_ENVIRONMENT
        message, code = _describe(exc)
        if debug:
            traceback.print_exception(cause or exc, file=sys.stderr)
        click.echo(f"error: {_one_line(message) or type(exc).__name__}", err=True)
        return code


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, expose_value=False,
              help=f"Show the traceback of a failure (also ${DEBUG_ENV}=1).")
@click.version_option(package_name="tunecache")
def main() -> None:
    """tunecache: offline autotuning and a compile cache for tensor kernels."""


for _module in (compiler, build_cache, store, tune, model, deploy, seed):
    for _command in _module.COMMANDS:
        main.add_command(_command)
