"""The benchmark app: no-op, sleeping and latency-recording tasks, all on the queue ``bench``.

Workers load it with ``pgjobs work --app benchmarks.tasks:app`` from the repository root.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, TextIO

import pgjobs
from benchmarks import QUEUE

#: File the latency task appends "n time.time()" lines to (set by the latency benchmark).
LATENCY_FILE_ENV = "PGJOBS_BENCH_LATENCY_FILE"

app = pgjobs.App()


@app.task(name="bench.noop", queue=QUEUE)
async def noop(**_: Any) -> None:
    """Does nothing: what is left is the queue's own cost."""


@app.task(name="bench.noop_sync", queue=QUEUE)
def noop_sync(**_: Any) -> None:
    """Does nothing, in the worker's thread pool."""


@app.task(name="bench.sleep", queue=QUEUE)
async def sleep(seconds: float = 0.5) -> None:
    """Holds a slot for ``seconds`` without using CPU."""
    await asyncio.sleep(seconds)


@app.task(name="bench.sleep_sync", queue=QUEUE)
def sleep_sync(seconds: float = 0.5) -> None:
    """Holds a slot (and a thread of the pool) for ``seconds``."""
    time.sleep(seconds)


#: The fan-in of a fan-out batch: the callback of ``bench.fan_out``'s batch (a no-op).
FAN_IN = pgjobs.JobSpec("bench.noop", {"fan_in": 1}, queue=QUEUE)


@app.task(name="bench.fan_out", queue=QUEUE)
async def fan_out(width: int) -> None:
    """Enqueues ``width`` no-op jobs as a batch whose callback, a no-op job, runs once they have
    all ended: the batch form of a 1 -> ``width`` -> 1 graph."""
    async with app.batch(on_complete=FAN_IN) as batch:
        for _ in range(width):
            batch.enqueue("bench.noop", {}, queue=QUEUE)


_latency_file: TextIO | None = None


@app.task(name="bench.latency", queue=QUEUE)
async def latency(n: int) -> None:
    """Records when the handler started, as ``n time.time()``, for the pickup-latency figure."""
    started = time.time()
    global _latency_file
    if _latency_file is None:
        _latency_file = open(os.environ[LATENCY_FILE_ENV], "a")  # noqa: SIM115 (kept open)
    _latency_file.write(f"{n} {started!r}\n")
    _latency_file.flush()


#: The benchmark app with one more task, limited: ``bench.noop`` beside a task whose concurrency
#: limit is reached (``python -m benchmarks --only limits``). A worker of this app claims under
#: limits on every trip.
limited_app = pgjobs.App()
limited_app.task(name="bench.noop", queue=QUEUE)(noop.fn)

#: Jobs of ``bench.limited`` running at once, across every worker.
LIMITED_CONCURRENCY = 2


@limited_app.task(name="bench.limited", queue=QUEUE, concurrency=LIMITED_CONCURRENCY)
async def limited(seconds: float = 1.0) -> None:
    """Holds one of its LIMITED_CONCURRENCY slots for ``seconds``."""
    await asyncio.sleep(seconds)


#: The benchmark app of group m (``python -m benchmarks --only groups``): ``bench.noop`` (no
#: limit per group) and ``bench.grouped``, which runs at most GROUP_CONCURRENCY jobs of a group at
#: once across every worker.
grouped_app = pgjobs.App()
grouped_app.task(name="bench.noop", queue=QUEUE)(noop.fn)

#: Jobs of one group of ``bench.grouped`` running at once, across every worker.
GROUP_CONCURRENCY = 1


@grouped_app.task(name="bench.grouped", queue=QUEUE, group_concurrency=GROUP_CONCURRENCY)
async def grouped(**_: Any) -> None:
    """Does nothing, at most GROUP_CONCURRENCY at a time per group."""
