"""The outcome path of a job: classify -> buffer -> send -> interpret.

The worker hands every finished job to its ``Completer``, which classifies the outcome (succeed,
retry with backoff, bury in ``dead_letter``, release), buffers it in ``Outcomes`` and sends the
whole buffer on the worker's next round trip (``settle_and_claim``), together with the lease
extensions handlers asked for and the next claim. What the database applied comes back and is
interpreted here: an outcome that was not applied lost its lease (its job was rescued or claimed
elsewhere), an extension that was refused marks its ``JobContext.lease_lost``.

Each statement's bind parameters are one typed object (``ClaimParams``, ``ExtendParams``,
``SettleParams``), used by the worker and the tests alike. Each outcome carries the attempt it
settles: with the lease owner, that is the fence that keeps a stale worker from touching a job
that was re-claimed elsewhere.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, Protocol

import psycopg

from pgjobs import db, hotpath, queries
from pgjobs.context import JobContext
from pgjobs.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    NonRetryableError,
    QueryFailed,
    SchemaMissing,
)
from pgjobs.models import DeadReason, Job
from pgjobs.retry import RetryPolicy
from pgjobs.submission import DEFAULT_LEASE
from pgjobs.tasks import Task

# Outcomes are what a worker did with its jobs: they log under the worker's name.
log = logging.getLogger("pgjobs.worker")

#: Seconds between two claims under the tasks' limits while nothing else calls for one (a job
#: of a limited task ending here, jobs enqueued, a claim that held jobs back, a rate's next
#: token): the other claims pass the limited tasks' jobs by, so this bounds how long a slot
#: freed by another worker, or a limited job enqueued while the worker is busy, waits.
LIMITS_RECHECK = 1.0
#: Seconds before a claim tries again a limit that another worker's claim held, and the shortest
#: wait for a rate's next token.
LOCKED_OUT_RETRY = 0.02

#: Longest error text kept in last_error (characters); the full traceback goes to dead_letter.
MAX_ERROR_LENGTH = 2000


# --- the statements' parameters ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimParams:
    """Bind parameters of ``queries.JOB_CLAIM`` (and of the claim in ``JOB_SUCCEED_AND_CLAIM``)
    but the number of jobs, which each trip gives to ``bind``."""

    owner: str
    queues: list[str]
    #: Lease in seconds of a task not named in ``lease_tasks``.
    lease: float = DEFAULT_LEASE
    #: Tasks with a lease of their own, and those leases (seconds), as parallel arrays.
    lease_tasks: list[str] = field(default_factory=list)
    lease_seconds: list[float] = field(default_factory=list)
    #: Tasks whose jobs go to dead_letter, not back to the queue, when their lease expires.
    at_most_once_tasks: list[str] = field(default_factory=list)
    #: Tasks with a concurrency limit or a rate, and those limits as parallel arrays (None where
    #: a task has no such limit): ``JOB_CLAIM_LIMITED``'s ``limit_*`` parameters.
    limit_tasks: list[str] = field(default_factory=list)
    limit_concurrency: list[int | None] = field(default_factory=list)
    limit_rate_jobs: list[int | None] = field(default_factory=list)
    limit_rate_seconds: list[float | None] = field(default_factory=list)
    # The parameters but ``limit``, rendered by the first ``bind``.
    _fixed: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def for_tasks(cls, owner: str, queues: Sequence[str], tasks: Iterable[Task]) -> ClaimParams:
        """The claim of a worker that runs ``tasks`` on ``queues``."""
        tasks = list(tasks)
        limited = [t for t in tasks if t.limited]
        return cls(
            owner,
            list(queues),
            # Only the leases that differ from the default: with none, the claim reads none.
            lease_tasks=[t.name for t in tasks if t.lease != DEFAULT_LEASE],
            lease_seconds=[t.lease for t in tasks if t.lease != DEFAULT_LEASE],
            at_most_once_tasks=[t.name for t in tasks if t.at_most_once],
            limit_tasks=[t.name for t in limited],
            limit_concurrency=[t.concurrency for t in limited],
            limit_rate_jobs=[t.rate.jobs if t.rate else None for t in limited],
            limit_rate_seconds=[t.rate.seconds if t.rate else None for t in limited],
        )

    def bind(
        self, limit: int, *, limited: bool = False, slots: int | None = None
    ) -> dict[str, Any]:
        """The statement's parameters, claiming at most ``limit`` jobs, of which those beyond
        ``slots`` (default: none) are claimed ahead of free slots: ``JOB_CLAIM``'s, or with
        ``limited`` ``JOB_CLAIM_LIMITED``'s (which claims no job ahead). The arrays go as array
        literals (the statement casts them), rendered once: they are the same at every trip."""
        fixed = self._fixed
        if fixed is None:
            fixed = {
                "owner": self.owner,
                "queues": _text_array(self.queues),
                "lease": self.lease,
                "lease_tasks": _text_array(self.lease_tasks),
                "lease_seconds": _float_array(self.lease_seconds),
                "at_most_once_tasks": _text_array(self.at_most_once_tasks),
                # JOB_CLAIM leaves these tasks' jobs; JOB_CLAIM_LIMITED takes them under limits.
                "limit_tasks": _text_array(self.limit_tasks),
            }
            object.__setattr__(self, "_fixed", fixed)
        if not limited:
            return {**fixed, "limit": limit, "slots": limit if slots is None else slots}
        return {
            **fixed,
            "limit": limit,
            "limit_concurrency": _float_array(self.limit_concurrency),
            "limit_rate_jobs": _float_array(self.limit_rate_jobs),
            "limit_rate_seconds": _float_array(self.limit_rate_seconds),
        }


class ClaimStatus(NamedTuple):
    """What a claim said besides the jobs it took (its status row; see ``JOB_CLAIM_LIMITED``)."""

    #: Jobs of limited tasks it held back (out of their queue's range): claim again at once.
    held: int = 0
    #: Another worker was claiming under one of the limits: try again soon.
    locked_out: bool = False
    #: Seconds until a rate limit's bucket holds a token again (None: no bucket is empty).
    retry_in: float | None = None
    #: Some of the worker's queues have a concurrency limit or a rate.
    queue_limits: bool = False

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> ClaimStatus:
        """A claim's status, from the JSON object of its status row (in the payload column)."""
        retry_in = status.get("retry_in")
        return cls(
            int(status.get("held", 0)),
            bool(status.get("locked_out", False)),
            None if retry_in is None else float(retry_in),
            bool(status.get("queue_limits", False)),
        )

    @classmethod
    def take(cls, rows: list[tuple[Any, ...]]) -> ClaimStatus | None:
        """The claim's status, popped from the end of its ``rows`` when it gave one (the status
        row comes last; its id is NULL)."""
        return cls.of(rows.pop()[3]) if rows and rows[-1][0] is None else None

    def retry_after(self) -> float | None:
        """Seconds after which a claim under the limits may take what this one could not: soon
        when another worker was claiming under one of them, when a rate's bucket holds a token
        again; None when neither held it back."""
        waits = [LOCKED_OUT_RETRY] if self.locked_out else []
        if self.retry_in is not None:
            waits.append(max(self.retry_in, LOCKED_OUT_RETRY))
        return min(waits, default=None)


