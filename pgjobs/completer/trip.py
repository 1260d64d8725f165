"""The worker's round trip: one transaction that applies the buffered outcomes, extends leases
and claims the next jobs (``settle_and_claim``), and the recovery of a batch the database
refused as a whole, down to the one outcome it cannot store (``settle_apart``)."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import psycopg

from pgjobs import db, queries
from pgjobs.completer.arrays import int_array, text_array
from pgjobs.completer.outcomes import Outcomes
from pgjobs.completer.params import (
    ClaimParams,
    ClaimStatus,
    ExtendParams,
    ProgressParams,
    SettleParams,
)
from pgjobs.db import libpq
from pgjobs.errors import DatabaseUnavailable, PoolerMismatch, QueryFailed, SchemaMissing
from pgjobs.models import DeadReason, Job
from pgjobs.text import MAX_ERROR_LENGTH, storable

# Outcomes are what a worker did with its jobs: they log under the worker's name.
log = logging.getLogger("pgjobs.worker")


class TripResult(NamedTuple):
    """What one round trip did: ids whose outcome was applied, ids whose lease was extended,
    jobs claimed, and the claim's status when it gave one. Jobs whose row holds a value Python
    cannot hold (a row pgjobs did not write) are among those claimed, holding an
    ``Unloadable`` there: see ``unloadable_jobs``."""

    settled: set[int]
    extended: set[int]
    claimed: list[Job]
    status: ClaimStatus | None = None


def _jobs(rows: list[tuple[Any, ...]]) -> list[Job]:
    jobs = [db.job_from_row(row) for row in rows]
    return db.Damaged(jobs) if db.damaged(rows) else jobs


def unloadable_jobs(claimed: list[Job]) -> tuple[list[Job], list[tuple[Job, str]]]:
    """``claimed`` split into the jobs that can run and those whose row holds a value that
    could not be loaded, with why: one such row costs only its own job, never its batch. Looks
    at each job only when the claim's rows held such a value."""
    if not db.damaged(claimed):
        return claimed, []
    bad = [
        (job, db.unloadable_problem(values)) for job in claimed if (values := db.unloadable(job))
    ]
    spoiled = {job.id for job, _ in bad}
    return [job for job in claimed if job.id not in spoiled], bad


