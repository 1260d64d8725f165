"""The HTTP API's request and response bodies, as pydantic models.

They carry the types and the simple bounds, so that the OpenAPI document tells clients what is
accepted; every value then goes through pgjobs' own validation (``JobSpec`` and the producer for
jobs, ``DeadFilter`` for dead-letter filters), which has the last word.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_validator,
)

from pgjobs import admin, browse
from pgjobs.errors import ConfigurationError
from pgjobs.models import DeadReason, JobStatus, Unloadable
from pgjobs.submission import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DEPENDENCIES,
    MAX_JOB_ID,
    MAX_KEY_BYTES,
    MAX_NAME_LENGTH,
    MAX_SECONDS,
    PRIORITY_RANGE,
    JobSpec,
    Ref,
    check_key,
    check_unique_options,
)
from pgjobs.tags import MAX_TAG_LENGTH, MAX_TAGS
from pgjobs.tags import check as check_tags
from pgjobs.workflow_entries import WorkflowEntryKind, WorkflowEntryStatus

#: Jobs one batch enqueue may carry; the body limit usually binds first.
MAX_BATCH_JOBS = 10_000


def _text(value: str) -> str:
    """Refuse text PostgreSQL cannot store: a NUL character, or a lone surrogate (JSON's
    ``"\\ud800"``), which is not valid UTF-8."""
    if "\x00" in value:
        raise ValueError("holds a NUL character, which PostgreSQL refuses")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("holds a lone surrogate, which is not valid UTF-8") from None
    return value


#: Text PostgreSQL can store.
Text = Annotated[str, AfterValidator(_text)]


def _key(value: str, info: ValidationInfo) -> str:
    """A group or unique key, checked as pgjobs checks it (``submission.check_key``)."""
    try:
        return check_key(value, info.field_name or "key")
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None


def _tags(value: list[str] | None, info: ValidationInfo) -> list[str] | None:
    """A job's tags, checked as pgjobs checks them (``tags.check``)."""
    try:
        checked = check_tags(value, info.field_name or "tags")
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    return None if checked is None else list(checked)


#: A job's tags, or the tags a filter asks for.
Tags = Annotated[
    list[Text],
    Field(
        max_length=1000,
        description=f"At most {MAX_TAGS} tags of 1..{MAX_TAG_LENGTH} "
        "characters, e.g. `customer:42`.",
    ),
    AfterValidator(_tags),
]

#: A group or a unique key.
Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_BYTES), AfterValidator(_key)]
Name = Annotated[Text, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
JobId = Annotated[int, Strict(), Field(ge=1, le=MAX_JOB_ID)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS)]
Whole = Annotated[int, Strict()]
Flag = Annotated[bool, Strict()]


class _Request(BaseModel):
    # An unknown field is a typing error of the client (run_in for delay): refuse it.
    model_config = ConfigDict(extra="forbid")


class JobRef(_Request):
    """A job of the same ``POST /jobs/batch``, by its position in ``jobs`` (0 is the first), in
    a job's ``after``: only a job listed before it."""

    ref: Whole = Field(ge=0, description="Position of the job in `jobs`.")