@dataclass(frozen=True, slots=True)
class ExtendParams:
    """Bind parameters of ``queries.JOB_EXTEND_LEASES``: hold each job's lease ``seconds`` from
    now, while ``owner`` still holds it for that attempt."""

    owner: str
    ids: list[int]
    attempts: list[int]
    seconds: list[float]

    @classmethod
    def of(cls, owner: str, requests: Iterable[tuple[JobContext, float]]) -> ExtendParams:
        pairs = list(requests)
        return cls(
            owner,
            [c.job.id for c, _ in pairs],
            [c.job.attempts for c, _ in pairs],
            [seconds for _, seconds in pairs],
        )

    def bind(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "ids": self.ids,
            "attempts": self.attempts,
            "seconds": self.seconds,
        }


@dataclass(slots=True)
class SettleParams:
    """Bind parameters of ``queries.JOB_SETTLE_MANY``: outcomes as parallel arrays, one group
    per move (archive, retry, dead_letter, release)."""

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
    #: Seconds before a released job may be claimed again (0: at once).
    release_holds: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ok_ids) + len(self.retry_ids) + len(self.dead_ids) + len(self.release_ids)

    @property
    def ids(self) -> list[int]:
        """The ids these outcomes settle, in the statement's order."""
        return self.ok_ids + self.retry_ids + self.dead_ids + self.release_ids

    @property
    def only_successes(self) -> bool:
        return not (self.retry_ids or self.dead_ids or self.release_ids)

    def bind(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in _SETTLE_FIELDS}

    def extend(self, newer: SettleParams) -> None:
        """Append ``newer``'s outcomes after these."""
        for f in _SETTLE_ARRAYS:
            getattr(self, f.name).extend(getattr(newer, f.name))

    def singles(self) -> list[SettleParams]:
        """One ``SettleParams`` per outcome, in the statement's order (to find the outcome the
        database refuses, after it refused the batch)."""
        parts = []
        for group in _SETTLE_GROUPS:
            for i in range(len(getattr(self, group[0].name))):
                part = SettleParams(self.owner)
                for f in group:
                    getattr(part, f.name).append(getattr(self, f.name)[i])
                parts.append(part)
        return parts


