"""The response models of what the API reads about the fleet: the live workers, each queue's
figures (`pgjobs stats --json`), the read replica, and the groups of a queue with what holds them
back. ``tests/web/test_models.py`` holds them to the fields of ``pgjobs.models``' rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from pgjobs.models import HoldReason
from pgjobs.web.models import _Response


class Worker(_Response):
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    running: int
    uptime: float
    last_seen_age: float


class WorkerList(BaseModel):
    workers: list[Worker]


class QueueStats(BaseModel):
    """One queue of `pgjobs stats --json`."""

    queue: str
    ready: int
    scheduled: int
    running: int
    dead: int
    finished_last_hour: int
    failed_last_hour: int
    oldest_ready_age: float | None
    finished_last_minute: int
    failed_last_minute: int
    retried_last_minute: int
    ran_last_minute: int
    throughput_per_second: float
    retry_rate: float | None
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    #: Ready jobs held back for their task's concurrency limit or rate (counted in ready).
    held: int = 0
    #: The queue's limits (`pgjobs queue limit`): running at once, and starts per period.
    concurrency: int | None = None
    rate_jobs: int | None = None
    rate_seconds: float | None = None
    #: Jobs waiting for their dependencies (not counted in scheduled).
    waiting: int = 0


class Replica(BaseModel):
    """The server ``pgjobs serve --read-dsn`` reads from (``pgjobs.models.ReplicaStatus``)."""

    standby: bool
    receiver: str | None
    pending_bytes: int
    lag_seconds: float | None
    replay_paused: bool


class GroupHold(BaseModel):
    """What holds a group's ready jobs back (``pgjobs.models.GroupHold``)."""

    reason: HoldReason = Field(
        description="limit: its running jobs; running, retry, scheduled: an ordered task's "
        "oldest job of the group; dead: a job of an ordered='hold' task in dead_letter; rate: "
        "a group rate allows no more starts until the oldest in its window leave it."
    )
    task: str | None = Field(
        description="The ordered task whose jobs are held, or the task whose group rate holds "
        "them (null: limit, a queue's group rate)."
    )
    job_ids: list[int] = Field(description="The holding jobs, oldest first, at most a few.")
    jobs: int = Field(description="How many jobs hold it.")
    until: datetime | None = Field(
        default=None,
        description="When the waiting job becomes ready (retry, scheduled), when the group "
        "rate allows the next start (rate).",
    )
    rate: str | None = Field(default=None, description="The group rate that holds it (rate).")


class GroupLoad(BaseModel):
    """A group of a queue (``pgjobs.models.GroupLoad``)."""

    group_key: str
    ready: int = Field(description="Ready jobs, counted up to a cap (ready_capped: more).")
    ready_capped: bool
    running: int
    at_limit: bool = Field(description="Its running jobs reached its queue's or a task's limit.")
    held_by: list[GroupHold] = Field(
        default=[], description="What holds its ready jobs back (ordered tasks: with the app)."
    )


class QueueGroups(BaseModel):
    """The groups of a queue that holds grouped jobs (``pgjobs.models.QueueGroups``)."""

    queue: str
    group_concurrency: int | None
    groups: int = Field(description="Groups with jobs waiting or running, up to a cap.")
    groups_capped: bool
    at_limit: int = Field(description="Groups at their limit.")
    top: list[GroupLoad] = Field(description="The groups with the most ready jobs.")


class StatsVerbose(BaseModel):
    """`pgjobs stats --json --verbose`."""

    queues: list[QueueStats]
    workers: list[Worker]
    orphaned_leases: dict[str, Any]
    tables: list[dict[str, Any]]
    archive_partitions: list[dict[str, Any]]
    archive_default_rows: int | None
    schedules: list[dict[str, Any]] = []
    #: The queues that hold grouped jobs.
    groups: list[QueueGroups] = []
    #: Served with a read DSN: where it leads and how far behind it is.
    replica: Replica | None = None
