"""The running job as its handler sees it: ``JobContext`` and ``pgjobs.current_job()``.

A context knows its job, how to ask for a longer lease (a callback its worker gives it) and
where to read what the jobs before it left (the app's pools, ``pgjobs.flow``); it knows nothing
of the worker itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, NoReturn

from pgjobs import flow
from pgjobs.errors import ConfigurationError, PgjobsError, Snooze
from pgjobs.models import Job
from pgjobs.text import storable

#: Longest lease extension (seconds): a year. A job that runs longer extends again.
MAX_EXTENSION = 365 * 86400.0
#: Seconds between two writes of a job's progress: a call sooner is kept until then (the last
#: value always lands, at the latest with the job's outcome).
PROGRESS_INTERVAL = 1.0
#: Longest progress message, in characters.
MAX_PROGRESS_MESSAGE = 1000


class JobContext:
    """The running job as its handler sees it, from ``pgjobs.current_job()``.

    ``cancelled`` becomes True when the run was stopped from outside: the task's ``timeout``
    passed, or ``pgjobs cancel --force`` cancelled the job. An async handler is cancelled too
    (it sees ``asyncio.CancelledError``); a sync handler, which Python cannot interrupt, should
    check it between steps and return: whatever it does afterwards is discarded.

    Example::

        @app.task(timeout=60, lease=120)
        def export(rows: list[int]) -> None:
            for row in rows:
                if pgjobs.current_job().cancelled:
                    return  # timed out or force-cancelled: the outcome is already decided
                write(row)
    """

    __slots__ = (
        "_extend",
        "_progress",
        "_progress_asked",
        "_progress_last",
        "_progress_sent",
        "_reads",
        "_report",
        "cancelled",
        "job",
        "lease_lost",
        "stopped",
    )

    def __init__(
        self,
        job: Job,
        extend: Callable[[JobContext, float], None],
        report: Callable[[JobContext, float], None] | None = None,
        reads: flow.Runner | None = None,
    ) -> None:
        self.job = job
        #: Where the results of other jobs are read (the app's pools; None: nowhere).
        self._reads = reads
        #: Called with (this context, seconds) from the handler's thread: write this job's
        #: progress in that many seconds (None: progress is kept here only).
        self._report = report
        #: The latest progress (JSON text), the one last taken to be written, whether a write is
        #: asked for already, and when the last one was taken (time.monotonic()).
        self._progress: str | None = None
        self._progress_sent: str | None = None
        self._progress_asked = False
        self._progress_last = -math.inf
        #: Called with (this context, seconds) from the handler's thread; the worker sends the
        #: extension on its next round trip.
        self._extend = extend
        #: True once the worker learned that this job's lease is no longer held: the job may be
        #: running elsewhere, and this run's outcome will be discarded.
        self.lease_lost = False
        #: True once the run was stopped from outside (timeout or force-cancel): a sync handler
        #: checks it to stop early; its outcome no longer counts.
        self.cancelled = False
        #: Why the worker stopped the run ("timeout", "cancel"), None while it runs normally.
        #: Set on the worker's loop; the outcome of a stopped run is not settled again.
        self.stopped: str | None = None

    def extend_lease(self, seconds: float) -> None:
        """Hold this job's lease until ``seconds`` from now. Returns at once: the worker sends
        the extension on its next round trip (within milliseconds), from sync and async handlers
        alike. Call it periodically from long handlers, well before the lease runs out.

        Example: ``pgjobs.current_job().extend_lease(600)``
        """
        try:
            value = float(seconds)
        except (TypeError, ValueError, OverflowError):
            value = float("nan")
        if not 0 < value <= MAX_EXTENSION:  # NaN and infinity too: PostgreSQL cannot add them
            raise ConfigurationError(
                f"extend_lease takes seconds > 0 and at most {MAX_EXTENSION:.0f}, got {seconds!r}"
            )
        self._extend(self, value)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the handler got: ``done`` (a number >= 0) of ``total`` (None, or a
        number > 0), with an optional ``message`` (at most 1,000 characters). Returns at once;
        stored on the job's row at most once a second (a call sooner is kept and written then,
        or with the job's outcome at the latest), and kept in its archive or dead letter.
        ``pgjobs job show``, the API and the dashboard show it. Bad input raises
        ``ConfigurationError``.

        Example: ``pgjobs.current_job().progress(40, 100, "resizing")``
        """
        value = progress_json(done, total, message)
        self._progress = value
        if self._report is None or self._progress_asked:
            return  # a write is due already: it takes the latest value
        self._progress_asked = True
        self._report(self, max(0.0, self._progress_last + PROGRESS_INTERVAL - time.monotonic()))

    @property
    def progress_pending(self) -> bool:
        """A progress was reported that no write has taken yet."""
        return self._progress is not self._progress_sent

    def take_progress(self) -> str | None:
        """The latest progress (JSON text), now being written: on the worker's loop."""
        self._progress_last = time.monotonic()
        self._progress_asked = False
        value = self._progress_sent = self._progress
        return value

    def dependency_results(self) -> flow.DependencyResults:
        """The results of the jobs this job was enqueued ``after``: by id and by the names
        given at enqueue (``after={"charge": 41}``), read in one statement. A dependency whose
        archived row was pruned raises ``JobNotFound`` when its result is read (the others stay
        readable); see ``pgjobs.flow.DependencyResults``. From an async handler, await
        ``dependency_results_async()``.

        Example: ``receipt = pgjobs.current_job().dependency_results()["charge"]["receipt"]``
        """
        reads = self._runner("dependency_results")
        job_id = self.job.id
        return reads.run(lambda conn, _dsn: flow.dependency_results(conn, job_id))

    async def dependency_results_async(self) -> flow.DependencyResults:
        """``dependency_results`` for an async handler, without blocking the event loop.

        Example: ``results = await pgjobs.current_job().dependency_results_async()``
        """
        reads = self._reads_or_refuse("dependency_results_async")
        job_id = self.job.id
        return await reads.run_async(lambda conn, _dsn: flow.dependency_results_async(conn, job_id))

    def batch_results(self, page_size: int = flow.PAGE_SIZE) -> Iterator[flow.JobResult]:
        """In a batch's callback: every member of its batch, in id order, with its outcome and
        result (``pgjobs.flow.JobResult``), read ``page_size`` at a time: one page in memory
        whatever the batch's size. A job that is no batch's callback is refused
        (``PgjobsError``). From an async handler, ``batch_results_async()``.

        Example::

            @app.task()
            def summarise(batch: dict[str, int]) -> int:
                members = pgjobs.current_job().batch_results()
                return sum(m.result["rows"] for m in members if m.succeeded)
        """
        reads = self._runner("batch_results")
        flow.check_page(1, 0, page_size)
        job = self.job
        batch_id = reads.run(lambda conn, _dsn: flow.checked_callback(conn, job))
        return flow.iter_batch(reads, batch_id, page_size)

    async def batch_results_async(
        self, page_size: int = flow.PAGE_SIZE
    ) -> AsyncIterator[flow.JobResult]:
        """``batch_results`` for an async handler: ``async for member in
        current_job().batch_results_async(): ...``"""
        reads = self._reads_or_refuse("batch_results_async")
        flow.check_page(1, 0, page_size)
        job = self.job
        batch_id = await reads.run_async(lambda conn, _dsn: flow.checked_callback_async(conn, job))
        async for member in flow.iter_batch_async(reads, batch_id, page_size):
            yield member

    def _reads_or_refuse(self, what: str) -> flow.Runner:
        if self._reads is None:
            raise PgjobsError(
                f"{what}() reads the database: it works in a handler run by a pgjobs worker or "
                "pgjobs.testing.drain, not under eager()"
            )
        return self._reads

    def _runner(self, what: str) -> flow.Runner:
        """The reads of a sync call, refused on a running event loop (it would block it)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._reads_or_refuse(what)
        raise ConfigurationError(
            f"{what}() blocks: in an async handler, use {what}_async() (await it, or async for)"
        )

    def snooze(self, seconds: float) -> NoReturn:
        """Put this job back in the queue for ``seconds`` without spending an attempt: raises
        ``pgjobs.Snooze(seconds)``, which ends the handler (let it propagate).

        Example: ``pgjobs.current_job().snooze(30)``
        """
        raise Snooze(seconds)


def progress_json(done: object, total: object = None, message: object = None) -> str:
    """A progress as stored: ``{"done", "total", "message", "at"}`` (JSON text), its input
    checked (``ConfigurationError``).

    Example: ``json.loads(progress_json(1, 4))["total"] == 4``
    """
    if not _number(done) or done < 0:  # type: ignore[operator]
        raise ConfigurationError(f"progress done must be a number >= 0, got {done!r}")
    if total is not None and (not _number(total) or total <= 0):  # type: ignore[operator]
        raise ConfigurationError(f"progress total must be None or a number > 0, got {total!r}")
    if message is not None:
        if not isinstance(message, str):
            raise ConfigurationError(
                f"progress message must be a string, got {type(message).__name__}"
            )
        message = str.__str__(message)  # the text itself: a subclass' len() or `in` may lie
        if len(message) > MAX_PROGRESS_MESSAGE:
            raise ConfigurationError(
                f"progress message must be at most {MAX_PROGRESS_MESSAGE:,} characters, got "
                f"{len(message):,} characters"
            )
        if storable(message) != message:
            raise ConfigurationError(
                f"progress message must be text PostgreSQL can store, without NUL or a lone "
                f"surrogate (not valid UTF-8), got {ascii(message)[:80]}"
            )
    at = datetime.now(UTC).isoformat()
    return json.dumps({"done": done, "total": total, "message": message, "at": at})


def _number(value: object) -> bool:
    """A finite int or float (not a bool), one that a float can hold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