def _merged(owner: str, parts: Sequence[SettleParams]) -> SettleParams:
    merged = SettleParams(owner)
    for part in parts:
        merged.extend(part)
    return merged


_SETTLE_FIELDS = fields(SettleParams)
_SETTLE_ARRAYS = [f for f in _SETTLE_FIELDS if f.name != "owner"]
# The arrays of each move, by their prefix: ok_, retry_, dead_, release_.
_SETTLE_GROUPS = [
    [f for f in _SETTLE_ARRAYS if f.name.startswith(prefix)]
    for prefix in ("ok_", "retry_", "dead_", "release_")
]


# --- classify and buffer ----------------------------------------------------------------------


def result_json(value: Any) -> str | None:
    """A handler's return value as JSON text, or None. A value JSON has no form for (NaN) is
    stored as its ``str``; one ``json`` cannot encode at all (tuple keys, nesting too deep, a
    ``__str__`` that raises) as a note saying so: the job still succeeded."""
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        text = _as_string(value)
    except Exception as exc:  # whatever encoding raised is reported, not raised
        text = _unstorable(exc)
    if "\\ud" in text:
        text = _LONE_SURROGATE.sub(_keep_escape_or_replace, text)
    # jsonb refuses the NUL character; store U+FFFD in its place.
    return text.replace("\\u0000", "\\ufffd") if "\\u0000" in text else text


def _as_string(value: Any) -> str:
    try:
        return json.dumps(str(value))
    except Exception as exc:
        return _unstorable(exc)


def _unstorable(exc: BaseException) -> str:
    return json.dumps(f"result not stored: json cannot encode it ({error_text(exc)})")


# In json.dumps' ASCII output: an escaped backslash, a surrogate pair, or a lone surrogate, which
# jsonb refuses ("unsupported Unicode escape sequence"). Backslashes are matched first so that an
# escape is never read from the middle of another.
_LONE_SURROGATE = re.compile(
    r"\\\\|\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}|\\ud[89a-f][0-9a-f]{2}"
)


def _keep_escape_or_replace(match: re.Match[str]) -> str:
    escape = match.group()
    return escape if len(escape) != 6 else "\\ufffd"


def error_text(exc: BaseException) -> str:
    """``exc`` as one line for last_error: type and message, at most ``MAX_ERROR_LENGTH``, and
    storable whatever the message holds (a ``__str__`` that raises, lone surrogates, NUL)."""
    text = storable(" ".join(f"{type(exc).__name__}: {_message(exc)}".split()))
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


