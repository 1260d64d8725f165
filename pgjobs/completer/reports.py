"""Outcomes that external workers report for their jobs (``pgjobs.admin.report_outcome``):
validated, then classified as a worker classifies a handler's."""

from __future__ import annotations

from typing import Any, NamedTuple

from pgjobs.completer.outcomes import Outcomes
from pgjobs.completer.params import SettleParams
from pgjobs.errors import ConfigurationError, NotExternal
from pgjobs.models import DeadReason
from pgjobs.retry import RetryPolicy
from pgjobs.text import error_line, result_json

#: What an external worker may report for an attempt (``report_outcome``).
REPORTED_STATUSES = ("succeeded", "failed")


class ReportedOutcome(NamedTuple):
    """An outcome an external worker reported for one attempt of a job (see
    ``pgjobs.admin.report_outcome``), validated."""

    attempt: int
    succeeded: bool
    retryable: bool
    error: str
    result: str | None

    @classmethod
    def of(
        cls, attempt: object, status: object, retryable: object, error: object, result: Any
    ) -> ReportedOutcome:
        """Validate a report; a bad value raises ``ConfigurationError`` naming its field."""
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ConfigurationError(
                f"attempt must be a whole number >= 1, got {attempt!r}", field="attempt"
            )
        if status not in REPORTED_STATUSES:
            raise ConfigurationError(
                f"status must be one of {', '.join(REPORTED_STATUSES)}, got {status!r}",
                field="status",
            )
        if not isinstance(retryable, bool):
            raise ConfigurationError(
                f"retryable must be true or false, got {retryable!r}", field="retryable"
            )
        if error is not None and not isinstance(error, str):
            raise ConfigurationError(
                f"error must be text, got {type(error).__name__}", field="error"
            )
        text = error_line(error or "") or "failed (no error message reported)"
        succeeded = status == "succeeded"
        return cls(attempt, succeeded, retryable, text, result_json(result) if succeeded else None)

    def settle(
        self, owner: str, job_id: int, max_attempts: int, retry: RetryPolicy
    ) -> SettleParams:
        """The outcome as ``JOB_SETTLE_MANY``'s parameters, classified as a worker classifies a
        handler's: success archives; a retryable failure before the last attempt is retried
        after ``retry``'s backoff; any other failure goes to dead_letter."""
        outcomes = Outcomes(owner)
        attempt = _ReportedAttempt(job_id, self.attempt)
        if self.succeeded:
            outcomes.succeed(attempt, self.result)
        elif self.retryable and self.attempt < max_attempts:
            outcomes.retry(attempt, retry.delay(self.attempt), self.error)
        else:
            reason = DeadReason.EXHAUSTED if self.retryable else DeadReason.NON_RETRYABLE
            outcomes.bury(attempt, reason, self.error)
        return outcomes.drain()


def check_delivered(
    job_id: int, task: str, attempts: int, external_attempt: int | None, external: bool | None
) -> None:
    """Refuse (``NotExternal``) a report for a running job whose current attempt ``attempts``
    is not the one a worker claimed to deliver to an external task's downstream
    (``external_attempt``, recorded by the claim), or whose task the reporting app declares as
    a Python one (``external`` False; None when the app does not know the task). The database's
    record holds whatever app serves the report: a job a Python handler runs is never settled
    from outside, even by a server that registers no task."""
    if external is False:
        raise NotExternal(
            f"job {job_id}'s task {task!r} is not an external task in this app: only a worker "
            "settles its jobs, an outcome cannot be reported for them"
        )
    if external_attempt != attempts:
        raise NotExternal(
            f"job {job_id} ({task}) runs attempt {attempts} in a worker, not delivered to an "
            "external task's downstream: only a delivered attempt may be reported"
        )


class _ReportedAttempt(NamedTuple):
    id: int
    attempts: int