_current_job: contextvars.ContextVar[JobContext] = contextvars.ContextVar("pgjobs_current_job")


def current_job() -> JobContext:
    """The job the calling handler runs for; only inside a handler run by a pgjobs worker.

    Example::

        @app.task(lease=60)
        def crunch(path: str) -> None:
            for chunk in read_chunks(path):
                process(chunk)
                pgjobs.current_job().extend_lease(60)
    """
    try:
        return _current_job.get()
    except LookupError:
        raise PgjobsError(
            "current_job() works only inside a handler run by a pgjobs worker"
        ) from None


def call_sync(context: JobContext, fn: Callable[..., Any], payload: dict[str, Any]) -> Any:
    """Run a sync handler with ``context`` as its ``current_job()``."""
    token = _current_job.set(context)
    try:
        return fn(**payload)
    finally:
        _current_job.reset(token)


class HandlerExit(Exception):
    """What an async handler raised when that is not an ``Exception`` (``KeyboardInterrupt``,
    ``SystemExit``, ``GeneratorExit``, a ``CancelledError`` nobody asked for, any other
    ``BaseException``), carried as an ordinary exception in ``original``: asyncio would otherwise
    stop the worker's event loop with it. It is that job's outcome, nothing more."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(type(original).__name__)
        self.original = original


async def call_async(context: JobContext, fn: Callable[..., Any], payload: dict[str, Any]) -> Any:
    """Run an async handler with ``context`` as its ``current_job()``. A ``BaseException`` it
    raises comes out as ``HandlerExit``, but the cancellation of its task by the worker."""
    _current_job.set(context)  # the task runs in a copy of the context: nothing leaks out
    try:
        return await fn(**payload)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the worker cancelled it (shutdown)
        raise HandlerExit(exc) from exc
    except Exception:
        raise
    except BaseException as exc:
        raise HandlerExit(exc) from exc
