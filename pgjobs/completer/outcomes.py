"""How an attempt ended (``Outcome``, decided once by the ``Completer`` and read by whoever
counts or logs it) and the buffer of outcomes waiting for the worker's next round trip
(``Outcomes``, filling a ``SettleParams``)."""

from __future__ import annotations

import enum
from typing import Protocol

from pgjobs.completer.params import SettleParams
from pgjobs.models import DeadReason


class Outcome(enum.StrEnum):
    """How one attempt of a job ended, as the worker's metrics count it (the values are the
    ``outcome`` label of ``pgjobs_worker_jobs_finished_total``).

    Example: ``completer.finished(job, task, None, ValueError("x")) is Outcome.RETRIED``
    """

    #: The handler returned: the job is archived (succeeded).
    SUCCEEDED = "succeeded"
    #: The attempt failed (an error or its timeout) with attempts left: back to the queue after
    #: the task's backoff.
    RETRIED = "retried"
    #: Sent to dead_letter: a non-retryable error, the last attempt failed or timed out, an
    #: unknown task, a payload that does not fit, an at-most-once job interrupted.
    DEAD = "dead"
    #: Given back to the queue unfinished (cancelled, or the worker shut down while it ran).
    RELEASED = "released"
    #: The handler snoozed it (``pgjobs.Snooze``): back to the queue for later, its attempt
    #: refunded.
    SNOOZED = "snoozed"
    #: An external task's job handed to its downstream: it stays running under its lease until
    #: the downstream reports (decided by the worker's delivery, not by the completer).
    DELIVERED = "delivered"


#: dead_letter's error_type for an attempt stopped at its task's timeout (no exception was raised
#: by the handler: the worker stopped it).
TIMEOUT_ERROR_TYPE = "pgjobs.timeout"


def timeout_error(timeout: float) -> str:
    """last_error of an attempt stopped at its task's ``timeout`` (seconds)."""
    return f"timeout: the handler ran longer than its {timeout:g}s timeout"


class Attempt(Protocol):
    """What an outcome settles: one attempt of one job (a claimed ``Job`` is one)."""

    @property
    def id(self) -> int: ...

    @property
    def attempts(self) -> int: ...


class Outcomes:
    """Outcomes waiting to be sent: a ``SettleParams`` being filled."""

    __slots__ = ("_batch", "_drained_not_due", "_not_due", "owner")

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._batch = SettleParams(owner)
        # The ids of jobs given back for another worker: their hold is no time for this one to
        # claim again (it would take them back before the others could); those of the last
        # drained batch, in case it comes back (``restore``).
        self._not_due: set[int] = set()
        self._drained_not_due: set[int] = set()

    def __len__(self) -> int:
        return len(self._batch)

    def succeed(self, job: Attempt, result: str | None) -> None:
        batch = self._batch
        batch.ok_ids.append(job.id)
        batch.ok_attempts.append(job.attempts)
        batch.ok_results.append(result)

    def retry(self, job: Attempt, delay: float, error: str) -> None:
        """Reschedule ``job`` ``delay`` seconds from now, recording ``error``."""
        batch = self._batch
        batch.retry_ids.append(job.id)
        batch.retry_attempts.append(job.attempts)
        batch.retry_delays.append(delay)
        batch.retry_errors.append(error)

    def bury(
        self,
        job: Attempt,
        reason: DeadReason,
        error: str,
        error_type: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """Move ``job`` to dead_letter for ``reason``."""
        batch = self._batch
        batch.dead_ids.append(job.id)
        batch.dead_attempts.append(job.attempts)
        batch.dead_reasons.append(reason)
        batch.dead_types.append(error_type)
        batch.dead_errors.append(error)
        batch.dead_tracebacks.append(traceback)

    def release(
        self,
        job: Attempt,
        *,
        refund: bool,
        hold: float = 0.0,
        snooze: bool = False,
        for_others: bool = False,
    ) -> None:
        """Give ``job`` back to the queue; ``refund`` when it never started running, or its
        handler snoozed it (``snooze``: counted). With ``hold`` (seconds) > 0 no worker claims
        it again before then. ``for_others``: this worker cannot run it (a payload newer than
        its code), so the hold does not wake it (``due_in``)."""
        batch = self._batch
        if for_others:
            self._not_due.add(job.id)
        batch.release_ids.append(job.id)
        batch.release_attempts.append(job.attempts)
        batch.release_refunds.append(refund)
        batch.release_holds.append(hold)
        batch.release_snoozes.append(snooze)

    def due_in(self) -> float | None:
        """Seconds after the next settle until the first job it puts back for later (a retry,
        a release held back such as a snooze) falls due; None when it puts back none so."""
        batch = self._batch
        holds = (
            hold
            for job_id, hold in zip(batch.release_ids, batch.release_holds, strict=True)
            if hold > 0 and job_id not in self._not_due
        )
        waits = [*batch.retry_delays, *holds]
        return min(waits) if waits else None

    def drain(self) -> SettleParams:
        """Everything buffered, as the settle statement's parameters; empties the buffer."""
        batch, self._batch = self._batch, SettleParams(self.owner)
        self._drained_not_due, self._not_due = self._not_due, set()
        return batch

    def restore(self, batch: SettleParams) -> None:
        """Put a drained ``batch`` back in front of newer outcomes (its flush failed)."""
        self._not_due |= self._drained_not_due
        batch.extend(self._batch)
        self._batch = batch
