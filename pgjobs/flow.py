"""Results flowing from job to job: what a dependent reads of the jobs it waited for
(``current_job().dependency_results()``), and what a batch's callback, or anyone, reads of the
batch's members (``current_job().batch_results()``, ``app.batch_results(batch_id)``), a page at
a time.

Both read where each job is now, in one statement per read: a succeeded job's result is its
``archived_jobs`` row's (within the limit its worker stored it under,
``WorkerConfig.max_result_bytes``); a job in ``dead_letter`` has its reason and error instead.
A job whose archived row was pruned (``pgjobs prune``, the retention policy) or purged is in no
table: its result is gone, and reading it raises ``JobNotFound`` saying so, while the other
results stay readable.

A batch's members come in pages by id (a keyset: each page is one statement on a connection
given back after it, whatever the batch's size): at most ``limit`` members, and fewer when
their results add up to more than ``PAGE_BYTES`` of JSON text (a page holds at least one). The
iterators hold one page at a time: reading 100,000 members costs the memory of one page.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg

from pgjobs import db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import (
    BatchNotFound,
    ConfigurationError,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobNotFound,
    JobStateConflict,
    PgjobsError,
)
from pgjobs.models import ArchivedStatus, Job, JobStatus
from pgjobs.submission import MAX_JOB_ID
from pgjobs.text import MAX_RESULT_BYTES

T = TypeVar("T")

#: Members per page by default (``app.batch_results``, the callback's, the API's).
PAGE_SIZE = 500
#: Most members one page may hold.
MAX_PAGE_SIZE = 10_000
#: Bytes of results' JSON text past which a page ends early (the first member always comes):
#: the default limit of one result, so a page is about as large as one result may be.
PAGE_BYTES = MAX_RESULT_BYTES
#: The key of a batch callback's payload that names its batch (``batches.BATCH_KEY``).
BATCH_KEY = "batch"


class Runner(Protocol):
    """Runs work on a connection it lends and takes back: an App's pools (``pgjobs.pools``)."""

    def run(self, work: Callable[[psycopg.Connection[Any], Dsn], T]) -> T: ...

    async def run_async(
        self, work: Callable[[psycopg.AsyncConnection[Any], Dsn], Awaitable[T]]
    ) -> T: ...


class Direct:
    """A ``Runner`` that opens a connection of its own for each read and closes it after (for
    ``pgjobs.testing.drain``, which holds no pool).

    Example: ``flow.Direct(dsn).run(lambda conn, dsn: flow.dependency_results(conn, 43))``
    """

    def __init__(self, dsn: Dsn) -> None:
        self.dsn = dsn

    def run(self, work: Callable[[psycopg.Connection[Any], Dsn], T]) -> T:
        """``work(conn, dsn)`` on a new connection, closed after."""
        conn = db.connect(self.dsn)
        try:
            return work(conn, self.dsn)
        finally:
            conn.close()

    async def run_async(
        self, work: Callable[[psycopg.AsyncConnection[Any], Dsn], Awaitable[T]]
    ) -> T:
        """``run`` on a new async connection."""
        conn = await db.connect_async(self.dsn)
        try:
            return await work(conn, self.dsn)
        finally:
            await conn.close()


