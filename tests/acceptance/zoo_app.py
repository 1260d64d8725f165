"""The app of the handler zoo (`pgjobs work --app tests.acceptance.zoo_app:app`): one ordinary
task, and handlers that raise or return what a worker could choke on. Each ordinary run inserts a
row in ``zoo_runs`` (created by the test with ``RUNS_DDL``), so the test can count runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable
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


# --- one hostile job in a trip of good ones (test_handler_zoo's trip tests) ---------------------

#: How many jobs each trip test runs at once ($ZOO_TRIP; 1: nobody waits). Each of them waits
#: here for the others, so that their outcomes are buffered together and go in one round trip.
_trip = threading.Barrier(int(os.environ.get("ZOO_TRIP", "1")))


def _together() -> None:
    """Wait for every job of the trip (at most 30 s); a retry waits for nobody."""
    if pgjobs.current_job().job.attempts == 1:
        with contextlib.suppress(threading.BrokenBarrierError):
            _trip.wait(timeout=30)


@app.task(name="zoo.beside")
def beside(key: int) -> int:
    _together()
    return key


@app.task(name="zoo.beside_async")
async def beside_async(key: int) -> int:
    await asyncio.to_thread(_together)
    return key


def _trip_task(name: str, **options: Any) -> Callable[[Callable[[], Any]], pgjobs.Task]:
    """Declare the task ``name``, whose handler first waits for its trip."""

    def declare(fn: Callable[[], Any]) -> pgjobs.Task:
        if asyncio.iscoroutinefunction(fn):

            async def run_async() -> Any:
                await asyncio.to_thread(_together)
                return await fn()

            return app.task(name=name, **options)(run_async)

        def run() -> Any:
            _together()
            return fn()

        return app.task(name=name, **options)(run)

    return declare


# Progress: refused in the handler (ConfigurationError), which fails its job.


class Sly(str):
    """Text that lies about what it holds."""

    def __contains__(self, _: object) -> bool:
        return False

    def __len__(self) -> int:
        return 0


@_trip_task("zoo.progress_surrogate", max_attempts=1)
def progress_surrogate() -> str:
    pgjobs.current_job().progress(1, 2, "half \ud800 a pair")
    return "reported"


@_trip_task("zoo.progress_surrogate_async", max_attempts=1)
async def progress_surrogate_async() -> str:
    pgjobs.current_job().progress(1, 2, "\udcff")
    return "reported"


@_trip_task("zoo.progress_nul", max_attempts=1)
def progress_nul() -> str:
    pgjobs.current_job().progress(1, None, "a\x00b")
    return "reported"


@_trip_task("zoo.progress_sly", max_attempts=1)
def progress_sly() -> str:
    pgjobs.current_job().progress(1, None, Sly("a\x00b"))
    return "reported"


@_trip_task("zoo.progress_huge", max_attempts=1)
def progress_huge() -> str:
    pgjobs.current_job().progress(10**400)
    return "reported"


@_trip_task("zoo.extend_infinite", max_attempts=1)
def extend_infinite() -> str:
    pgjobs.current_job().extend_lease(float("inf"))
    return "extended"


# retry_after: a value that is not seconds from 0 to a day is ignored (the backoff).


def _later(value: Any) -> Exception:
    error = Exception(f"later, after {type(value).__name__}")
    error.retry_after = value  # type: ignore[attr-defined]
    return error


class RetryAfterRaises(Exception):
    @property
    def retry_after(self) -> float:
        raise RuntimeError("no retry_after for you")


class RetryAfterExits(Exception):
    @property
    def retry_after(self) -> float:
        raise SystemExit(4)


_BACKOFF = {"max_attempts": 2, "retry_base": 0.01, "retry_cap": 0.02}


@_trip_task("zoo.retry_after_huge", **_BACKOFF)
def retry_after_huge() -> NoReturn:
    raise _later(10**400)


@_trip_task("zoo.retry_after_huge_async", **_BACKOFF)
async def retry_after_huge_async() -> NoReturn:
    raise _later(10**400)


@_trip_task("zoo.retry_after_infinite", **_BACKOFF)
def retry_after_infinite() -> NoReturn:
    raise _later(float("inf"))


@_trip_task("zoo.retry_after_nan", **_BACKOFF)
def retry_after_nan() -> NoReturn:
    raise _later(float("nan"))


@_trip_task("zoo.retry_after_negative", **_BACKOFF)
def retry_after_negative() -> NoReturn:
    raise _later(-5)


@_trip_task("zoo.retry_after_raises", **_BACKOFF)
def retry_after_raises() -> NoReturn:
    raise RetryAfterRaises("asked when")


@_trip_task("zoo.retry_after_exits", **_BACKOFF)
def retry_after_exits() -> NoReturn:
    raise RetryAfterExits("asked when")


# Snooze: seconds that are not 0 to a year fail the attempt (ValueError).


class NoSeconds(pgjobs.Snooze):
    def __init__(self) -> None:
        Exception.__init__(self, "later")


@_trip_task("zoo.snooze_infinite", max_attempts=1)
def snooze_infinite() -> NoReturn:
    pgjobs.current_job().snooze(float("inf"))


@_trip_task("zoo.snooze_huge", max_attempts=1)
def snooze_huge() -> NoReturn:
    raise pgjobs.Snooze(10**400)


@_trip_task("zoo.snooze_altered", max_attempts=1)
def snooze_altered() -> NoReturn:
    snooze = pgjobs.Snooze(1)
    snooze.seconds = float("nan")
    raise snooze


@_trip_task("zoo.snooze_altered_async", max_attempts=1)
async def snooze_altered_async() -> NoReturn:
    snooze = pgjobs.Snooze(1)
    snooze.seconds = 10**400
    raise snooze


@_trip_task("zoo.snooze_without_seconds", max_attempts=1)
def snooze_without_seconds() -> NoReturn:
    raise NoSeconds


# Error text and traceback: stored as one line of at most 2,000 characters, and a bounded
# traceback, whatever the exception's message holds.


class SurrogateStr(Exception):
    def __str__(self) -> str:
        return "\ud800 alone"


class NulStr(Exception):
    def __str__(self) -> str:
        return "a\x00b"


class ExitingStr(Exception):
    def __str__(self) -> str:
        raise SystemExit(5)


class Unnamed(Exception):
    pass


Unnamed.__module__ = Unshowable()  # type: ignore[assignment]


@_trip_task("zoo.error_str_raises", max_attempts=1)
def error_str_raises() -> NoReturn:
    raise Unprintable


@_trip_task("zoo.error_str_exits", max_attempts=1)
def error_str_exits() -> NoReturn:
    raise ExitingStr


@_trip_task("zoo.error_surrogate", max_attempts=1)
def error_surrogate() -> NoReturn:
    raise SurrogateStr


@_trip_task("zoo.error_nul", max_attempts=1)
def error_nul() -> NoReturn:
    raise NulStr


@_trip_task("zoo.error_huge", max_attempts=1)
def error_huge() -> NoReturn:
    raise ValueError("x" * 10_000_000)


@_trip_task("zoo.error_huge_async", max_attempts=1)
async def error_huge_async() -> NoReturn:
    raise ValueError("\u00e9" * 10_000_000)


@_trip_task("zoo.error_module", max_attempts=1)
def error_module() -> NoReturn:
    raise Unnamed("who am I")


# Results: stored as JSON, or as a note saying why not; the job succeeds.


class ExitingResult:
    def __str__(self) -> str:
        raise SystemExit(6)


@_trip_task("zoo.result_surrogate")
def result_surrogate() -> str:
    return "half \ud800 a pair"


@_trip_task("zoo.result_nul")
def result_nul() -> dict[str, str]:
    return {"a\x00": "b\x00"}


@_trip_task("zoo.result_huge")
def result_huge() -> str:
    return "x" * 10_000_000


@_trip_task("zoo.result_huge_int")
def result_huge_int() -> int:
    return 10**5000


@_trip_task("zoo.result_nan")
def result_nan() -> float:
    return float("nan")


@_trip_task("zoo.result_unshowable")
def result_unshowable() -> Unshowable:
    return Unshowable()


@_trip_task("zoo.result_exits")
def result_exits() -> ExitingResult:
    return ExitingResult()


@_trip_task("zoo.result_exits_async")
async def result_exits_async() -> ExitingResult:
    return ExitingResult()


# Tags: what a handler enqueues goes through the door, which refuses a bad tag in the handler.


@_trip_task("zoo.enqueue_bad_tag", max_attempts=1)
def enqueue_bad_tag() -> int:
    return app.enqueue("zoo.normal", {"key": -1}, tags=["\ud800"])