def _traceback_text(exc: BaseException) -> str | None:
    try:
        return storable("".join(traceback.format_exception(exc)))
    except BaseException:  # a hostile __str__ or __traceback__: the error line says enough
        return None


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException as problem:  # a hostile __str__ (even one raising SystemExit)
        return (
            f"<the exception's message cannot be shown: its str() raised {type(problem).__name__}>"
        )


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL as ``\\x00``, lone surrogates (which UTF-8
    cannot encode) as ``\\udcxx``."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode()
    return text.replace("\x00", "\\x00") if "\x00" in text else text


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

    __slots__ = ("_batch", "owner")

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._batch = SettleParams(owner)

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

    def release(self, job: Attempt, *, refund: bool, hold: float = 0.0) -> None:
        """Give ``job`` back to the queue; ``refund`` when it never started running. With
        ``hold`` (seconds) > 0 no worker claims it again before then."""
        batch = self._batch
        batch.release_ids.append(job.id)
        batch.release_attempts.append(job.attempts)
        batch.release_refunds.append(refund)
        batch.release_holds.append(hold)

    def drain(self) -> SettleParams:
        """Everything buffered, as the settle statement's parameters; empties the buffer."""
        batch, self._batch = self._batch, SettleParams(self.owner)
        return batch

    def restore(self, batch: SettleParams) -> None:
        """Put a drained ``batch`` back in front of newer outcomes (its flush failed)."""
        batch.extend(self._batch)
        self._batch = batch


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
        text = storable(" ".join((error or "").split())) or "failed (no error message reported)"
        if len(text) > MAX_ERROR_LENGTH:
            text = text[: MAX_ERROR_LENGTH - 1] + "…"
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


class _ReportedAttempt(NamedTuple):
    id: int
    attempts: int


# --- send ---------------------------------------------------------------------------------------


class TripResult(NamedTuple):
    """What one round trip did: ids whose outcome was applied, ids whose lease was extended,
    jobs claimed, and the claim's status when it gave one."""

    settled: set[int]
    extended: set[int]
    claimed: list[Job]
    status: ClaimStatus | None = None


async def settle_and_claim(
    conn: psycopg.AsyncConnection[Any],
    settle: SettleParams | None,
    extend: ExtendParams | None,
    claim: ClaimParams,
    limit: int,
    *,
    limited: bool = False,
    slots: int | None = None,
) -> TripResult:
    """One round trip and one transaction of a worker: apply ``settle``'s outcomes, extend
    leases, and claim up to ``limit`` jobs (0 claims none), of which those beyond ``slots`` are
    claimed ahead of free slots (see ``JOB_CLAIM``); with ``limited``, under the limits of the
    claim's tasks and queues (``JOB_CLAIM_LIMITED``).

    The usual trip, successes only and no extension, is one statement
    (``JOB_SUCCEED_AND_CLAIM``); any other pipelines ``JOB_SETTLE_MANY``, ``JOB_EXTEND_LEASES``
    and ``JOB_CLAIM`` in one transaction, skipping the parts not needed.

    Example: ``await settle_and_claim(conn, outcomes.drain(), None, ClaimParams("w", ["q"]), 8)``
    """
    limited = limited and limit > 0  # claiming nothing, nothing to limit
    with db.translate_errors():
        if extend is None and (settle is None or settle.only_successes):
            return await _succeed_and_claim(
                conn, settle, claim.bind(limit, limited=limited, slots=slots), limited=limited
            )
        # One transaction, so one commit (the unit of cost) for the whole trip.
        async with conn.pipeline(), conn.transaction():
            settled = extended = claimed = None
            if settle:
                settled = await conn.execute(queries.JOB_SETTLE_MANY, settle.bind(), prepare=True)
            if extend:
                extended = await conn.execute(
                    queries.JOB_EXTEND_LEASES, extend.bind(), prepare=True
                )
            if limit > 0:
                statement = queries.JOB_CLAIM_LIMITED if limited else queries.JOB_CLAIM
                claimed = await conn.execute(
                    statement, claim.bind(limit, limited=limited, slots=slots), prepare=True
                )
        rows = await claimed.fetchall() if claimed else []
        status = ClaimStatus.take(rows)
        return TripResult(
            {row[0] for row in await settled.fetchall()} if settled else set(),
            {row[0] for row in await extended.fetchall()} if extended else set(),
            [db.job_from_row(row) for row in rows],
            status,
        )


