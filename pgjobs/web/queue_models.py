"""The request and response models of the queue and schedule routes (``routes_queues``,
``routes_schedules``): a queue and its settings as `pgjobs queue list --json` prints it, a
schedule as `pgjobs schedule --json` does, with an example of each in the OpenAPI document.
``tests/web/test_models.py`` holds them to the fields of ``pgjobs.models``' rows."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pgjobs.models import QueueState, ScheduleInfo
from pgjobs.rates import rate_text
from pgjobs.web.models import JobSummary, Text, Whole


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": list(examples)})


# -- requests -------------------------------------------------------------------------------------


class PauseRequest(BaseModel):
    """Why the queue or schedule is paused (shown by `pgjobs queue list`, `pgjobs schedule`)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "SMTP provider outage"}]}
    )

    reason: Text | None = Field(None, description="At most 1,000 characters.")


class QueueSettings(BaseModel):
    """The limits to set; a field left out stays as it is, null removes that limit (as
    `pgjobs queue limit NAME none`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"concurrency": 10, "rate": "100/s", "group_concurrency": 2, "group_rate": "10/m"},
                {"rate": None},
            ]
        },
    )

    concurrency: Whole | None = Field(
        None, description="The most jobs of the queue running at once across every worker."
    )
    rate: Text | None = Field(
        None, description="The most jobs that start per period: 100/s, 10/m, 5/10s, 1000/h."
    )
    group_concurrency: Whole | None = Field(
        None, description="The most jobs of one group of the queue running at once."
    )
    group_rate: Text | None = Field(
        None, description="The most jobs of one group that start per period: 10/m, 1/s."
    )


# -- responses ------------------------------------------------------------------------------------

_QUEUE_EXAMPLE: dict[str, Any] = {
    "name": "emails",
    "paused_at": "2026-12-02T01:20:00Z",
    "paused_by": "alice@example.com",
    "pause_reason": "SMTP provider outage",
    "has_jobs": True,
    "concurrency": 10,
    "rate_jobs": 100,
    "rate_seconds": 1.0,
    "group_concurrency": 2,
    "group_rate_jobs": 10,
    "group_rate_seconds": 60.0,
    "paused": True,
    "rate": "100/s",
    "group_rate": "10/m",
}


class Queue(BaseModel):
    """A queue and its settings (`pgjobs queue list --json`): ``rate`` is ``rate_jobs`` per
    ``rate_seconds`` as written, ``group_rate`` likewise; null fields are limits not set."""

    model_config = _examples(_QUEUE_EXAMPLE)

    name: str
    paused_at: datetime | None
    paused_by: str | None = Field(
        description="Who paused it: user@host from the CLI; from the API the host's signed-in "
        "user, or `api (client address)` with pgjobs' tokens."
    )
    pause_reason: str | None
    has_jobs: bool = Field(description="Whether a job of it is queued (ready, scheduled, running).")
    concurrency: int | None
    rate_jobs: int | None
    rate_seconds: float | None
    group_concurrency: int | None
    group_rate_jobs: int | None
    group_rate_seconds: float | None
    paused: bool
    rate: str | None
    group_rate: str | None = Field(
        description="``group_rate_jobs`` per ``group_rate_seconds`` as written: the most starts "
        "of one group of the queue in any window that long."
    )

    @classmethod
    def of(cls, state: QueueState) -> Queue:
        return cls(
            **dataclasses.asdict(state),
            paused=state.paused,
            rate=rate_text(state.rate_jobs, state.rate_seconds),
            group_rate=rate_text(state.group_rate_jobs, state.group_rate_seconds),
        )


class QueueChange(Queue):
    """The queue after the action, and whether the action changed it (false: it was already
    paused, not paused, or had these limits)."""

    model_config = _examples({**_QUEUE_EXAMPLE, "changed": True})

    changed: bool


class QueueList(BaseModel):
    queues: list[Queue]


_SCHEDULE_EXAMPLE: dict[str, Any] = {
    "name": "reports.hourly",
    "task": "reports.build",
    "queue": "default",
    "schedule": "0 * * * *",
    "timezone": "Europe/Berlin",
    "catch_up": "last",
    "next_run_at": "2026-12-02T02:00:00Z",
    "last_run_at": "2026-12-02T01:00:00Z",
    "last_enqueued_at": "2026-12-02T01:00:00.412Z",
    "last_job_id": 4711,
    "declared_at": "2026-12-02T01:29:55Z",
    "declared": True,
    "paused_at": None,
    "paused_by": None,
}


class Schedule(BaseModel):
    """A periodic schedule as the database records it (`pgjobs schedule --json`)."""

    model_config = ConfigDict(
        from_attributes=True, json_schema_extra={"examples": [_SCHEDULE_EXAMPLE]}
    )

    name: str
    task: str
    queue: str
    schedule: str = Field(description='The cron expression, or "every 90s".')
    timezone: str
    catch_up: str = Field(description='"last", "skip" or a number of missed occurrences.')
    next_run_at: datetime
    last_run_at: datetime | None
    last_enqueued_at: datetime | None
    last_job_id: int | None
    declared_at: datetime
    declared: bool = Field(description="Whether a running worker declared it within a minute.")
    paused_at: datetime | None
    paused_by: str | None = Field(description='Who paused it, and why after ": ".')

    @classmethod
    def of(cls, info: ScheduleInfo) -> Schedule:
        return cls.model_validate(info)


class ScheduleList(BaseModel):
    schedules: list[Schedule]


class ScheduleChange(BaseModel):
    """The schedule after a pause or resume, and whether it changed."""

    model_config = _examples({"changed": True, "schedule": _SCHEDULE_EXAMPLE})

    changed: bool
    schedule: Schedule


class ScheduleRun(BaseModel):
    """The job a run-now enqueued, and the schedule (null: no worker recorded it yet)."""

    model_config = _examples(
        {
            "name": "reports.hourly",
            "job_id": 4712,
            "schedule": _SCHEDULE_EXAMPLE,
            "job": {
                "id": 4712,
                "table": "queued_jobs",
                "status": "ready",
                "queue": "default",
                "task": "reports.build",
                "payload": {"kind": "hourly"},
                "priority": 0,
                "run_at": "2026-12-02T01:31:07Z",
                "attempts": 0,
                "max_attempts": 5,
                "created_at": "2026-12-02T01:31:07Z",
                "expires_at": None,
                "idempotency_key": None,
                "last_error": None,
                "lease_owner": None,
                "lease_expires_at": None,
                "worker": None,
                "finished_at": None,
                "reason": None,
                "error_type": None,
                "redrive_count": 0,
                "redriven_at": None,
                "replay_of": None,
            },
        }
    )

    name: str
    job_id: int
    schedule: Schedule | None
    job: JobSummary