class JobOptions(_Request):
    """A job to enqueue, without its idempotency key (``PUT /jobs/{key}`` takes it from the
    path). Options left out take the task's defaults (with ``--app``), else pgjobs'."""

    task: Name = Field(description="The task's registered name.")
    payload: dict[str, Any] = Field(
        default_factory=dict, description="The handler's keyword arguments, a JSON object."
    )
    queue: Name | None = Field(None, description="Default: the task's queue, else `default`.")
    priority: Whole = Field(
        0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1], description="Higher runs first."
    )
    run_at: AwareDatetime | None = Field(
        None, description="When to run it (ISO 8601 with a timezone). Or `delay`."
    )
    delay: Seconds | None = Field(None, description="Seconds from now to run it. Or `run_at`.")
    max_attempts: Whole | None = Field(None, ge=1, le=MAX_ATTEMPTS_LIMIT)
    expires_at: AwareDatetime | None = Field(
        None, description="Archive it as expired, unrun, if not started by then. Or `expires_in`."
    )
    expires_in: Seconds | None = Field(None, description="Seconds from now until it expires.")
    group: Key | None = Field(
        None,
        description="The group it belongs to (a customer, a tenant): a task's or queue's group "
        "concurrency limits each group's running jobs; claims take turns between groups.",
    )
    unique_key: Key | None = Field(
        None,
        description="While a job of the task with this key has not started, another enqueue "
        "with it does what `on_conflict` says instead of adding a job.",
    )
    on_conflict: Literal["keep", "replace", "debounce"] | None = Field(
        None,
        description="With `unique_key`: `keep` (the default: the existing job, unchanged), "
        "`replace` (it takes this payload, priority and run time) or `debounce` (as replace, "
        "and it runs `debounce` seconds from now).",
    )
    debounce: Seconds | None = Field(
        None,
        description="With `on_conflict` `debounce`: seconds it waits after the latest enqueue "
        "(default: the task's debounce).",
    )
    tags: Tags | None = Field(None, description="Labels to search and triage it by.")
    after: list[JobId | JobRef] | dict[Name, JobId | JobRef] | None = Field(
        None,
        description="Jobs it waits for: it runs once every one has succeeded, and goes to "
        "dead_letter unrun (reason `dependency_failed`) when one does not. Ids, or in "
        '`POST /jobs/batch` `{"ref": n}` for the n-th job of the batch (listed before it); '
        'or an object naming each (`{"charge": 41}`): the job reads their results by name.',
    )

    @field_validator("after", mode="before")
    @classmethod
    def _at_most(cls, value: Any) -> Any:
        if isinstance(value, list | dict) and len(value) > MAX_DEPENDENCIES:
            raise ValueError(f"after lists {len(value):,} jobs; the limit is {MAX_DEPENDENCIES:,}")
        return value

    @field_validator("on_conflict", "debounce")
    @classmethod
    def _needs_unique_key(cls, value: Any, info: ValidationInfo) -> Any:
        # pgjobs' own rule: on_conflict and debounce need a unique key (fields are validated in
        # order: unique_key, then on_conflict, then debounce).
        seen: dict[str, Any] = {"on_conflict": None, "debounce": None, **info.data}
        seen[info.field_name or ""] = value
        try:
            check_unique_options(seen.get("unique_key"), seen["on_conflict"], seen["debounce"])
        except ConfigurationError as exc:
            if exc.field == info.field_name:
                raise ValueError(str(exc)) from None
        return value

    def spec(self, key: str | None) -> JobSpec:
        """The job as ``App.enqueue`` takes it, with idempotency key ``key``."""
        return JobSpec(self.task, self.payload, idempotency_key=key, **self.enqueue_options())

    def enqueue_options(self) -> dict[str, Any]:
        """The keyword arguments of ``App.enqueue`` (``delay`` is its ``run_in``)."""
        return {
            "queue": self.queue,
            "priority": self.priority,
            "run_at": self.run_at,
            "run_in": self.delay,
            "max_attempts": self.max_attempts,
            "expires_at": self.expires_at,
            "expires_in": self.expires_in,
            "group": self.group,
            "unique_key": self.unique_key,
            "on_conflict": self.on_conflict,
            "debounce": self.debounce,
            "tags": self.tags,
            "after": _after(self.after),
        }


def _after(after: list[JobId | JobRef] | dict[str, JobId | JobRef] | None) -> Any:
    def job(a: int | JobRef) -> int | Ref:
        return Ref(a.ref) if isinstance(a, JobRef) else a

    if isinstance(after, dict):
        return {name: job(a) for name, a in after.items()}
    return None if after is None else [job(a) for a in after]


class JobCreate(JobOptions):
    """A job to enqueue."""

    idempotency_key: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_KEY_BYTES,
        description="A second enqueue with the same key returns the existing job.",
    )


class JobBatchCreate(_Request):
    """Jobs to enqueue in one transaction: all of them, or none when one is invalid."""

    jobs: list[JobCreate] = Field(min_length=1, max_length=MAX_BATCH_JOBS)


class CancelRequest(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"force": True}]})

    force: Flag = Field(
        False,
        description=(
            "Cancel even a running job: its worker is asked to stop the handler (async: "
            "cancelled; sync: current_job().cancelled), and its outcome is discarded."
        ),
    )


class ReplayRequest(_Request):
    """A new expiry for the copy. Without one, the copy of an expired job is archived at once
    as expired, unrun, and the copy of any other job never expires."""

    expires_at: AwareDatetime | None = Field(
        None, description="Archive the copy as expired, unrun, if not started by then."
    )
    expires_in: Seconds | None = Field(None, description="Seconds from now until the copy expires.")