@dataclass(frozen=True, slots=True)
class JobResult:
    """What one job left, where it is now: a dependency of the running job, or a batch member.

    ``status`` is None when the job is in no table (its archived row pruned or purged);
    ``reason``, ``error_type`` and ``last_error`` are a dead letter's; ``name`` is the name the
    dependent gave it (``after={"charge": ...}``), None for a batch member or a job named by id.
    ``value()`` is its result as ``app.wait`` returns it, or the error ``app.wait`` raises.

    Example::

        for member in app.batch_results(batch_id):
            if member.succeeded:
                total += member.result["rows"]
    """

    id: int
    task: str | None
    status: JobStatus | None
    result: Any
    reason: str | None = None
    error_type: str | None = None
    last_error: str | None = None
    name: str | None = None

    @property
    def succeeded(self) -> bool:
        """Whether the job succeeded (its ``result`` is what its handler returned)."""
        return self.status is JobStatus.SUCCEEDED

    def value(self) -> Any:
        """The result of a succeeded job; else raises what ``app.wait`` would: ``JobFailed``
        (dead), ``JobCancelled`` / ``JobExpired``, ``JobNotFound`` (pruned or purged: the
        result is gone), ``JobStateConflict`` (not ended: queued again, by a redrive).

        Example: ``app.batch_results_page(7).results[0].value()``
        """
        status = self.status
        if status is JobStatus.SUCCEEDED:
            return self.result
        named = f" ({self.name})" if self.name else ""
        if status is None:
            raise JobNotFound(
                f"job {self.id}{named} is in no pgjobs table: its archived row was pruned or "
                "purged, and its result with it"
            )
        if status is JobStatus.DEAD:
            raise JobFailed(self.id, self.reason or "", self.error_type, self.last_error)
        if status is JobStatus.EXPIRED:
            raise JobExpired(self.id)
        if status is JobStatus.CANCELLED:
            raise JobCancelled(self.id, status)
        raise JobStateConflict(f"job {self.id}{named} has not ended: it is {status}")


class DependencyResults:
    """The results of the jobs the running job waited for (``after=``), read in one statement:
    by id (``results[41]``) and by the name given at enqueue (``results["charge"]``). Iterating
    gives the ids, in id order; ``names`` maps names to ids; ``outcome(key)`` is the whole
    ``JobResult``. A key it did not wait for is a ``KeyError``; a job whose result is gone
    (pruned) or that did not succeed raises as ``JobResult.value`` says.

    Example::

        @app.task()
        def ship(order: int) -> None:
            results = pgjobs.current_job().dependency_results()
            label(results["charge"]["receipt"], results["stock"]["shelf"])
    """

    __slots__ = ("_by_id", "names")

    def __init__(self, outcomes: list[JobResult]) -> None:
        self._by_id = {outcome.id: outcome for outcome in outcomes}
        #: The names given at enqueue, to the ids they name.
        self.names: dict[str, int] = {o.name: o.id for o in outcomes if o.name is not None}

    def outcome(self, key: int | str) -> JobResult:
        """The ``JobResult`` of the dependency ``key`` (its id or its name)."""
        job_id = self.names.get(key) if isinstance(key, str) else key
        found = self._by_id.get(job_id) if isinstance(job_id, int) else None
        if found is None:
            raise KeyError(key)
        return found

    def __getitem__(self, key: int | str) -> Any:
        return self.outcome(key).value()

    def get(self, key: int | str, default: Any = None) -> Any:
        """``results[key]``, or ``default`` when the job did not wait for ``key``."""
        try:
            outcome = self.outcome(key)
        except KeyError:
            return default
        return outcome.value()

    def __contains__(self, key: object) -> bool:
        return (key in self.names) if isinstance(key, str) else (key in self._by_id)

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def outcomes(self) -> list[JobResult]:
        """Every dependency's ``JobResult``, in id order."""
        return list(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{o.id}" + (f" ({o.name})" if o.name else "") + f": {o.status}"
            for o in self._by_id.values()
        )
        return f"DependencyResults({shown})"


@dataclass(frozen=True, slots=True)
class ResultsPage:
    """One page of a batch's members: ``results`` in id order, and ``next_after``, the
    ``after`` of the next page (None: this was the last).

    Example::

        page = app.batch_results_page(batch_id, limit=1000)
        while True:
            consume(page.results)
            if page.next_after is None:
                break
            page = app.batch_results_page(batch_id, after=page.next_after, limit=1000)
    """

    results: list[JobResult]
    next_after: int | None


def _outcome(row: tuple[Any, ...], name: str | None = None) -> JobResult:
    job_id, task, home, status, result, reason, error_type, last_error = row[:8]
    stat: JobStatus | None
    if home == "archived_jobs":
        stat = JobStatus(ArchivedStatus(status))
    else:
        stat = None if status is None else JobStatus(status)
    return JobResult(int(job_id), task, stat, result, reason, error_type, last_error, name)


def _dependencies(rows: list[tuple[Any, ...]]) -> DependencyResults:
    """DEPENDENCY_RESULTS' rows as ``DependencyResults``."""
    outcomes = []
    for job_id, name, home, status, result, reason, error_type, last_error in rows:
        row = (job_id, None, home, status, result, reason, error_type, last_error)
        outcomes.append(_outcome(row, name))
    return DependencyResults(outcomes)


