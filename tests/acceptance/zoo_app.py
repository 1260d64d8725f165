"""The app of the handler zoo (`pgjobs work --app tests.acceptance.zoo_app:app`): one ordinary
task, and handlers that raise or return what a worker could choke on. Each ordinary run inserts a
row in ``zoo_runs`` (created by the test with ``RUNS_DDL``), so the test can count runs."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any, NoReturn

import psycopg

import pgjobs

RUNS_DDL = """
DROP TABLE IF EXISTS zoo_runs;
CREATE TABLE zoo_runs (key bigint NOT NULL)
"""

app = pgjobs.App()
_local = threading.local()


def _record(key: int) -> None:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(os.environ["PGJOBS_DATABASE_URL"], autocommit=True)
    conn.execute("INSERT INTO zoo_runs (key) VALUES (%s)", [key])


@app.task(name="zoo.normal")
def normal(key: int) -> int:
    _record(key)
    return key


@app.task(name="zoo.normal_async")
async def normal_async(key: int) -> int:
    await asyncio.to_thread(_record, key)
    return key


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class Exotic(BaseException):
    """Neither an Exception nor one of Python's own BaseExceptions."""


# --- raising ------------------------------------------------------------------------------------


@app.task(name="zoo.str_raises", max_attempts=1)
def str_raises() -> NoReturn:
    raise Unprintable


@app.task(name="zoo.surrogate_error", max_attempts=1)
def surrogate_error() -> NoReturn:
    raise ValueError("bad \ud800 text \udcff")


@app.task(name="zoo.keyboard_interrupt_async", max_attempts=1)
async def keyboard_interrupt_async() -> NoReturn:
    raise KeyboardInterrupt


@app.task(name="zoo.system_exit_async", max_attempts=1)
async def system_exit_async() -> NoReturn:
    sys.exit(3)


@app.task(name="zoo.base_exception_async", max_attempts=1)
async def base_exception_async() -> NoReturn:
    raise Exotic("exotic")


@app.task(name="zoo.cancelled_async", max_attempts=1)
async def cancelled_async() -> NoReturn:
    raise asyncio.CancelledError("nobody asked")


@app.task(name="zoo.keyboard_interrupt_sync", max_attempts=1)
def keyboard_interrupt_sync() -> NoReturn:
    raise KeyboardInterrupt


@app.task(name="zoo.system_exit_sync", max_attempts=1)
def system_exit_sync() -> NoReturn:
    sys.exit(3)


# --- returning ----------------------------------------------------------------------------------


@app.task(name="zoo.tuple_keys")
def tuple_keys() -> dict[Any, str]:
    return {(1, 2): "x"}


@app.task(name="zoo.deep")
async def deep() -> list[Any]:
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]
    return value


@app.task(name="zoo.surrogate_result")
def surrogate_result() -> str:
    return "half \ud800 a pair"


class Unshowable:
    def __str__(self) -> str:
        raise RuntimeError("no str either")


@app.task(name="zoo.unshowable_result")
def unshowable_result() -> Unshowable:
    return Unshowable()
