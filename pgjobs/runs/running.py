"""How a claimed job runs, in a worker's slots and in ``drain`` alike: ``Runs`` starts it (its
handler's arguments from its payload, upgraded to the task's version and checked; its
``current_job()``; its span; an async handler on the event loop, a sync one on a handler
thread), stops it at its task's timeout or at ``pgjobs cancel --force``, and hands how it ended
to the completer, which classifies it once. Whatever changes how a job starts changes it here,
for the worker and for the tests that drain an app at once."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from pgjobs.completer import Completer, Outcome
from pgjobs.context import HandlerExit, JobContext, call_async, call_sync
from pgjobs.errors import PgjobsError
from pgjobs.flow import Runner
from pgjobs.models import Job
from pgjobs.payloads import NEWER_VERSION_HOLD
from pgjobs.runs.start import handler
from pgjobs.runs.threads import HandlerThreads, Run
from pgjobs.tasks import Task, UpgradeFailed

#: Seconds an async handler cancelled at its timeout (or by `pgjobs cancel --force`) may take to
#: unwind (its ``finally`` blocks) before its slot is given back anyway.
STOP_GRACE = 5.0

#: Read once: a member looked up through its enum class costs ~100 ns per job.
_DELIVERED = Outcome.DELIVERED
_SUCCEEDED = Outcome.SUCCEEDED

#: The worker's logger: these are the worker's lines, wherever the job runs.
log = logging.getLogger("pgjobs.worker")


class Counts(Protocol):
    """What counts the runs' outcomes (a worker's metrics, with --http)."""

    def finished(self, job: Job, outcome: Outcome) -> None: ...

    def not_run(self, job: Job) -> None: ...


class Runs:
    """The jobs running on one event loop, in at most ``concurrency`` slots, each from its start
    to its outcome. Everything here runs on that loop, except a sync handler (on its thread).
    ``changed`` is set whenever a run left its slot or has something to send; ``metrics``
    counts the outcomes, ``results`` keeps what the handlers that succeeded returned (by job id).

    Whoever feeds the slots may override the hooks: ``_resume`` (a held attempt may start:
    here, in the slot just left, on the loop's next turn), ``_wake`` (a slot under a limit is
    free: claim soon; nothing here), ``_delivery`` (the coroutine that delivers an external
    task's job: a worker's). The hot path calls none of them.

    Example::

        runs = Runs(app.tasks, 1, completer, changed)
        runs.open(asyncio.get_running_loop())
        runs.start(job)  # its outcome lands in completer.outcomes, and changed is set
    """

    def __init__(
        self,
        tasks: Mapping[str, Task],
        concurrency: int,
        completer: Completer,
        changed: asyncio.Event,
        *,
        metrics: Counts | None = None,
        results: dict[int, Any] | None = None,
    ) -> None:
        self.tasks = tasks
        self.concurrency = concurrency
        self.completer = completer
        self.changed = changed
        #: Only with --http: the hot path tests `is not None` and counts nothing otherwise.
        self.metrics = metrics
        #: Only in drain: the handlers' results, kept for its report.
        self.results = results
        #: Where handlers read other jobs' results (``current_job().dependency_results()``,
        #: ``batch_results()``): the app's pools in a worker, the database in drain.
        self.reads: Runner | None = None
        #: Jobs that left their slots so far (the pace that bounds a worker's read-ahead).
        self.left = 0
        self._running: dict[int, tuple[JobContext, asyncio.Future[Any] | Run]] = {}
        # A newer attempt of a job whose earlier attempt still runs here (its handler outlived
        # its lease, the job was rescued and claimed again by this worker), by job id: it starts
        # when that run ends, never beside it.
        self._held: dict[int, Job] = {}
        # The timeout of each running job that has one (its task's), by job id.
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        # Sync handlers given up at their timeout whose threads may still run (Python cannot
        # stop a thread); the pool has room for as many as ``concurrency`` of them.
        self._strays: set[Run] = set()
        # Outcomes of sync handlers, appended by pool threads, collected on the loop.
        self._sync_outcomes: deque[tuple[Job, Task, Any, BaseException | None]] = deque()
        self._sync_wakeup_due = False
        self._threads: HandlerThreads | None = None
        # Jobs whose payload version was too new for this worker, logged once each.
        self._too_new: set[int] = set()
        self._loop: asyncio.AbstractEventLoop

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on ``loop``, with handler threads when some task has a sync handler."""
        self._loop = loop
        if any(not t.is_async and t.external is None for t in self.tasks.values()):
            # Twice the slots: a sync handler given up at its timeout keeps its thread until it
            # returns, and the jobs started in its slot meanwhile need threads of their own.
            self._threads = HandlerThreads(2 * self.concurrency, "pgjobs-handler")

    def close(self, *, wait: bool) -> None:
        """Let the handler threads end (``wait``: join them; see ``HandlerThreads.shutdown``)."""
        if self._threads is not None:
            self._threads.shutdown(wait=wait)

    @property
    def busy(self) -> int:
        """Jobs in a slot: running, or stopped and not given back yet."""
        return len(self._running)

    @property
    def held(self) -> int:
        """Attempts waiting for an earlier attempt of their job, still running here, to end."""
        return len(self._held)

    @property
    def timers(self) -> int:
        """Timeouts set for running jobs (their tasks'), not fired yet."""
        return len(self._deadlines)

    def running_jobs(self) -> list[Job]:
        """The jobs in a slot (running, or stopped and not given back yet), in start order."""
        return [context.job for context, _ in self._running.values()]

    # -- starting --------------------------------------------------------------------------------

    def start(self, job: Job) -> None:
        """Start ``job`` in a free slot (the caller made sure of one), or settle it at once when
        it cannot run: an unknown task, a payload that does not fit the handler or cannot be
        upgraded to the task's version (to dead_letter), a payload newer than the task (back to
        the queue, for newer code). A newer attempt of a job still running here waits for that
        run to end (``_hold``)."""
        if job.id in self._running:
            self._hold(job)
            return
        task = self.tasks.get(job.task)
        if task is None:
            self.completer.unknown_task(job)
            self._not_run(job)
            return
        payload = job.payload
        if (job.payload_version or 1) != task.version:
            upgraded = self._upgraded(job, task)
            if upgraded is None:
                self._not_run(job)
                return
            payload = upgraded
        problem = task.check_payload(payload)
        if problem is None and task.model is not None:
            payload, problem = task.arguments(payload)  # {parameter: the model's instance}
        if problem is not None:
            self.completer.invalid_payload(job, problem)
            self._not_run(job)
            return
        context = JobContext(job, self._request_extension, self._request_progress, self.reads)
        if task.external is not None:  # a delivery is no handler run: no span, no timeout
            self._launch(context, task, self._delivery(job))
            return
        fn = handler(task, job)
        if task.is_async:
            future = self._loop.create_task(call_async(context, fn, payload))
            self._running[job.id] = (context, future)
            future.add_done_callback(functools.partial(self._async_finished, job, task))
        else:
            assert self._threads is not None
            self._running[job.id] = (
                context,
                self._threads.submit(self._run_sync, context, task, fn, payload),
            )
        if task.timeout is not None:
            self._deadlines[job.id] = self._loop.call_later(
                task.timeout, self._timed_out, context, task
            )

    def _hold(self, job: Job) -> None:
        """``job`` is a newer attempt of a job whose earlier attempt still runs here: its
        handler outlived its lease (it did not extend it), and the job was rescued and claimed
        again by this worker. The new attempt waits for that run to end (``_free``); the old
        run's outcome is discarded then (its lease was lost), the new attempt's counts."""
        context = self._running[job.id][0]
        if job.id not in self._held:
            task = self.tasks.get(job.task)
            log.warning(
                "job %d (%s): its handler outlived its lease (%.0fs) on attempt %d and still "
                "runs here; attempt %d waits for it to end. Extend the lease from the handler "
                "(current_job().extend_lease) or declare a longer lease: meanwhile the job's "
                "run no longer counts under its limits",
                job.id,
                job.task,
                task.lease if task is not None else 0.0,
                context.job.attempts,
                job.attempts,
            )
        self._held[job.id] = job  # the latest attempt: an older one held here lost its lease

    def _free(self, job_id: int) -> None:
        """``job_id``'s run left its slot: an attempt of it held meanwhile may start."""
        held = self._held.pop(job_id, None)
        if held is not None:
            self._resume(held)

    def _upgraded(self, job: Job, task: Task) -> dict[str, Any] | None:
        """``job``'s payload upgraded to ``task``'s version, or None when it cannot run here:
        a payload newer than this worker's task goes back to the queue (attempt refunded), held
        back ``NEWER_VERSION_HOLD`` seconds so that this worker does not claim it again at once
        while an up-to-date one may; one that cannot be upgraded goes to dead_letter."""
        version = job.payload_version or 1
        if version > task.version:
            self.completer.outcomes.release(
                job, refund=True, hold=NEWER_VERSION_HOLD, for_others=True
            )
            if job.id not in self._too_new:
                if len(self._too_new) >= 10_000:  # a memory of log lines, not of jobs
                    self._too_new.clear()
                self._too_new.add(job.id)
                log.warning(
                    "job %d (%s): its payload is version %d and this worker's task knows "
                    "versions up to %d; released for another worker (deploy the newer code), "
                    "held back %.0fs",
                    job.id,
                    job.task,
                    version,
                    task.version,
                    NEWER_VERSION_HOLD,
                )
            return None
        try:
            return task.upgrade(job.payload, version)
        except UpgradeFailed as exc:
            self.completer.finished(job, task, None, exc)
        except ValueError as exc:  # no upgrade from that version is declared any more
            self.completer.invalid_payload(job, str(exc))
        return None

    def _launch(self, context: JobContext, task: Task, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` (a delivery) in a slot, on this loop."""
        future = self._loop.create_task(coroutine)
        self._running[context.job.id] = (context, future)
        future.add_done_callback(functools.partial(self._async_finished, context.job, task))

    # -- ending ----------------------------------------------------------------------------------

    def _async_finished(self, job: Job, task: Task, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self._finished(job, task, None, None, cancelled=True)
        else:
            exc = future.exception()
            if isinstance(exc, HandlerExit):
                exc = exc.original
            self._finished(job, task, None if exc else future.result(), exc)

    def _run_sync(
        self, context: JobContext, task: Task, fn: Callable[..., Any], arguments: dict[str, Any]
    ) -> None:
        """In a pool thread: run a sync handler (``fn``: the task's, traced or not) with
        ``arguments``, then hand its outcome to the loop. Outcomes are collected in batches:
        one wake-up of the loop for however many handlers finished meanwhile, rather than one
        per job."""
        outcome: tuple[Job, Task, Any, BaseException | None]
        try:
            outcome = (context.job, task, call_sync(context, fn, arguments), None)
        except BaseException as exc:  # whatever the handler raised is its job's outcome
            outcome = (context.job, task, None, exc)
        # Append before looking at the flag, which the loop clears before it collects: every
        # outcome is either collected by a wake-up already due or schedules one.
        self._sync_outcomes.append(outcome)
        if not self._sync_wakeup_due:
            self._sync_wakeup_due = True
            self._loop.call_soon_threadsafe(self._collect_sync_outcomes)

    def _collect_sync_outcomes(self) -> None:
        self._sync_wakeup_due = False
        while self._sync_outcomes:
            self._finished(*self._sync_outcomes.popleft())

    def _finished(
        self,
        job: Job,
        task: Task,
        result: Any,
        exc: BaseException | None,
        *,
        cancelled: bool = False,
    ) -> None:
        entry = self._running.get(job.id)
        if entry is None or entry[0].job is not job:
            return  # already given back (shutdown, or a stopped run that ended late)
        del self._running[job.id]
        if self._held:
            self._free(job.id)
        self.left += 1
        self.changed.set()
        if task.limited or self.completer.limited:
            # Its slot under a limit is free again: claim with the trip that settles it,
            # rather than at the next poll (the claim itself tells whether the limit allows).
            self._wake()
            if task.limited:
                self.completer.limits_due()
        deadline = self._deadlines.pop(job.id, None)
        if deadline is not None:
            deadline.cancel()
        if entry[0].stopped is not None:
            # Stopped at its timeout (the failure is recorded already) or force-cancelled (the
            # cancel archived the job): whatever the handler did after that does not count.
            log.debug("job %d: stopped (%s); its handler ended", job.id, entry[0].stopped)
            if entry[0].stopped == "cancel" and job.group_key is not None:
                # The cancel kept the job's place in its group while the handler ran: free it.
                self.completer.end_hold(entry[0])
                self._wake()
            return
        if entry[0].progress_pending:  # the last progress goes with the outcome
            self.completer.progress(entry[0])
        if cancelled:
            outcome = self.completer.cancelled(job)
        elif exc is None and task.external is not None:
            # The downstream took the job: it stays running under its lease, which the
            # downstream's report (or the lease's expiry) ends. Nothing to settle here.
            log.debug("job %d (%s): delivered on attempt %d", job.id, job.task, job.attempts)
            outcome = _DELIVERED
        else:
            try:
                outcome = self.completer.finished(job, task, result, exc)
            except BaseException as problem:  # the outcome of one job never stops the others
                log.exception("job %d: its outcome could not be recorded", job.id)
                outcome = self.completer.finished(job, task, None, problem)
        if self.metrics is not None:
            self.metrics.finished(job, outcome)
        if self.results is not None and outcome is _SUCCEEDED:
            self.results[job.id] = result

    # -- what a running handler asks for ---------------------------------------------------------

    def _request_extension(self, context: JobContext, seconds: float) -> None:
        """Called from any thread: extend ``context``'s lease on the next trip."""
        self._loop.call_soon_threadsafe(self._queue_extension, context, seconds)

    def _queue_extension(self, context: JobContext, seconds: float) -> None:
        if context.job.id in self._running and not context.cancelled:
            self.completer.extend(context, seconds)
            self.changed.set()

    def _request_progress(self, context: JobContext, delay: float) -> None:
        """Called from any thread: write ``context``'s progress in ``delay`` seconds."""
        self._loop.call_soon_threadsafe(self._loop.call_later, delay, self._queue_progress, context)

    def _queue_progress(self, context: JobContext) -> None:
        entry = self._running.get(context.job.id)
        if entry is not None and entry[0] is context and context.stopped is None:
            self.completer.progress(context)
            self.changed.set()

    # -- stopping: deadlines, cancels, shutdown --------------------------------------------------

    def _timed_out(self, context: JobContext, task: Task) -> None:
        """``context``'s run reached its task's timeout: the attempt fails now (retried or sent
        to dead_letter with reason timeout) and the handler is stopped: an async one cancelled
        (its slot given back once it ends, or ``STOP_GRACE`` seconds later), a sync one told
        through ``context.cancelled`` and its thread abandoned (its slot given back now)."""
        job = context.job
        self._deadlines.pop(job.id, None)
        entry = self._running.get(job.id)
        if entry is None or entry[0] is not context:
            return
        context.cancelled = True
        if context.stopped is None:  # a force-cancelled job's record is the cancel's
            context.stopped = "timeout"
            if context.progress_pending:  # the last progress goes with the outcome
                self.completer.progress(context)
            assert task.timeout is not None
            outcome = self.completer.timed_out(job, task, task.timeout)
            if self.metrics is not None:
                self.metrics.finished(job, outcome)
            self.changed.set()
        self._stop_run(context, entry[1])

    def _stop_run(self, context: JobContext, future: asyncio.Future[Any] | Run) -> None:
        """Stop a run whose outcome is decided: cancel an async handler and give its slot back
        once it ended (or after ``STOP_GRACE``); give a sync handler's slot back at once."""
        if isinstance(future, asyncio.Future):
            if not future.done():
                future.cancel()
                self._loop.call_later(STOP_GRACE, self._give_back, context)
        else:
            self._give_back(context)

    def _give_back(self, context: JobContext) -> None:
        """Free the slot of a stopped run that has not ended: its handler runs on, unheeded."""
        job = context.job
        entry = self._running.get(job.id)
        if entry is None or entry[0] is not context:
            return  # it ended meanwhile
        del self._running[job.id]
        self._free(job.id)
        deadline = self._deadlines.pop(job.id, None)
        if deadline is not None:
            deadline.cancel()
        self.changed.set()
        future = entry[1]
        if isinstance(future, asyncio.Future):
            log.warning(
                "job %d (%s): its async handler did not end within %.0fs of being cancelled "
                "(it catches CancelledError?); its slot is given back, the handler left running",
                job.id,
                job.task,
                STOP_GRACE,
            )
            return
        if not future.done():
            self._strays.add(future)
        strays = self.stray_threads()
        if strays >= self.concurrency:
            log.warning(
                "%d sync handler(s) stopped at their timeout still hold their threads (Python "
                "cannot stop a thread; a handler should return once current_job().cancelled "
                "is True): once %d do, new sync jobs wait for a thread",
                strays,
                self.concurrency,
            )

    def stray_threads(self) -> int:
        """Threads of sync handlers given up at their timeout that still run."""
        self._strays = {future for future in self._strays if not future.done()}
        return len(self._strays)

    def cancel(self, job_id: int, attempt: int) -> None:
        """Attempt ``attempt`` of job ``job_id`` was cancelled with ``pgjobs cancel --force``
        (the cancel archived it): stop its handler if it runs here. An async handler is
        cancelled; a sync one is told through ``current_job().cancelled`` and keeps its slot
        until it returns or its timeout passes."""
        entry = self._running.get(job_id)
        if entry is None or entry[0].job.attempts != attempt or entry[0].stopped is not None:
            return
        context, future = entry
        context.stopped = "cancel"
        context.cancelled = True
        self.completer.forget(context.job)
        if self.metrics is not None:
            self.metrics.finished(context.job, Outcome.RELEASED)
        is_async = isinstance(future, asyncio.Future)
        log.info(
            "job %d (%s): cancelled (by pgjobs cancel --force) on attempt %d; %s",
            job_id,
            context.job.task,
            attempt,
            "its handler is cancelled"
            if is_async
            else "its sync handler is told through current_job().cancelled",
        )
        if is_async:
            self._stop_run(context, future)

    def abandon(self) -> int:
        """Grace period over: give the running jobs back now (their attempt stays used) rather
        than leave them to their leases; at-most-once jobs go to dead_letter, never to run
        again. Returns how many were given back; the next trip settles them."""
        for deadline in self._deadlines.values():
            deadline.cancel()
        self._deadlines.clear()
        for context, future in list(self._running.values()):
            if context.stopped is not None:  # its outcome is decided already
                future.cancel()
                continue
            task = self.tasks.get(context.job.task)
            at_most_once = task is not None and task.at_most_once
            outcome = self.completer.interrupted(context.job, at_most_once=at_most_once)
            if self.metrics is not None:
                self.metrics.finished(context.job, outcome)
            future.cancel()
        abandoned = len(self._running)
        self._running.clear()
        return abandoned

    def _not_run(self, job: Job) -> None:
        if self.metrics is not None:
            self.metrics.not_run(job)
        self.changed.set()

    # -- the hooks -------------------------------------------------------------------------------

    def _resume(self, job: Job) -> None:
        """``job``, an attempt held while an earlier one ran here, may start now: in the slot
        that run left, once the loop is done with its end."""
        self._loop.call_soon(self.start, job)

    def _wake(self) -> None:
        """A slot under a limit, or a job's place in its group, is free again: claim soon."""

    def _delivery(self, job: Job) -> Coroutine[Any, Any, Any]:
        """The delivery of an external task's job to its downstream: a worker's. Elsewhere the
        attempt fails, saying that a worker delivers it."""
        return _fail(
            PgjobsError(f"external task {job.task!r}: a worker (pgjobs work) delivers its jobs")
        )


async def _fail(exc: BaseException) -> Any:
    raise exc
