"""The ``tunecache`` command: thin wrappers over the library.

Conventions: data goes to stdout, logs and progress to stderr; every command that reports
something takes ``--json``; a user error prints one line ``error: ...`` and exits with 2,
never a traceback. Each command group lives in a module here that lists its commands in
``COMMANDS``; options several commands share are written once in
:mod:`tunecache.tuner.cli.common`. ``python -m tunecache.tuner.cli`` runs it too.
"""

from __future__ import annotations

from typing import Any

import click

from tunecache.compiler.errors import TunecacheError
from tunecache.tuner.cli import compiler, deploy, model, store, tune
from tunecache.tuner.cli.common import EXIT_USER_ERROR


class _Group(click.Group):
    """A click group that turns tunecache's user errors into one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TunecacheError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_USER_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tunecache")
def main() -> None:
    """tunecache: offline autotuning and a compile cache for tensor kernels."""


for _module in (compiler, store, tune, model, deploy):
    for _command in _module.COMMANDS:
        main.add_command(_command)
