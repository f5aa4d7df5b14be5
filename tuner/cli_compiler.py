"""``tunecache hw`` and ``tunecache bench-op``."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
