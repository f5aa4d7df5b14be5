"""One worker process that answers requests one at a time, and survives their failures.

A request that kills the worker (a crash in a kernel) or takes longer than the timeout is
answered by the pool itself (:class:`Failed`), and the next request gets a new worker. The
worker is ``target(conn, workdir)``: it receives requests on ``conn`` and sends one answer
each, and returns on ``None``.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any


@dataclass(frozen=True)
class Failed:
    """The worker gave no answer: it died, or timed out and was killed."""

    detail: str
    timed_out: bool


class WorkerPool:
    """Requests to one worker process at a time (see the module doc)."""

    def __init__(self, target: Callable[[Connection, str], None], timeout_s: float,
                 prefix: str = "tunecache-pool-") -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.dir = tempfile.TemporaryDirectory(prefix=prefix)
        self.context = multiprocessing.get_context("spawn")
        self.process: Any = None
        self.conn: Connection | None = None

    def _start(self) -> Connection:
        if self.conn is None:
            parent, child = self.context.Pipe()
            self.process = self.context.Process(target=self.target,
                                                args=(child, self.dir.name), daemon=True)
            self.process.start()
            self.conn = parent
        return self.conn

    def ask(self, request: Any, timeout_s: float | None = None) -> Any:
        """The worker's answer to ``request``, or :class:`Failed`."""
        conn = self._start()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            conn.send(request)
            if conn.poll(timeout):
                return conn.recv()
            failed = Failed(f"no answer within {timeout:g} s (worker killed)", True)
        except (EOFError, OSError, BrokenPipeError):
            self.process.join(5)
            failed = Failed(f"the worker died (exit code {self.process.exitcode})", False)
        self.stop()
        return failed

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.process, self.conn = None, None

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(None)
                self.process.join(10)
            except (OSError, BrokenPipeError):
                pass
        self.stop()
        self.dir.cleanup()