class OutcomeReport(_Request):
    """What an external worker reports about the attempt it was given."""

    attempt: Whole = Field(ge=1, le=MAX_ATTEMPTS_LIMIT, description="The attempt delivered.")
    status: Literal["succeeded", "failed"]
    retryable: Flag = Field(True, description="A failure may be retried (attempts permitting).")
    # Text and result are made storable by pgjobs (a NUL or a lone surrogate replaced, a long
    # message cut), as a handler's are: the report is recorded rather than refused.
    error: str | None = Field(None, description="Why the attempt failed (kept as last_error).")
    result: Any = Field(None, description="Any JSON value, kept with the archived job.")


class DeadSelectionRequest(_Request):
    """Which dead jobs to redrive or purge: ids, or filters (the CLI's), or ``all``."""

    ids: list[JobId] | None = Field(None, min_length=1, max_length=browse.MAX_IDS)
    queue: Name | None = None
    task: Name | None = None
    since: AwareDatetime | None = Field(None, description="Failed at or after.")
    until: AwareDatetime | None = Field(None, description="Failed before.")
    error: Annotated[Text, Field(min_length=1, max_length=1000)] | None = Field(
        None, description="The error message contains this (any case)."
    )
    fingerprint: Annotated[Text, Field(min_length=1, max_length=1000)] | None = Field(
        None, description="An error fingerprint, or its 8-digit id (see /dead-letters/groups)."
    )
    tags: Tags | None = Field(None, description="Jobs carrying every one of these tags.")
    all: Flag = Field(False, description="Without ids or filters: every dead job.")
    dry_run: Flag = Field(False, description="Answer what would change; change nothing.")
    batch_size: Whole = Field(admin.DEFAULT_BATCH_SIZE, ge=1, le=100_000)


class PurgeRequest(DeadSelectionRequest):
    confirm: Literal["purge"] | None = Field(
        None, description='Required, as "purge", unless dry_run: a purge deletes for good.'
    )


# -- responses ----------------------------------------------------------------------------------

# A response model restates a domain row (pgjobs.models) so that the OpenAPI document shows its
# types; tests/web/test_models.py holds the two to the same fields and nullability.