async def settle_and_claim(
    conn: psycopg.AsyncConnection[Any],
    settle: SettleParams | None,
    extend: ExtendParams | None,
    claim: ClaimParams,
    limit: int,
    *,
    limited: bool = False,
    slots: int | None = None,
    progress: ProgressParams | None = None,
) -> TripResult:
    """One round trip and one transaction of a worker: apply ``settle``'s outcomes, extend
    leases, and claim up to ``limit`` jobs (0 claims none), of which those beyond ``slots`` are
    claimed ahead of free slots (see ``JOB_CLAIM``); with ``limited``, under the limits of the
    claim's tasks and queues (``JOB_CLAIM_LIMITED``).

    The usual trip, successes only and no extension, is one statement
    (``JOB_SUCCEED_AND_CLAIM``); any other pipelines ``JOB_SETTLE_MANY``, ``JOB_EXTEND_LEASES``
    and ``JOB_CLAIM`` in one transaction, skipping the parts not needed; ``progress`` (the
    handlers' latest progress, ``JOB_SET_PROGRESS``) goes first, so that a job settled in the
    same trip takes it into its table.

    Example: ``await settle_and_claim(conn, outcomes.drain(), None, ClaimParams("w", ["q"]), 8)``
    """
    limited = limited and limit > 0  # claiming nothing, nothing to limit
    if extend is None and progress is None and (settle is None or settle.only_successes):
        return await _succeed_and_claim(
            conn, settle, claim.bind(limit, limited=limited, slots=slots), limited=limited
        )
    with db.translate_errors():
        # One transaction, so one commit (the unit of cost) for the whole trip.
        async with conn.pipeline(), conn.transaction():
            settled = extended = claimed = None
            if progress:
                await conn.execute(queries.JOB_SET_PROGRESS, progress.bind(), prepare=True)
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
        rows = await db.fetch_rows_async(claimed) if claimed else []
        status = ClaimStatus.take(rows)
        return TripResult(
            {row[0] for row in await settled.fetchall()} if settled else set(),
            {row[0] for row in await extended.fetchall()} if extended else set(),
            _jobs(rows),
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
    params["ok_ids"] = int_array(ok_ids)
    params["ok_attempts"] = int_array(settle.ok_attempts if settle else [])
    # NULL when no handler returned a value: unnest pads it, and it costs nothing to send.
    params["ok_results"] = text_array(results) if any(r is not None for r in results) else None
    rows = await libpq.succeed_and_claim(conn, params, limited=limited)
    # The claimed jobs, then the trip's row: the ids archived, the claim's status (or null).
    said = rows.pop()[3]
    status = None if said["status"] is None else ClaimStatus.of(said["status"])
    return TripResult(set(said["archived"]), set(), _jobs(rows), status)


def report_stale(settle: SettleParams | None, settled: set[int]) -> None:
    """Log the outcomes of ``settle`` that were not applied (``settled`` are the ids that were):
    their jobs' leases were lost."""
    if settle is not None and len(settled) != len(settle):
        stale = sorted(set(settle.ids) - settled)
        log.warning(
            "outcome of job(s) %s not applied: the lease was lost (expired and the job was "
            "rescued or claimed elsewhere), so this worker's result is discarded",
            ",".join(map(str, stale)),
        )


async def settle_apart(
    conn: psycopg.AsyncConnection[Any],
    batch: SettleParams,
    claim: ClaimParams,
    outcomes: Outcomes,
) -> None:
    """Apply ``batch``, which the database refused as a whole, in halves, down to the single
    outcomes it refuses; each of those goes to dead_letter (``_bury_refused``). On a lost
    connection, what is left goes back to ``outcomes`` and the error is raised; on a
    ``PoolerMismatch``, it goes back too, for the next trip."""
    owner = claim.owner
    left = [batch.singles()]
    while left:
        parts = left.pop()
        part = SettleParams.merged(owner, parts)
        try:
            done = await settle_and_claim(conn, part, None, claim, 0)
        except (DatabaseUnavailable, SchemaMissing):
            for rest in [parts, *reversed(left)]:
                outcomes.restore(SettleParams.merged(owner, rest))
            raise
        except PoolerMismatch:  # about the connection, not these outcomes: kept, as is the rest
            for rest in [parts, *reversed(left)]:
                outcomes.restore(SettleParams.merged(owner, rest))
            return
        except QueryFailed as exc:
            if len(parts) == 1:
                await _bury_refused(conn, part, exc)
            else:
                half = len(parts) // 2
                left += [parts[half:], parts[:half]]
            continue
        report_stale(part, done.settled)


async def _bury_refused(
    conn: psycopg.AsyncConnection[Any], outcome: SettleParams, refusal: QueryFailed
) -> None:
    """The one outcome in ``outcome`` cannot be stored (its row is refused: a value too
    large for an index, a result PostgreSQL cannot hold, a privilege missing). Its job goes
    to dead_letter with that explanation, so that it never runs again and every other job
    goes on. When dead_letter refuses the row too, the job is left to its lease (the lease
    rescuer moves it when the lease expires) and the error logged."""
    job_id, attempt, what = _the_outcome(outcome)
    error = storable(f"its {what} could not be stored: {refusal}")
    buried = SettleParams(outcome.owner, dead_ids=[job_id], dead_attempts=[attempt])
    buried.dead_reasons.append(outcome.dead_reasons[0] if outcome.dead_ids else _UNSTORABLE)
    buried.dead_types.append(f"{QueryFailed.__module__}.{QueryFailed.__qualname__}")
    buried.dead_errors.append(error[:MAX_ERROR_LENGTH])
    buried.dead_tracebacks.append(outcome.dead_tracebacks[0] if outcome.dead_ids else None)
    try:
        with db.translate_errors():
            cursor = await conn.execute(queries.JOB_BURY_MANY, buried.bind_dead())
            moved = {row[0] for row in await cursor.fetchall()}
    except QueryFailed as exc:
        log.error(
            "job %d: %s; dead_letter refused it too (%s): left to its lease", job_id, error, exc
        )
        return
    if moved:
        log.error("job %d: %s; sent to dead_letter (%s)", job_id, error, buried.dead_reasons[0])
    else:
        report_stale(buried, moved)


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
