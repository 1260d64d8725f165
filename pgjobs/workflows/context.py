"""``WorkflowContext``: what a durable workflow's handler takes first. Its steps return their
recorded results when the history holds them and run (then are recorded) when it does not; its
sleeps suspend the job; a step's ``transaction()`` commits the step's own writes with its record.

One class serves sync and async workflows: in an async one, ``step``, ``sleep``,
``sleep_until`` and ``transaction`` return awaitables (``fn`` may then be a coroutine function).
The decisions shared by both (where the run is in its history, what a failure leads to) live in
``Run``; the sync and async halves differ only in how they wait and reach the database.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from pgjobs import db
from pgjobs.context import MAX_EXTENSION, JobContext
from pgjobs.errors import (
    DatabaseUnavailable,
    QueryFailed,
    StepFailed,
    WorkflowDiverged,
    WorkflowError,
    WorkflowSuspended,
)
from pgjobs.text import MAX_RESULT_BYTES, error_line, error_text, error_type
from pgjobs.workflow_entries import WorkflowEntryKind, WorkflowEntryStatus
from pgjobs.workflows.history import (
    AsyncStore,
    Entry,
    StepRecord,
    Store,
    WorkflowLeaseLost,
    result_text,
)
from pgjobs.workflows.policy import StepPolicy, policy_of
from pgjobs.workflows.waiting import WaitingMethods

#: The longest sleep a workflow may take (ten years, in seconds): longer is taken for a mistake.
MAX_SLEEP = 10 * 366 * 86_400.0
#: A step's retry that waits at most this long (seconds) waits inside the run; a longer one
#: suspends the workflow (its slot given back) until the retry is due.
IN_RUN_RETRY_WAIT = 5.0
#: A sleep with at most this long left (seconds) when reached waits inside the run.
IN_RUN_SLEEP = 0.05
#: Longest step name, in characters.
MAX_STEP_NAME = 200

_STEP = WorkflowEntryKind.STEP.value
_SLEEP = WorkflowEntryKind.SLEEP.value


class Run:
    """Where one run of a workflow is in its history: the entries read when it started, the
    next place, the step names used, the step running now (and its transaction)."""

    def __init__(self, job: JobContext, task_name: str, defaults: StepPolicy, lease: float) -> None:
        self.job = job
        self.task = task_name
        self.defaults = defaults
        self.lease = lease
        self.history: list[Entry] = []
        self.seq = 0
        self.names: set[str] = set()
        self.active = False
        #: The name of the step running now (None between steps).
        self.step: str | None = None
        #: The connection and transaction of the running step, once it asked for one.
        self.conn: Any = None
        self.tx: Any = None
        #: The App that declared the workflow: its children are enqueued through it.
        self.app: Any = None

    def where(self) -> str:
        return f"workflow {self.task!r} (job {self.job.job.id})"

    def require_active(self, method: str) -> None:
        if not self.active:
            raise WorkflowError(
                f"ctx.{method}() works only while its workflow runs (in the handler that "
                "received the WorkflowContext, inside a pgjobs worker)"
            )
        if self.step is not None and method != "transaction":
            raise WorkflowError(
                f"ctx.{method}() called inside step {self.step!r}: steps do not nest; call it "
                "from the workflow's handler"
            )

    def place(self, kind: str, name: str) -> tuple[int, Entry | None]:
        """The next place, and what the history holds there (checked against ``kind`` and
        ``name``: another entry there is a divergence)."""
        seq = self.seq
        self.seq += 1
        entry = self.history[seq] if seq < len(self.history) else None
        if entry is not None and (entry.kind != kind or entry.name != name):
            raise WorkflowDiverged(
                f"{self.where()} diverged from its history at entry {seq}: recorded "
                f"{entry.kind} {entry.name!r}, the code now asks for {kind} {name!r} (the "
                "code changed under a running workflow)"
            )
        return seq, entry

    def finish(self) -> None:
        """The handler returned: every recorded entry must have been reached."""
        self.active = False
        if self.seq < len(self.history):
            entry = self.history[self.seq]
            raise WorkflowDiverged(
                f"{self.where()} diverged from its history: it returned after {self.seq} "
                f"entries, but entry {self.seq} ({entry.kind} {entry.name!r}) is recorded"
            )

    def step_name(self, name: object) -> str:
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_STEP_NAME:
            raise WorkflowError(
                f"a step's name must be non-empty text of at most {MAX_STEP_NAME} characters, "
                f"got {name!r:.60}"
            )
        if name in self.names:
            raise WorkflowError(
                f"step name {name!r} is used twice in one run of {self.where()}: give each "
                "step its own name (e.g. f'charge-{i}' in a loop)"
            )
        self.names.add(name)
        return name

    def replayed(self, entry: Entry | None) -> tuple[bool, Any, int]:
        """(whether ``entry`` answers the step, its result, the attempts the step spent)."""
        if entry is None:
            return False, None, 0
        if entry.done:
            return True, entry.result, entry.attempts
        if entry.status == WorkflowEntryStatus.FAILED:
            if entry.seq + 1 < len(self.history):
                # The failure was caught and the workflow went on: it is raised again here.
                raise StepFailed(
                    entry.name,
                    entry.attempts,
                    entry.error_type or "",
                    entry.error or "",
                    exhausted=True,
                )
            return False, None, 0  # the failure the run resumes from (a redrive): run it again
        return False, None, entry.attempts  # waiting for its next attempt

    def checked_result(self, name: str, value: Any) -> str | None:
        try:
            text = result_text(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise WorkflowError(
                f"step {name!r} of {self.where()} returned a value JSON cannot hold "
                f"({type(value).__name__}: {exc}): return JSON (dicts, lists, str, numbers, "
                "bool, None)"
            ) from None
        if text is not None and len(text.encode()) > MAX_RESULT_BYTES:
            raise WorkflowError(
                f"step {name!r} of {self.where()} returned {len(text.encode()):,} bytes of "
                f"JSON, more than the {MAX_RESULT_BYTES:,} a step's result may be"
            )
        return text

    def failure(
        self,
        seq: int,
        name: str,
        policy: StepPolicy,
        attempt: int,
        exc: Exception,
        started: datetime,
    ) -> tuple[StepRecord, float | None]:
        """What a failed attempt leads to: the record, and the delay before the next attempt
        (None: the step failed for good)."""
        final = not policy.retry.retries(exc) or attempt >= policy.attempts
        record = StepRecord(
            seq,
            name,
            WorkflowEntryStatus.FAILED if final else WorkflowEntryStatus.RETRYING,
            attempt,
            started,
            error=error_text(exc),
            error_type=error_type(exc),
        )
        return record, None if final else policy.retry.delay(attempt, exc)

    def failed(self, record: StepRecord, policy: StepPolicy, exc: Exception) -> StepFailed:
        exhausted = record.attempts >= policy.attempts and policy.retry.retries(exc)
        failed = StepFailed(
            record.name,
            record.attempts,
            record.error_type or "",
            error_line(record.error or ""),
            exhausted=exhausted,
        )
        failed.__cause__ = exc
        return failed

    def extend_for(self, seconds: float) -> None:
        """Hold the lease over a wait of ``seconds`` inside the run."""
        self.job.extend_lease(min(seconds + self.lease, MAX_EXTENSION))


def _sleep_seconds(seconds: object) -> float:
    value = math.nan
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        try:
            value = float(seconds)
        except OverflowError:  # an int beyond any float
            value = math.inf
    if not 0 <= value <= MAX_SLEEP:
        raise WorkflowError(
            f"ctx.sleep takes seconds from 0 to {MAX_SLEEP:.0f} (ten years), got {seconds!r:.40}",
            field="seconds",
        )
    return value


def _wake_time(when: object) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise WorkflowError(
            f"ctx.sleep_until takes a timezone-aware datetime, got {when!r:.60}", field="when"
        )
    try:
        ahead = (when - datetime.now(UTC)).total_seconds()
    except OverflowError:
        ahead = math.inf
    if ahead > MAX_SLEEP:
        raise WorkflowError(
            f"ctx.sleep_until({when.isoformat()}) is more than ten years ahead", field="when"
        )
    return when


class WorkflowContext(WaitingMethods):
    """What a durable workflow's handler receives first (``@app.workflow``): its steps, sleeps
    and the transaction of a step's own writes.

    ``step(name, fn, *args, **kwargs)`` returns ``fn(*args, **kwargs)``'s result, recorded in
    PostgreSQL as JSON when it returns; when the job runs again (a retry, a lease expiry, a
    redrive), a recorded step returns its result without running. A step that raises is tried
    again by its policy (``pgjobs.step_policy``; by default 3 attempts with the workflow's
    backoff): a short wait in the run, a long one with the job back in the queue; one that fails
    for good raises ``pgjobs.StepFailed``. ``transaction()``, inside a step, is a connection in
    a transaction that commits with the step's record: the step's writes happen once.
    ``sleep(seconds)`` / ``sleep_until(when)`` give the worker slot back until then (the
    database's clock), spending no attempt. In an async workflow each of these is awaited.

    Example::

        @app.workflow(name="shop.checkout")
        def checkout(ctx: pgjobs.WorkflowContext, order_id: int) -> dict:
            charge = ctx.step("charge", charge_card, order_id)
            ctx.step("reserve", reserve_stock, order_id)
            ctx.sleep(3600)
            ctx.step("email", send_receipt, order_id)
            return {"charge": charge}
    """

    __slots__ = ("_async", "_run", "_store")
    _run: Run

    def __init__(self, run: Run, store: Store | AsyncStore) -> None:
        self._run = run
        self._store = store
        self._async = isinstance(store, AsyncStore)

    @property
    def job_id(self) -> int:
        """The id of the workflow's job."""
        return self._run.job.job.id

    @property
    def job(self) -> JobContext:
        """The running job (``pgjobs.current_job()``): its lease, progress, cancellation."""
        return self._run.job

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the step ``name`` and return its result, or its
        recorded result without running it (awaitable in an async workflow)."""
        run = self._run
        run.require_active("step")
        name = run.step_name(name)
        if not callable(fn):
            raise WorkflowError(f"step {name!r}: fn must be callable, got {fn!r:.60}")
        seq, entry = run.place(_STEP, name)
        if self._async:
            return self._step_async(seq, name, entry, fn, args, kwargs)
        return self._step_sync(seq, name, entry, fn, args, kwargs)

    def transaction(self) -> Any:
        """Inside a step: a connection in a transaction that commits with the step's record (or
        rolls back with its failure), so that the step's writes happen exactly once. The same
        connection for every call in one attempt. Awaitable in an async workflow."""
        run = self._run
        run.require_active("transaction")
        if run.step is None:
            raise WorkflowError(
                "ctx.transaction() works only inside a step's function: its writes commit "
                "with that step's record"
            )
        if self._async:
            return self._transaction_async()
        if run.conn is None:
            assert isinstance(self._store, Store)
            run.conn = self._store.transaction_connection()
            run.tx = run.conn.transaction()
            run.tx.__enter__()
        return run.conn

    def sleep(self, seconds: float) -> Any:
        """Suspend the workflow for ``seconds`` (0 to ten years) by the database's clock: the
        job waits in the queue without holding a slot or spending an attempt."""
        self._run.require_active("sleep")
        return self._sleep(_sleep_seconds(seconds), None)

    def sleep_until(self, when: datetime) -> Any:
        """Suspend the workflow until ``when`` (timezone-aware; a past time does not wait)."""
        self._run.require_active("sleep_until")
        return self._sleep(None, _wake_time(when))

    # The sync half.

    def _step_sync(
        self,
        seq: int,
        name: str,
        entry: Entry | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        run = self._run
        answered, result, spent = run.replayed(entry)
        if answered:
            return result
        store = self._store
        assert isinstance(store, Store)
        policy = policy_of(fn, run.defaults)
        started = datetime.now(UTC)
        attempt = spent
        while True:
            attempt += 1
            run.step = name
            try:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    raise WorkflowError(f"step {name!r} of a sync workflow returned an awaitable")
                text = run.checked_result(name, value)
                record = StepRecord(
                    seq,
                    name,
                    WorkflowEntryStatus.DONE,
                    attempt,
                    started,
                    result=text,
                    transactional=run.conn is not None,
                )
                if store.record_step(record, run.conn):
                    self._end_transaction(None)
                    return value
                self._end_transaction(WorkflowLeaseLost("lost"))
                return self._taken(seq, name)
            except (WorkflowError, WorkflowLeaseLost, StepFailed):
                self._end_transaction(WorkflowLeaseLost("aborted"))
                raise
            except Exception as exc:
                self._end_transaction(exc)
                record, delay = run.failure(seq, name, policy, attempt, exc, started)
                if delay is not None and delay <= IN_RUN_RETRY_WAIT:
                    run.extend_for(delay)
                    time.sleep(delay)
                    continue
                if not store.record_step(record, None):
                    return self._taken(seq, name)
                if delay is None:
                    raise run.failed(record, policy, exc) from exc
                raise WorkflowSuspended(delay) from None
            except BaseException as exc:
                self._end_transaction(exc)
                raise
            finally:
                run.step = None

    def _end_transaction(self, exc: BaseException | None) -> None:
        run = self._run
        conn, tx = run.conn, run.tx
        if conn is None:
            return
        run.conn = run.tx = None
        assert isinstance(self._store, Store)
        try:
            if exc is None:
                with db.translate_errors():
                    tx.__exit__(None, None, None)  # commits
            else:
                try:
                    with db.translate_errors():
                        tx.__exit__(type(exc), exc, None)  # rolls back
                except (DatabaseUnavailable, QueryFailed):
                    pass  # the connection is gone: nothing of the step committed
        finally:
            self._store.give_back(conn)

    def _taken(self, seq: int, name: str) -> Any:
        """The place was not recorded by this run: another run's record answers, or the lease is
        lost."""
        assert isinstance(self._store, Store)
        entry = self._store.entry(seq)
        return self._answer(seq, name, entry)

    def _answer(self, seq: int, name: str, entry: Entry | None) -> Any:
        if entry is None or not entry.done:
            raise WorkflowLeaseLost(
                f"{self._run.where()}: this run no longer holds the job's lease; it stops at "
                f"entry {seq} (the run that holds it goes on)"
            )
        if entry.kind != _STEP or entry.name != name:
            raise WorkflowDiverged(
                f"{self._run.where()} diverged at entry {seq}: another run recorded "
                f"{entry.kind} {entry.name!r} there, this one asks for step {name!r}"
            )
        return entry.result

    def _sleep(self, seconds: float | None, until: datetime | None) -> Any:
        run = self._run
        seq, entry = run.place(_SLEEP, _SLEEP)
        if self._async:
            return self._sleep_async(seq, entry, seconds, until)
        assert isinstance(self._store, Store)
        wake_in = entry.wake_in if entry is not None else None
        if entry is None:
            wake_in = self._store.record_sleep(seq, seconds, until)
            if wake_in is None:
                wake_in = self._slept(seq, self._store.entry(seq))
        self._wait(wake_in)
        return None

    def _slept(self, seq: int, entry: Entry | None) -> float | None:
        if entry is None:
            raise WorkflowLeaseLost(
                f"{self._run.where()}: this run no longer holds the job's lease; it stops at "
                f"entry {seq}"
            )
        if entry.kind != _SLEEP:
            raise WorkflowDiverged(
                f"{self._run.where()} diverged at entry {seq}: another run recorded "
                f"{entry.kind} {entry.name!r} there, this one asks for a sleep"
            )
        return entry.wake_in

    def _wait(self, wake_in: float | None) -> None:
        if wake_in is None or wake_in <= 0:
            return
        if wake_in <= IN_RUN_SLEEP:
            time.sleep(wake_in)
            return
        raise WorkflowSuspended(wake_in)

    # The async half.

    async def _step_async(
        self,
        seq: int,
        name: str,
        entry: Entry | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        run = self._run
        answered, result, spent = run.replayed(entry)
        if answered:
            return result
        store = self._store
        assert isinstance(store, AsyncStore)
        policy = policy_of(fn, run.defaults)
        started = datetime.now(UTC)
        attempt = spent
        while True:
            attempt += 1
            run.step = name
            try:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
                text = run.checked_result(name, value)
                record = StepRecord(
                    seq,
                    name,
                    WorkflowEntryStatus.DONE,
                    attempt,
                    started,
                    result=text,
                    transactional=run.conn is not None,
                )
                if await store.record_step(record, run.conn):
                    await self._end_transaction_async(None)
                    return value
                await self._end_transaction_async(WorkflowLeaseLost("lost"))
                return self._answer(seq, name, await store.entry(seq))
            except (WorkflowError, WorkflowLeaseLost, StepFailed):
                await self._end_transaction_async(WorkflowLeaseLost("aborted"))
                raise
            except Exception as exc:
                await self._end_transaction_async(exc)
                record, delay = run.failure(seq, name, policy, attempt, exc, started)
                if delay is not None and delay <= IN_RUN_RETRY_WAIT:
                    run.extend_for(delay)
                    await asyncio.sleep(delay)
                    continue
                if not await store.record_step(record, None):
                    return self._answer(seq, name, await store.entry(seq))
                if delay is None:
                    raise run.failed(record, policy, exc) from exc
                raise WorkflowSuspended(delay) from None
            except BaseException as exc:
                await self._end_transaction_async(exc)
                raise
            finally:
                run.step = None

    async def _transaction_async(self) -> psycopg.AsyncConnection[Any]:
        run = self._run
        if run.conn is None:
            assert isinstance(self._store, AsyncStore)
            conn = await self._store.transaction_connection()
            tx = conn.transaction()
            await tx.__aenter__()
            run.conn, run.tx = conn, tx
        conn_: psycopg.AsyncConnection[Any] = run.conn
        return conn_

    async def _end_transaction_async(self, exc: BaseException | None) -> None:
        run = self._run
        conn, tx = run.conn, run.tx
        if conn is None:
            return
        run.conn = run.tx = None
        assert isinstance(self._store, AsyncStore)
        try:
            if exc is None:
                with db.translate_errors():
                    await tx.__aexit__(None, None, None)
            else:
                try:
                    with db.translate_errors():
                        await tx.__aexit__(type(exc), exc, None)
                except (DatabaseUnavailable, QueryFailed):
                    pass
        finally:
            await self._store.give_back(conn)

    async def _sleep_async(
        self, seq: int, entry: Entry | None, seconds: float | None, until: datetime | None
    ) -> None:
        store = self._store
        assert isinstance(store, AsyncStore)
        wake_in = entry.wake_in if entry is not None else None
        if entry is None:
            wake_in = await store.record_sleep(seq, seconds, until)
            if wake_in is None:
                wake_in = self._slept(seq, await store.entry(seq))
        if wake_in is not None and 0 < wake_in <= IN_RUN_SLEEP:
            await asyncio.sleep(wake_in)
            return
        self._wait(wake_in)
