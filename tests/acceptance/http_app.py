"""The app of the `pgjobs work --http` tests: tasks with known outcomes, one that holds its slot
until the test creates a file, and an external task (queue "downstream") whose URL the worker is
given with --external-url; a worker run with ``--queue default`` needs none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pgjobs

app = pgjobs.App()  # DSN from --dsn or $PGJOBS_DATABASE_URL


@app.task(name="http.ok")
def ok(n: int) -> int:
    return n


@app.task(name="http.broken")
def broken() -> None:
    raise pgjobs.NonRetryableError("broken for good")


@app.task(name="http.flaky", retry_base=0.05, retry_cap=0.1)
def flaky() -> str:
    if pgjobs.current_job().job.attempts == 1:
        raise RuntimeError("first attempt fails")
    return "second attempt works"


app.external_task("http.external", lease=120, queue="downstream")


@app.task(name="http.hold")
async def hold(gate: str) -> None:
    """Occupies its slot until the file ``gate`` exists."""
    while not Path(gate).exists():
        await asyncio.sleep(0.05)
