"""A worker's slots: the jobs claimed ahead that wait for one, in claim order, started as slots
free up (each run as ``pgjobs.runs.Runs`` runs it, as drain does), a cancel of one not started
yet, the jobs claimed ahead given back at shutdown, and what the worker wakes for when a run
ends."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from pgjobs.completer import Completer
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
        super().__init__(tasks, concurrency, completer, changed, metrics=metrics)
        self.pacer = pacer
        self.deliveries = deliveries
        # Jobs claimed and not started yet (claimed ahead of free slots), in claim order.
        self._waiting: deque[Job] = deque()

    @property
    def in_hand(self) -> int:
        """Jobs in a slot or claimed ahead, waiting for one (or for their earlier run here)."""
        return len(self._running) + len(self._waiting) + len(self._held)

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
        waiting, concurrency = self._waiting, self.concurrency
        while waiting and len(self._running) < concurrency:
            self.start(waiting.popleft())

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

    # -- the hooks of Runs ----------------------------------------------------------------------

    def _resume(self, job: Job) -> None:
        """A held attempt starts next, ahead of the jobs claimed after it."""
        self._waiting.appendleft(job)

    def _wake(self) -> None:
        self.pacer.woken = True

    def _delivery(self, job: Job) -> Coroutine[Any, Any, Any]:
        return delivery_of(self.deliveries, job)