class _Response(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def _as_stored(value: Any) -> Any:
    return value.raw if isinstance(value, Unloadable) else value


#: A time of a job's row: ISO 8601, or, for one Python cannot hold (a row pgjobs did not write),
#: the text PostgreSQL writes ("infinity", "10000-01-01 00:00:00+00").
Time = Annotated[datetime | str, BeforeValidator(_as_stored)]
#: A job's payload: a JSON object, or any JSON value in a row pgjobs did not write.
Payload = Annotated[Any, Field(description="A JSON object, as enqueued")]


class Progress(BaseModel):
    """A handler's last reported progress (``current_job().progress(done, total, message)``)."""

    done: int | float
    total: int | float | None = None
    message: str | None = None
    at: str | None = Field(None, description="When the handler reported it (ISO 8601).")


class JobSummary(_Response):
    """A job wherever it is. Columns its table does not have are null (``lease_*`` outside
    queued_jobs, ``worker``/``finished_at`` in queued_jobs, ``reason``/``error_type`` outside
    dead_letter)."""

    id: int
    table: Literal["queued_jobs", "archived_jobs", "dead_letter"]
    status: JobStatus
    queue: str
    task: str
    payload: Payload
    priority: int
    run_at: Time
    attempts: int
    max_attempts: int
    created_at: Time
    expires_at: Time | None
    idempotency_key: str | None
    last_error: str | None
    lease_owner: str | None
    lease_expires_at: Time | None
    worker: str | None
    finished_at: Time | None
    reason: DeadReason | None
    error_type: str | None
    redrive_count: int
    redriven_at: Time | None
    replay_of: int | None
    started_at: Time | None = None
    group_key: str | None = Field(None, description="The group it belongs to (`group`).")
    unique_key: str | None = None
    snoozes: int = Field(0, description="How many times its handler snoozed it.")
    progress: Progress | None = Field(None, description="Its handler's last reported progress.")
    tags: list[str] = Field(default_factory=list, description="Its tags (`tags`).")


class JobEdge(BaseModel):
    """A job on the other end of a dependency, its status (null: purged or pruned) and the name
    the dependent gave it at enqueue (`"after": {"charge": 41}`; null: by id)."""

    id: int
    status: JobStatus | None
    name: str | None = None


class AfterEdge(JobEdge):
    """A job it waits for, or waited for, with its result once it succeeded; ``result_omitted``:
    the results of `after` pass 1 MiB of JSON together, and this one is left out."""

    result: Any = None
    result_omitted: bool = False


class JobEdit(BaseModel):
    """A recorded edit of a job: when, by whom, each changed field's old and new value."""

    id: int
    edited_at: datetime
    edited_by: str
    changes: dict[str, dict[str, Any]] = Field(
        description='E.g. {"priority": {"old": 0, "new": 7}}; times in ISO 8601.'
    )


class WorkflowEntry(BaseModel):
    """One entry of a durable workflow's history (``pgjobs.workflow_entries.WorkflowEntry``): a
    step, a sleep, a wait for an event or for children."""

    seq: int
    kind: WorkflowEntryKind
    name: str
    status: WorkflowEntryStatus
    attempts: int
    result: Any = Field(description="A step's result, an event's payload, children's ids.")
    error: str | None
    error_type: str | None
    transactional: bool
    started_at: datetime | None
    recorded_at: datetime
    wake_at: datetime | None = Field(description="A sleep's wake time, an event wait's deadline.")


class Job(JobSummary):
    """A job with its whole record, as `pgjobs job show` has it."""

    result: Any = None
    traceback: str | None = None
    replays: list[int] = Field(default_factory=list)
    after: list[AfterEdge] | None = Field(
        None, description="The jobs it waits for, or waited for (null: not read by this answer)."
    )
    dependents: list[JobEdge] | None = Field(
        None, description="The jobs that wait for it (null: not read by this answer)."
    )
    waiting_on: int | None = Field(
        None, description="While it waits: how many of `after` have not succeeded yet."
    )
    edits: list[JobEdit] | None = Field(
        None, description="Its recorded edits, oldest first (null: not read by this answer)."
    )
    workflow: list[WorkflowEntry] | None = Field(
        None,
        description="A durable workflow's history, in order (empty for any other job; null: "
        "not read by this answer).",
    )


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(
        description="Pass as `cursor` (with the same filters) for the next page; null: last page."
    )


class JobList(BaseModel):
    jobs: list[Job]


class DeadJob(_Response):
    id: int
    queue: str
    task: str
    payload: Payload
    priority: int
    run_at: Time
    attempts: int
    max_attempts: int
    reason: DeadReason
    error_type: str | None
    last_error: str | None
    traceback: str | None
    worker: str | None
    created_at: Time
    failed_at: Time
    expires_at: Time | None
    idempotency_key: str | None
    redrive_count: int
    redriven_at: Time | None
    replay_of: int | None
    started_at: Time | None
    fingerprint: str
    fingerprint_id: str
    tags: list[str] = Field(default_factory=list, description="Its tags (`tags`).")


class DeadJobList(BaseModel):
    dead_letters: list[DeadJob]


class DeadGroup(_Response):
    task: str
    fingerprint: str
    fingerprint_id: str
    count: int
    first_failed_at: datetime
    last_failed_at: datetime
    queues: list[str]
    latest_id: int


class DeadGroupList(BaseModel):
    groups: list[DeadGroup]


class SelectionResult(BaseModel):
    dry_run: bool
    count: int = Field(description="Jobs moved (or deleted); with dry_run, that would be.")
    ids: list[int]


class Batch(_Response):
    """A batch (``app.batch``), as `pgjobs batch show --json`: ``succeeded``, ``dead`` and
    ``cancelled`` (expired included) count the members' first ends, as the callback's payload
    does; ``members`` counts them by their status now."""

    id: int
    total: int
    pending: int = Field(description="Members that have not ended yet.")
    succeeded: int
    dead: int
    cancelled: int
    created_at: datetime
    completed_at: datetime | None = Field(description="When the last member ended.")
    callback_task: str | None
    callback_queue: str | None
    callback_job_id: int | None = Field(description="The callback job, once enqueued.")
    members: dict[str, int] = Field(description="Members per status now.")


class Health(BaseModel):
    status: Literal["ok", "ready"]


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable, for programs: e.g. job_not_found, stale_outcome.")
    message: str = Field(description="For people: the problem and, where there is one, the fix.")
    field: str | None = Field(description="The input at fault (e.g. priority, jobs[3].run_at).")


class ErrorResponse(BaseModel):
    """The one shape of every error the API answers."""

    error: ErrorDetail