async def _succeed_and_claim(
    conn: psycopg.AsyncConnection[Any],
    settle: SettleParams | None,
    params: dict[str, Any],
    *,
    limited: bool,
) -> TripResult:
    """``JOB_SUCCEED_AND_CLAIM`` (``_LIMITED`` with ``limited``) with the claim's ``params``."""
    ok_ids = settle.ok_ids if settle else []
    results = settle.ok_results if settle else []
    params["ok_ids"] = _int_array(ok_ids)
    params["ok_attempts"] = _int_array(settle.ok_attempts if settle else [])
    # NULL when no handler returned a value: unnest pads it, and it costs nothing to send.
    params["ok_results"] = _text_array(results) if any(r is not None for r in results) else None
    rows = await hotpath.succeed_and_claim(conn, params, limited=limited)
    # The claimed jobs, then the trip's row: the ids archived, the claim's status (or null).
    said = rows.pop()[3]
    status = None if said["status"] is None else ClaimStatus.of(said["status"])
    jobs = [db.job_from_row(row) for row in rows]
    return TripResult(set(said["archived"]), set(), jobs, status)


def _int_array(values: list[int]) -> str:
    """``values`` as a PostgreSQL array literal. psycopg's list adapter inspects every element
    to choose the array type (~50 µs for two lists of 32 ints), which the worker's busiest
    statement does not need: its SQL casts the text to the array type."""
    return "{" + ",".join(map(str, values)) + "}"


def _float_array(values: Sequence[float | None]) -> str:
    """``values`` as a PostgreSQL array literal (``repr`` is what float8 and int read back
    exactly); None is NULL."""
    return "{" + ",".join("NULL" if v is None else repr(v) for v in values) + "}"