def dependency_results(conn: psycopg.Connection[Any], job_id: int) -> DependencyResults:
    """The results of the jobs job ``job_id`` depends on (empty: it has none), on ``conn``.

    Example: ``flow.dependency_results(conn, 43)["charge"]``
    """
    return _dependencies(db.fetch_all(conn, queries.DEPENDENCY_RESULTS, {"id": job_id}))


async def dependency_results_async(
    conn: psycopg.AsyncConnection[Any], job_id: int
) -> DependencyResults:
    """``dependency_results`` on an async connection."""
    with db.translate_errors():
        cursor = await conn.execute(queries.DEPENDENCY_RESULTS, {"id": job_id})
        return _dependencies(await db.fetch_rows_async(cursor))


def of(target: db.Target, job_id: int) -> DependencyResults:
    """``dependency_results`` on ``target`` (a DSN or the caller's connection), as `pgjobs job
    show` and the API read them.

    Example: ``flow.of(dsn, 43).names``
    """
    with db.target_connection(target) as conn:
        return dependency_results(conn, job_id)


def shown(results: DependencyResults, budget: int = PAGE_BYTES) -> dict[int, Any]:
    """The results a job's page shows beside its dependencies: those of the succeeded ones, in id
    order, while their JSON text adds up to at most ``budget`` bytes (the first always); the
    rest are left out (each job's own page has its result).

    Example: ``flow.shown(flow.of(dsn, 43))[41]``
    """
    found: dict[int, Any] = {}
    spent = 0
    for outcome in results.outcomes():
        if not outcome.succeeded:
            continue
        size = len(json.dumps(outcome.result, default=str))
        if found and spent + size > budget:
            break
        found[outcome.id] = outcome.result
        spent += size
    return found


