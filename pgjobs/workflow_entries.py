"""The entries of a durable workflow's history (``pgjobs_workflow_history``): what each records
(its kind), where it stands (its status), and one entry as `pgjobs job show` reads it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class WorkflowEntryKind(enum.StrEnum):
    """What one entry of a durable workflow's history records (``pgjobs_workflow_history.kind``)."""

    #: ``ctx.step(name, fn)``: its result, or its error.
    STEP = "step"
    #: ``ctx.sleep`` / ``ctx.sleep_until``: when it wakes.
    SLEEP = "sleep"
    #: ``ctx.wait_for(name)``: the event's payload once taken, or its timeout; while it waits,
    #: its deadline.
    EVENT = "event"
    #: ``ctx.map`` / ``ctx.run``: the batch of child jobs and their ids; done once all ended.
    CHILDREN = "children"


class WorkflowEntryStatus(enum.StrEnum):
    """Where one entry of a workflow's history stands (``pgjobs_workflow_history.status``)."""

    #: Recorded for good: a step's result, a sleep's wake time. Never run again.
    DONE = "done"
    #: A step that failed for good (its attempts spent, or an error it does not retry).
    FAILED = "failed"
    #: A step that failed with attempts left, waiting for its next attempt.
    RETRYING = "retrying"
    #: A wait for an event or for children that has not ended: the job is suspended.
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class WorkflowEntry:
    """One entry of a durable workflow's history, as `pgjobs job show` shows it: a step (its
    status, attempts, result or error, how long it took from its first attempt's start to its
    record) or a sleep (when it wakes)."""

    seq: int
    kind: WorkflowEntryKind
    name: str
    status: WorkflowEntryStatus
    attempts: int
    result: Any
    error: str | None
    error_type: str | None
    transactional: bool
    started_at: datetime | None
    recorded_at: datetime
    wake_at: datetime | None

    @property
    def seconds(self) -> float | None:
        """A step's duration, from its first attempt's start to its record."""
        if self.kind is not WorkflowEntryKind.STEP or self.started_at is None:
            return None
        return max(0.0, (self.recorded_at - self.started_at).total_seconds())