def _text_array(values: Sequence[str | None]) -> str:
    """``values`` as a PostgreSQL array literal: every element quoted, ``"`` and ``\\``
    escaped, so that commas, braces, spaces and the word NULL stay text; None is NULL."""
    quoted = (
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return "{" + ",".join(quoted) + "}"


class Claimed(NamedTuple):
    """What ``Completer.trip`` claimed: the jobs, the claim's status when it gave one, and how
    many jobs it asked for."""

    jobs: list[Job]
    status: ClaimStatus | None
    asked: int


# --- the whole path, for one worker -------------------------------------------------------------


class Completer:
    """One worker's outcome path: it classifies and buffers outcomes, holds lease extensions
    until the next trip, sends both with the next claim, and interprets what was applied.

    Every method runs on the worker's event loop.
    """

    def __init__(self, claim: ClaimParams, *, recheck: float = LIMITS_RECHECK) -> None:
        self.owner = claim.owner
        self.claim = claim
        self.outcomes = Outcomes(claim.owner)
        self._extensions: dict[int, tuple[JobContext, float]] = {}
        # Some of the worker's queues are limited (the last claim said so): every claim is one
        # under limits (all of those queues' jobs are).
        self._queue_limits = False
        # When the next claim under the tasks' limits is due (time.monotonic()); meanwhile the
        # claims pass the limited tasks' jobs by, as cheap as those of a worker without limits.
        self._recheck = recheck
        self._limits_due = 0.0 if claim.limit_tasks else math.inf

    @property
    def limited(self) -> bool:
        """Some of the worker's tasks, or of its queues, have a concurrency limit or a rate."""
        return bool(self.claim.limit_tasks) or self._queue_limits

    def limits_due(self) -> None:
        """Claim under the tasks' limits on the next trip: a job of a limited task ended here
        (its slot under the limit is free), or jobs were enqueued (some may be limited ones)."""
        if self.claim.limit_tasks:
            self._limits_due = 0.0

    def _claim_under_limits(self, limit: int) -> bool:
        return limit > 0 and (self._queue_limits or time.monotonic() >= self._limits_due)

    def _learn(self, status: ClaimStatus | None, under_limits: bool, *, short: bool) -> None:
        """What a claim said of the limits: which claim comes next, and when. A plain claim
        that came back short may have met jobs of limited tasks, which it leaves where they are:
        the next claim is one under limits (it takes them or holds them back)."""
        self._queue_limits = status is not None and status.queue_limits
        if not self.claim.limit_tasks:
            return
        if not under_limits:
            if short:
                self._limits_due = 0.0
            return
        now = time.monotonic()
        due = now + self._recheck  # other workers free slots and refill buckets meanwhile
        if status is not None:
            if status.held:
                due = now  # more jobs of limited tasks may lie in the queues' ranges
            soon = status.retry_after()
            if soon is not None:
                due = min(due, now + soon)
        self._limits_due = due

    @property
    def pending(self) -> bool:
        """Something waits to be sent: an outcome or a lease extension."""
        return bool(len(self.outcomes) or self._extensions)

    @property
    def extensions_pending(self) -> bool:
        """A lease extension waits: the next trip should not wait to gather a batch."""
        return bool(self._extensions)

    def finished(self, job: Job, task: Task, result: Any, exc: BaseException | None) -> None:
        """Record how ``job``'s handler ended: it returned ``result`` or raised ``exc``."""
        self._extensions.pop(job.id, None)
        if exc is None:
            self.outcomes.succeed(job, result_json(result))
            return
        error = error_text(exc)
        where = f"job {job.id} ({job.task}) failed on attempt {job.attempts}/{job.max_attempts}"
        if isinstance(exc, NonRetryableError) or job.is_last_attempt:
            reason = (
                DeadReason.NON_RETRYABLE
                if isinstance(exc, NonRetryableError)
                else DeadReason.EXHAUSTED
            )
            error_type = storable(f"{type(exc).__module__}.{type(exc).__qualname__}")
            trace = _traceback_text(exc)
            self.outcomes.bury(job, reason, error, error_type, trace)
            log.warning("%s: %s; sent to dead_letter (%s)", where, error, reason)
        else:
            delay = task.retry.delay(job.attempts)
            self.outcomes.retry(job, delay, error)
            log.warning("%s: %s; retry in %.1fs", where, error, delay)

    def timed_out(self, job: Job, task: Task, timeout: float) -> str:
        """``job``'s handler ran longer than ``timeout`` seconds: the attempt failed with reason
        timeout. Retried with the task's backoff while attempts remain; on the last attempt (or
        for an at-most-once task, whose handler may still be running) sent to dead_letter with
        reason ``timeout``. Returns how the worker's metrics count it ("retried" or "dead")."""
        self._extensions.pop(job.id, None)
        error = timeout_error(timeout)
        where = f"job {job.id} ({job.task}) timed out on attempt {job.attempts}/{job.max_attempts}"
        if job.is_last_attempt or task.at_most_once:
            self.outcomes.bury(job, DeadReason.TIMEOUT, error, TIMEOUT_ERROR_TYPE)
            log.warning("%s: %s; sent to dead_letter (%s)", where, error, DeadReason.TIMEOUT)
            return "dead"
        delay = task.retry.delay(job.attempts)
        self.outcomes.retry(job, delay, error)
        log.warning("%s: %s; retry in %.1fs", where, error, delay)
        return "retried"

    def cancelled(self, job: Job) -> None:
        """``job``'s handler was cancelled before it finished: back to the queue, attempt used."""
        self._extensions.pop(job.id, None)
        self.outcomes.release(job, refund=False)

    def forget(self, job: Job) -> None:
        """``job`` was cancelled while it ran (``pgjobs cancel --force`` archived it): send
        nothing more for it, not even a lease extension."""
        self._extensions.pop(job.id, None)

    def unknown_task(self, job: Job) -> None:
        self.outcomes.bury(
            job,
            DeadReason.UNKNOWN_TASK,
            f"no task named {job.task!r} is registered with this worker's app",
        )
        log.warning("job %d: unknown task %r, sent to dead_letter", job.id, job.task)

    def invalid_payload(self, job: Job, problem: str) -> None:
        self.outcomes.bury(job, DeadReason.INVALID_PAYLOAD, problem)
        log.warning("job %d (%s): %s, sent to dead_letter", job.id, job.task, problem)

    def interrupted(self, job: Job, *, at_most_once: bool) -> None:
        """The shutdown grace period ran out while ``job`` ran: give it back now (its attempt
        stays used) rather than leave it to its lease; an at-most-once job goes to dead_letter,
        never to run again."""
        self._extensions.pop(job.id, None)
        if at_most_once:
            self.outcomes.bury(
                job,
                DeadReason.INTERRUPTED,
                "worker shut down while the at-most-once job was running",
            )
        else:
            self.outcomes.release(job, refund=False)

    def extend(self, context: JobContext, seconds: float) -> None:
        """Send a lease extension for ``context``'s job on the next trip."""
        self._extensions[context.job.id] = (context, seconds)

    async def trip(
        self, conn: psycopg.AsyncConnection[Any], limit: int, *, ahead: int = 0
    ) -> Claimed:
        """Send everything pending and claim up to ``limit`` jobs (for free slots) and
        ``ahead`` more (to start as slots free up), in one round trip; returns the jobs claimed
        and what the claim said of the limits. A claim under limits takes no job ahead: a job
        waiting for a slot would hold a place under its limit that another worker could use.
        On a lost connection (``DatabaseUnavailable``) or a schema changed under the worker
        (``SchemaMissing``, a migration in progress) everything stays pending for the next trip
        and the error is raised."""
        settle = self.outcomes.drain() if len(self.outcomes) else None
        extensions, self._extensions = self._extensions, {}
        extend = ExtendParams.of(self.owner, extensions.values()) if extensions else None
        # Under limits only for free slots: a claim of jobs ahead alone stays a plain one.
        under_limits = self._claim_under_limits(limit)
        slots = limit
        if not under_limits:
            limit += ahead
        try:
            done = await settle_and_claim(
                conn, settle, extend, self.claim, limit, limited=under_limits, slots=slots
            )
        except (DatabaseUnavailable, SchemaMissing):
            if settle is not None:
                self.outcomes.restore(settle)
            self._extensions = {**extensions, **self._extensions}
            raise
        except QueryFailed as exc:
            # Not a connection problem, so the same trip would be refused again: apply the
            # outcomes apart, to find the one the database refuses. Claim on the next trip.
            if settle is None:
                log.error("%s; lease extension(s) of job(s) %s not sent", exc, _ids(extensions))
                return Claimed([], None, 0)
            self._extensions = {**extensions, **self._extensions}
            log.warning("%s; applying the %d outcome(s) of the batch apart", exc, len(settle))
            await self._settle_apart(conn, settle)
            return Claimed([], None, 0)
        self._report_stale(settle, done.settled)
        for job_id, (context, _) in extensions.items():
            if job_id not in done.extended:
                context.lease_lost = True
                log.warning("job %d: lease extension refused, the lease was already lost", job_id)
        if limit > 0:  # every claim says whether some queues are limited (JOB_CLAIM: if so)
            self._learn(done.status, under_limits, short=len(done.claimed) < limit)
        return Claimed(done.claimed, done.status, limit)

    def _report_stale(self, settle: SettleParams | None, settled: set[int]) -> None:
        if settle is not None and len(settled) != len(settle):
            stale = sorted(set(settle.ids) - settled)
            log.warning(
                "outcome of job(s) %s not applied: the lease was lost (expired and the job was "
                "rescued or claimed elsewhere), so this worker's result is discarded",
                ",".join(map(str, stale)),
            )

    async def _settle_apart(self, conn: psycopg.AsyncConnection[Any], batch: SettleParams) -> None:
        """Apply ``batch``, which the database refused as a whole, in halves, down to the single
        outcomes it refuses; each of those goes through ``_settle_refused``. On a lost
        connection, what is left stays pending and the error is raised."""
        left = [batch.singles()]
        while left:
            parts = left.pop()
            part = _merged(self.owner, parts)
            try:
                done = await settle_and_claim(conn, part, None, self.claim, 0)
            except (DatabaseUnavailable, SchemaMissing):
                for rest in [parts, *reversed(left)]:
                    self.outcomes.restore(_merged(self.owner, rest))
                raise
            except QueryFailed as exc:
                if len(parts) == 1:
                    await self._settle_refused(conn, part, exc)
                else:
                    half = len(parts) // 2
                    left += [parts[half:], parts[:half]]
                continue
            self._report_stale(part, done.settled)

    async def _settle_refused(
        self, conn: psycopg.AsyncConnection[Any], outcome: SettleParams, refusal: QueryFailed
    ) -> None:
        """The one outcome in ``outcome`` cannot be stored (its row is refused: a value too
        large for an index, a result PostgreSQL cannot hold, a privilege missing). Its job goes
        to dead_letter with that explanation, so that it never runs again and every other job
        goes on. When dead_letter refuses the row too, the job is left to its lease (the lease
        rescuer moves it when the lease expires) and the error logged."""
        job_id, attempt, what = _the_outcome(outcome)
        error = storable(f"its {what} could not be stored: {refusal}")
        buried = SettleParams(self.owner, dead_ids=[job_id], dead_attempts=[attempt])
        buried.dead_reasons.append(outcome.dead_reasons[0] if outcome.dead_ids else _UNSTORABLE)
        buried.dead_types.append(f"{QueryFailed.__module__}.{QueryFailed.__qualname__}")
        buried.dead_errors.append(error[:MAX_ERROR_LENGTH])
        buried.dead_tracebacks.append(outcome.dead_tracebacks[0] if outcome.dead_ids else None)
        params = {name: value for name, value in buried.bind().items() if name in _BURY_PARAMS}
        try:
            with db.translate_errors():
                cursor = await conn.execute(queries.JOB_BURY_MANY, params)
                moved = {row[0] for row in await cursor.fetchall()}
        except QueryFailed as exc:
            log.error(
                "job %d: %s; dead_letter refused it too (%s): left to its lease", job_id, error, exc
            )
            return
        if moved:
            log.error("job %d: %s; sent to dead_letter (%s)", job_id, error, buried.dead_reasons[0])
        else:
            self._report_stale(buried, moved)


_BURY_PARAMS = {"owner", *(f.name for f in _SETTLE_GROUPS[2])}
#: The dead-letter reason of a job whose outcome could not be stored: it is not retried.
_UNSTORABLE = DeadReason.NON_RETRYABLE


def _the_outcome(outcome: SettleParams) -> tuple[int, int, str]:
    """(job id, attempt, what the outcome was) of a one-outcome ``SettleParams``."""
    if outcome.ok_ids:
        return outcome.ok_ids[0], outcome.ok_attempts[0], "success (and its result)"
    if outcome.retry_ids:
        return outcome.retry_ids[0], outcome.retry_attempts[0], "failure to retry"
    if outcome.dead_ids:
        return outcome.dead_ids[0], outcome.dead_attempts[0], "dead_letter row"
    return outcome.release_ids[0], outcome.release_attempts[0], "release"


def _ids(extensions: dict[int, Any]) -> str:
    return ",".join(map(str, extensions)) or "-"
