"""What the tests of timeouts and force-cancel share: handlers that wait at most until their
test ends, so that a failing test never leaves a handler running past the worker's grace period
(the worker would then leave the process with ``os._exit``, taking the test run with it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from pgjobs import App
from pgjobs.worker import Worker
from tests.support.external import run_worker_while

#: Set when the running test's scenario ends (however it ends); cleared before each test.
OVER = threading.Event()


async def sleep_until_over(seconds: float) -> None:
    """``asyncio.sleep(seconds)``, cut short when the test's scenario ended."""
    end = time.monotonic() + seconds
    while not OVER.is_set() and time.monotonic() < end:
        await asyncio.sleep(0.02)


def run_worker(app: App, scenario: Callable[[Worker], None], **config: Any) -> tuple[Worker, int]:
    """``run_worker_while``, with ``OVER`` set when the scenario ends."""
    OVER.clear()

    def bounded(worker: Worker) -> None:
        try:
            scenario(worker)
        finally:
            OVER.set()

    return run_worker_while(app, bounded, **config)


def block_until(event: threading.Event, seconds: float) -> None:
    """``event.wait(seconds)`` in a sync handler, cut short when the test's scenario ended."""
    end = time.monotonic() + seconds
    while not (event.is_set() or OVER.is_set()) and time.monotonic() < end:
        time.sleep(0.02)
