"""``tunecache cache ...`` and ``tunecache dataset ...`` commands (the store)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