def check_page(batch_id: object, after: object, limit: object) -> tuple[int, int, int]:
    """A page's ``(batch_id, after, limit)`` checked: an id in 1..2**63-1, ``after`` a member id
    (0: from the first), ``limit`` 1..``MAX_PAGE_SIZE`` (``ConfigurationError``)."""
    for name, value, low in (("batch_id", batch_id, 1), ("after", after, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_JOB_ID:
            raise ConfigurationError(
                f"{name} must be a whole number in {low}..{MAX_JOB_ID}, got {value!r}", field=name
            )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ConfigurationError(
            f"limit must be a whole number in 1..{MAX_PAGE_SIZE:,}, got {limit!r}", field="limit"
        )
    return batch_id, after, limit  # type: ignore[return-value]


def _page(rows: list[tuple[Any, ...]]) -> ResultsPage:
    kept = [_outcome(row) for row in rows if row[8]]
    more = len(kept) < len(rows)
    return ResultsPage(kept, kept[-1].id if more and kept else None)


def _params(batch_id: int, after: int, limit: int) -> dict[str, Any]:
    return {"id": batch_id, "after": after, "limit": limit, "bytes": PAGE_BYTES}


def _missing(batch_id: int) -> BatchNotFound:
    return BatchNotFound(f"no batch {batch_id} (never created, or its id is mistyped)")


def batch_page(
    conn: psycopg.Connection[Any], batch_id: int, after: int = 0, limit: int = PAGE_SIZE
) -> ResultsPage:
    """Batch ``batch_id``'s members after member ``after``, at most ``limit`` (fewer when their
    results pass ``PAGE_BYTES``), with their results and outcomes; ``BatchNotFound`` for an
    unknown batch.

    Example: ``flow.batch_page(conn, 7, limit=100).results``
    """
    batch_id, after, limit = check_page(batch_id, after, limit)
    page = _page(db.fetch_all(conn, queries.BATCH_RESULTS_PAGE, _params(batch_id, after, limit)))
    if not page.results and not db.fetch_all(conn, queries.BATCH_CALLBACK, {"id": batch_id}):
        raise _missing(batch_id)
    return page


async def batch_page_async(
    conn: psycopg.AsyncConnection[Any], batch_id: int, after: int = 0, limit: int = PAGE_SIZE
) -> ResultsPage:
    """``batch_page`` on an async connection."""
    batch_id, after, limit = check_page(batch_id, after, limit)
    with db.translate_errors():
        cursor = await conn.execute(queries.BATCH_RESULTS_PAGE, _params(batch_id, after, limit))
        page = _page(await db.fetch_rows_async(cursor))
        if not page.results:
            cursor = await conn.execute(queries.BATCH_CALLBACK, {"id": batch_id})
            if await cursor.fetchone() is None:
                raise _missing(batch_id)
    return page


def _read(
    conn: psycopg.Connection[Any], _dsn: Dsn, *, batch_id: int, after: int, limit: int
) -> ResultsPage:
    return batch_page(conn, batch_id, after, limit)


async def _read_async(
    conn: psycopg.AsyncConnection[Any], _dsn: Dsn, *, batch_id: int, after: int, limit: int
) -> ResultsPage:
    return await batch_page_async(conn, batch_id, after, limit)


def iter_batch(runner: Runner, batch_id: int, page_size: int = PAGE_SIZE) -> Iterator[JobResult]:
    """Every member of batch ``batch_id`` in id order, read a page at a time (each page on a
    connection ``runner`` lends for that statement only); its arguments checked at once.

    Example: ``sum(1 for m in flow.iter_batch(app_pools, 7) if m.succeeded)``
    """
    check_page(batch_id, 0, page_size)
    return _pages(runner, batch_id, page_size)


def _pages(runner: Runner, batch_id: int, page_size: int) -> Iterator[JobResult]:
    after: int | None = 0
    while after is not None:
        page = runner.run(functools.partial(_read, batch_id=batch_id, after=after, limit=page_size))
        yield from page.results
        after = page.next_after


def iter_batch_async(
    runner: Runner, batch_id: int, page_size: int = PAGE_SIZE
) -> AsyncIterator[JobResult]:
    """``iter_batch`` for asyncio code: ``async for member in ...``."""
    check_page(batch_id, 0, page_size)
    return _pages_async(runner, batch_id, page_size)


async def _pages_async(runner: Runner, batch_id: int, page_size: int) -> AsyncIterator[JobResult]:
    after: int | None = 0
    while after is not None:
        read = functools.partial(_read_async, batch_id=batch_id, after=after, limit=page_size)
        page = await runner.run_async(read)
        for member in page.results:
            yield member
        after = page.next_after


def callback_batch(job: Job) -> int:
    """The batch whose callback ``job`` is, from the ``"batch"`` key its payload got from the
    batch (checked against the batch's row by the read that follows: ``check_callback``)."""
    given = job.payload.get(BATCH_KEY) if isinstance(job.payload, dict) else None
    batch_id = given.get("id") if isinstance(given, dict) else None
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 1:
        raise PgjobsError(
            f"job {job.id} ({job.task}) is no batch's callback: batch_results() reads the "
            "members of the batch whose callback runs; elsewhere use app.batch_results(batch_id)"
        )
    return batch_id


def check_callback(row: tuple[Any, ...] | None, job: Job, batch_id: int) -> None:
    """BATCH_CALLBACK's row for ``batch_id``: ``job`` must be that batch's callback."""
    if row is None or row[0] != job.id:
        raise PgjobsError(
            f"job {job.id} ({job.task}) is not the callback of batch {batch_id}: its payload's "
            f"{BATCH_KEY!r} key was not written by that batch"
        )


def checked_callback(conn: psycopg.Connection[Any], job: Job) -> int:
    """``job``'s batch, once its row names ``job`` as its callback."""
    batch_id = callback_batch(job)
    rows = db.fetch_all(conn, queries.BATCH_CALLBACK, {"id": batch_id})
    check_callback(rows[0] if rows else None, job, batch_id)
    return batch_id


async def checked_callback_async(conn: psycopg.AsyncConnection[Any], job: Job) -> int:
    """``checked_callback`` on an async connection."""
    batch_id = callback_batch(job)
    with db.translate_errors():
        cursor = await conn.execute(queries.BATCH_CALLBACK, {"id": batch_id})
        check_callback(await cursor.fetchone(), job, batch_id)
    return batch_id
