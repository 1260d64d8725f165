"""The app and the process helper of the operations tests (registry, stats --watch, online
upgrade): ``pgjobs work --app tests.integration.ops_app:app``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pgjobs

app = pgjobs.App()  # DSN from --dsn or $PGJOBS_DATABASE_URL


@app.task(name="ops.add")
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="ops.hold", queue="slow")
def hold(path: str, limit: float = 60.0) -> None:
    """Runs until the file ``path`` exists (at most ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@dataclass
class Process:
    """A `pgjobs` subprocess; stdout and stderr go to files (a full pipe would block it)."""

    popen: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    def out(self) -> str:
        return Path(self.stdout.name).read_text(errors="replace")

    def err(self) -> str:
        return Path(self.stderr.name).read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``signum`` and return the exit code (fails when it does not exit in time)."""
        self.popen.send_signal(signum)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout}s after {signum}: {self.err()}") from None


def environment(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env["PGJOBS_DATABASE_URL"] = url
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["COLUMNS"] = "200"  # rich draws tables this wide when stdout is not a terminal
    return env


@contextlib.contextmanager
def pgjobs_process(url: str, *args: str) -> Iterator[Process]:
    """`python -m pgjobs ARGS...` on the database ``url``; killed if still running at the end."""
    with (
        tempfile.NamedTemporaryFile(prefix="pgjobs-ops-out-") as stdout,
        tempfile.NamedTemporaryFile(prefix="pgjobs-ops-err-") as stderr,
    ):
        popen = subprocess.Popen(
            [sys.executable, "-m", "pgjobs", *args],
            env=environment(url),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            yield Process(popen, stdout, stderr)
        finally:
            if popen.poll() is None:
                popen.kill()
            popen.wait(10)
