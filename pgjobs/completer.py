"""Buffers job outcomes and turns them into the parameters of one batched, fenced move.

The worker records each finished job here; every trip to the database drains the buffer into
``queries.JOB_SETTLE_MANY``, so one statement archives, retries, dead-letters and releases a whole
batch. Each entry carries the attempt it settles: with the lease owner, that is the fence that
keeps a stale worker from touching a job that was re-claimed elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pgjobs.models import Job


def result_json(value: Any) -> str | None:
    """A handler's return value as JSON text (non-JSON values as their ``str``), or None."""
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(str(value))
    # jsonb refuses the NUL character; store U+FFFD in its place.
    return text.replace("\\u0000", "\\ufffd") if "\\u0000" in text else text


@dataclass(slots=True)
class Outcomes:
    """Outcomes waiting to be flushed, as parallel lists ready to bind."""

    owner: str
    ok_ids: list[int] = field(default_factory=list)
    ok_attempts: list[int] = field(default_factory=list)
    ok_results: list[str | None] = field(default_factory=list)
    retry_ids: list[int] = field(default_factory=list)
    retry_attempts: list[int] = field(default_factory=list)
    retry_delays: list[float] = field(default_factory=list)
    retry_errors: list[str] = field(default_factory=list)
    dead_ids: list[int] = field(default_factory=list)
    dead_attempts: list[int] = field(default_factory=list)
    dead_reasons: list[str] = field(default_factory=list)
    dead_types: list[str | None] = field(default_factory=list)
    dead_errors: list[str] = field(default_factory=list)
    dead_tracebacks: list[str | None] = field(default_factory=list)
    release_ids: list[int] = field(default_factory=list)
    release_attempts: list[int] = field(default_factory=list)
    release_refunds: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ok_ids) + len(self.retry_ids) + len(self.dead_ids) + len(self.release_ids)

    def succeed(self, job: Job, result: str | None) -> None:
        self.ok_ids.append(job.id)
        self.ok_attempts.append(job.attempts)
        self.ok_results.append(result)

    def retry(self, job: Job, delay: float, error: str) -> None:
        """Reschedule ``job`` ``delay`` seconds from now, recording ``error``."""
        self.retry_ids.append(job.id)
        self.retry_attempts.append(job.attempts)
        self.retry_delays.append(delay)
        self.retry_errors.append(error)

    def bury(
        self,
        job: Job,
        reason: str,
        error: str,
        error_type: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """Move ``job`` to dead_letter; ``reason`` is one of ``schema.DEAD_REASONS``."""
        self.dead_ids.append(job.id)
        self.dead_attempts.append(job.attempts)
        self.dead_reasons.append(reason)
        self.dead_types.append(error_type)
        self.dead_errors.append(error)
        self.dead_tracebacks.append(traceback)

    def release(self, job: Job, *, refund: bool) -> None:
        """Give ``job`` back to the queue now; ``refund`` when it never started running."""
        self.release_ids.append(job.id)
        self.release_attempts.append(job.attempts)
        self.release_refunds.append(refund)

    def drain(self) -> tuple[dict[str, Any], list[int]]:
        """The bind parameters of ``JOB_SETTLE_MANY`` and the ids they settle; empties the buffer."""
        params: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            params[name] = value
            if isinstance(value, list):
                setattr(self, name, [])
        settled = (
            params["ok_ids"] + params["retry_ids"] + params["dead_ids"] + params["release_ids"]
        )
        return params, settled

    def restore(self, params: dict[str, Any]) -> None:
        """Put drained parameters back in front of newer outcomes (the flush failed)."""
        for name, value in params.items():
            if isinstance(value, list):
                setattr(self, name, value + getattr(self, name))
