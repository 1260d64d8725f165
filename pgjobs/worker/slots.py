"""A worker's slots: the jobs claimed ahead that wait for one, in claim order, started as slots
free up (each run as ``pgjobs.runs.Runs`` runs it, as drain does), a newer attempt of a job held
until its earlier run here ends, the jobs claimed ahead given back at shutdown, and what the
worker counts and wakes for when a run ends."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from pgjobs.completer import Completer, Outcome
from pgjobs.models import Job
from pgjobs.runs import Runs
from pgjobs.tasks import Task
from pgjobs.worker.external import Delivery, delivery_of
from pgjobs.worker.metrics import WorkerMetrics
from pgjobs.worker.pacing import ClaimPacer

log = logging.getLogger("pgjobs.worker")


class Slots(Runs):
    """The ``concurrency`` slots of one worker, and the jobs claimed ahead that wait for one.
    Everything here runs on the worker's event loop, except a sync handler (on its thread).

    Example::

        slots.add(claimed.jobs)  # they wait, in claim order
        slots.fill()  # and start while slots are free
    """

    def __init__(
        self,
        tasks: Mapping[str, Task],
        concurrency: int,
        completer: Completer,
        pacer: ClaimPacer,
        deliveries: Mapping[str, Delivery],
        metrics: WorkerMetrics | None,
        changed: asyncio.Event,
    ) -> None:
        super().__init__(tasks, concurrency, completer, changed)
        self.pacer = pacer
        self.deliveries = deliveries
        #: Only with --http: the hot path tests `is not None` and counts nothing otherwise.
        self.metrics = metrics
        # Jobs claimed and not started yet (claimed ahead of free slots), in claim order.
        self._waiting: deque[Job] = deque()
        # A newer attempt of a job whose earlier attempt still runs here (its handler outlived
        # its lease, the job was rescued and claimed again by this worker), by job id: it starts
        # when that run ends, never beside it.
        self._held: dict[int, Job] = {}

    @property
    def in_hand(self) -> int:
        """Jobs in a slot or claimed ahead, waiting for one (or for their earlier run here)."""
        return len(self._running) + len(self._waiting) + len(self._held)

    @property
    def held(self) -> int:
        """Attempts waiting for an earlier attempt of their job, still running here, to end."""
        return len(self._held)

    @property
    def fed(self) -> bool:
        """Jobs claimed ahead wait for a slot."""
        return bool(self._waiting)

    def waiting_jobs(self) -> list[Job]:
        """The jobs claimed ahead that wait for a slot, in claim order."""
        return list(self._waiting)

    def add(self, jobs: Iterable[Job]) -> None:
        """Jobs just claimed join those waiting for a slot (``fill`` starts them)."""
        self._waiting.extend(jobs)

    def fill(self) -> None:
        """Start jobs claimed ahead while slots are free (a job that cannot run here, an
        unknown task or a payload that does not fit, leaves its slot free for the next)."""
        waiting, running, concurrency = self._waiting, self._running, self.concurrency
        while waiting and len(running) < concurrency:
            job = waiting.popleft()
            if job.id in running:
                self._hold(job)
            else:
                self.start(job)

    def _hold(self, job: Job) -> None:
        """``job`` is a newer attempt of a job whose earlier attempt still runs here: its
        handler outlived its lease (it did not extend it), and the job was rescued and claimed
        again by this worker. The new attempt waits for that run to end (``_vacated``); the old
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

    def cancel(self, job_id: int, attempt: int) -> None:
        """Attempt ``attempt`` of job ``job_id`` was cancelled with ``pgjobs cancel --force``
        (the cancel archived it): stop its handler if it runs here (``Runs.cancel``), drop it
        if it waits here."""
        held = self._held.get(job_id)
        if job_id not in self._running or (held is not None and held.attempts == attempt):
            self._cancel_waiting(job_id, attempt)
        else:
            super().cancel(job_id, attempt)

    def _cancel_waiting(self, job_id: int, attempt: int) -> None:
        """A job claimed ahead (not started) was cancelled: it never starts here."""
        held = self._held.get(job_id)
        if held is not None and held.attempts == attempt:
            self._waiting.append(self._held.pop(job_id))  # dropped from there, below
        for job in self._waiting:
            if job.id == job_id and job.attempts == attempt:
                self._waiting.remove(job)
                self.completer.forget(job)
                if self.metrics is not None:
                    self.metrics.not_run(job)
                log.info(
                    "job %d (%s): cancelled (by pgjobs cancel --force) before it started",
                    job_id,
                    job.task,
                )
                return

    def give_back_waiting(self) -> None:
        """Stopping: the jobs claimed ahead go back to the queue, their attempt refunded (they
        never started)."""
        if self._held:  # never started either: their earlier runs end here meanwhile
            self._waiting.extend(self._held.values())
            self._held.clear()
        if not self._waiting:
            return
        for job in self._waiting:
            self.completer.outcomes.release(job, refund=True)
            if self.metrics is not None:
                self.metrics.not_run(job)
        log.info("gave back %d job(s) claimed ahead, not started", len(self._waiting))
        self._waiting.clear()

    # -- what a run's end means for the worker (the hooks of Runs) -------------------------------

    def _vacated(self, job_id: int) -> None:
        """``job_id``'s run left its slot: an attempt of it held meanwhile starts next."""
        if self._held:
            held = self._held.pop(job_id, None)
            if held is not None:
                self._waiting.appendleft(held)

    def _decided(self, job: Job, outcome: Outcome, result: Any) -> None:
        if self.metrics is not None:
            self.metrics.finished(job, outcome)

    def _not_run(self, job: Job) -> None:
        if self.metrics is not None:
            self.metrics.not_run(job)
        self.changed.set()

    def _wake(self) -> None:
        self.pacer.woken = True

    def _delivery(self, job: Job) -> Coroutine[Any, Any, Any]:
        return delivery_of(self.deliveries, job)
