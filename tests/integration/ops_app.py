"""The app of the operations tests (registry, stats --watch, online upgrade), run as
``pgjobs work --app tests.integration.ops_app:app`` (see
``tests.support.helpers.pgjobs_process``)."""

from __future__ import annotations

import os
import time

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
