"""The worker's round trip (``completer.settle_and_claim``): the one-statement path for
successes and the pipelined path for everything else, with the same fencing and the same
results; and ``Completer.trip``, which interprets what was applied."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC
from typing import Any

import psycopg
import pytest

from pgjobs import db, queries
from pgjobs.completer import ClaimParams, Completer
from pgjobs.completer.outcomes import Outcomes
from pgjobs.completer.params import ExtendParams
from pgjobs.completer.trip import TripResult, settle_and_claim
from pgjobs.context import JobContext
from pgjobs.db.dsn import Dsn
from pgjobs.errors import PgjobsError
from pgjobs.text import result_json
from tests.support.factories import claim, declared_task, row
from tests.support.helpers import assert_one_home, scalar

OWNER = "worker-a"
CLAIM = ClaimParams(OWNER, ["default"], lease=300.0)


def trip(
    dsn: Dsn,
    outcomes: Outcomes | None,
    limit: int,
    extend: ExtendParams | None = None,
    *,
    claim: ClaimParams = CLAIM,
    limited: bool = False,
) -> TripResult:
    """One ``settle_and_claim`` on a fresh worker connection."""

    async def once() -> TripResult:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            settle = outcomes.drain() if outcomes is not None else None
            return await settle_and_claim(aconn, settle, extend, claim, limit, limited=limited)
        finally:
            await aconn.close()

    return asyncio.run(once())


def completer_trip(dsn: Dsn, completer: Completer, limit: int) -> list[int]:
    """One ``Completer.trip`` on a fresh worker connection; the ids it claimed."""

    async def once() -> list[int]:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            return [job.id for job in (await completer.trip(aconn, limit)).jobs]
        finally:
            await aconn.close()

    return asyncio.run(once())


def refuse_extension(context: JobContext, seconds: float) -> None:
    raise AssertionError("these tests hand extensions to the completer directly")


@pytest.fixture
def enqueue(make_app):
    app = make_app(check_task_names=False)

    def enqueue(n: int) -> list[int]:
        return [app.enqueue("t.work", {"n": i}) for i in range(n)]

    return enqueue


def test_successes_are_archived_and_the_next_batch_claimed_in_one_trip(dsn, conn, enqueue):
    ids = enqueue(5)
    first = claim(conn, owner=OWNER, limit=2)
    outcomes = Outcomes(OWNER)
    outcomes.succeed(first[0], None)
    outcomes.succeed(first[1], '{"sent": 3}')

    applied, extended, jobs, _ = trip(dsn, outcomes, limit=2)

    assert applied == {first[0].id, first[1].id}
    assert extended == set()
    assert [job.id for job in jobs] == ids[2:4]
    assert all(job.lease_owner == OWNER and job.attempts == 1 for job in jobs)
    assert jobs[0].payload == {"n": 2}
    where = assert_one_home(conn, ids)
    assert [where[i] for i in ids] == ["archived_jobs"] * 2 + ["queued_jobs"] * 3
    assert row(conn, "archived_jobs", first[0].id)["result"] is None  # type: ignore[index]
    assert row(conn, "archived_jobs", first[1].id)["result"] == {"sent": 3}  # type: ignore[index]
    assert row(conn, "queued_jobs", ids[4])["lease_owner"] is None  # type: ignore[index]


@pytest.mark.parametrize("how", ["one statement", "pipelined"])
def test_claimed_jobs_carry_utc_datetimes_whatever_the_servers_timezone(
    dsn, conn, enqueue, monkeypatch, how
):
    monkeypatch.setenv("PGTZ", "Asia/Kolkata")  # the session's TimeZone unless the worker's says
    enqueue(1)
    extend = None
    if how == "pipelined":
        [running] = claim(conn, owner=OWNER, limit=1, lease=300.0)
        extend = ExtendParams.of(OWNER, [(JobContext(running, refuse_extension), 60.0)])
        enqueue(1)
    jobs = trip(dsn, None, limit=1, extend=extend)[2]
    assert len(jobs) == 1
    for when in (jobs[0].run_at, jobs[0].created_at, jobs[0].lease_expires_at):
        assert when is not None and when.tzinfo is UTC, when


def test_a_trip_that_only_settles_claims_nothing(dsn, conn, enqueue):
    ids = enqueue(2)
    [job] = claim(conn, owner=OWNER, limit=1)
    outcomes = Outcomes(OWNER)
    outcomes.succeed(job, None)

    assert trip(dsn, outcomes, limit=0)[:3] == ({job.id}, set(), [])
    assert row(conn, "queued_jobs", ids[1])["lease_owner"] is None  # type: ignore[index]


def test_a_stale_success_is_refused_and_the_claim_still_happens(dsn, conn, enqueue):
    ids = enqueue(2)
    [job] = claim(conn, owner=OWNER, limit=1)
    outcomes = Outcomes(OWNER)
    outcomes.succeed(job._replace(attempts=job.attempts + 1), None)

    applied, _, jobs, _ = trip(dsn, outcomes, limit=5)

    assert applied == set()
    assert [j.id for j in jobs] == [ids[1]]
    assert row(conn, "queued_jobs", job.id)["lease_owner"] == OWNER  # type: ignore[index]


def test_mixed_outcomes_and_extensions_take_the_pipelined_path(dsn, conn, enqueue):
    ids = enqueue(4)
    ok, failed, running = claim(conn, owner=OWNER, limit=3)
    outcomes = Outcomes(OWNER)
    outcomes.succeed(ok, None)
    outcomes.retry(failed, 60.0, "ValueError: try later")
    extend = ExtendParams(OWNER, [running.id], [1], [900.0])

    applied, extended, jobs, _ = trip(dsn, outcomes, limit=1, extend=extend)

    assert applied == {ok.id, failed.id}
    assert extended == {running.id}
    assert [j.id for j in jobs] == [ids[3]]
    assert row(conn, "queued_jobs", failed.id)["last_error"] == "ValueError: try later"  # type: ignore[index]


def test_worker_connections_plan_their_statements_once(dsn):
    async def setting(name: str) -> tuple[str, str]:
        aconn = await db.connect_async(dsn, hot=True)
        plain = await psycopg.AsyncConnection.connect(dsn.url, autocommit=True)
        try:
            cur = await aconn.execute(f"SHOW {name}")
            other = await plain.execute(f"SHOW {name}")
            return str((await cur.fetchone())[0]), str((await other.fetchone())[0])  # type: ignore[index]
        finally:
            await aconn.close()
            await plain.close()

    assert asyncio.run(setting("plan_cache_mode")) == ("force_generic_plan", "auto")


@pytest.mark.parametrize(
    "name",
    [
        # A generic plan's estimate grows with the backlog (its LIMIT is a parameter): with JIT
        # on, a claim over millions of ready jobs compiled for longer than it ran.
        "jit",
        # A generic plan made on an empty queue scanned it whole for the rest of the session
        # (test_a_plan_made_on_an_empty_queue_still_reads_jobs_by_index).
        "enable_seqscan",
    ],
)
def test_worker_connections_turn_off(dsn, name):
    async def setting() -> str:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            return str((await (await aconn.execute(f"SHOW {name}")).fetchone())[0])  # type: ignore[index]
        finally:
            await aconn.close()

    assert asyncio.run(setting()) == "off"


def generic_plan(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> str:
    """The plan a worker connection keeps for ``sql`` (its settings, ``queries.SESSION_HOT``),
    executed with ``params``: the statement is prepared with numbered parameters, as psycopg
    prepares it, and EXPLAIN ANALYZE runs it in a transaction rolled back."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", number, sql).replace("%%", "%")
    conn.execute(queries.SESSION_HOT)
    conn.execute(f"PREPARE plan_under_test AS {numbered}")
    try:
        # Values inlined by the client: EXECUTE's own parameters would need their types.
        with conn.transaction(force_rollback=True), psycopg.ClientCursor(conn) as cursor:
            rows = cursor.execute(
                f"EXPLAIN ANALYZE EXECUTE plan_under_test({', '.join(['%s'] * len(names))})",
                [params[name] for name in names],
            ).fetchall()
    finally:
        conn.execute("DEALLOCATE plan_under_test")
        conn.execute("RESET ALL")
    return "\n".join(row[0] for row in rows)


@pytest.mark.parametrize("limited", [False, True])
def test_the_claims_generic_plans_read_an_index_range_never_the_whole_queue(conn, limited):
    # A queue of one task, beside which the worker declares a limited one: the planner's
    # estimates for a generic plan once turned a condition on the task into a sort of the whole
    # queue (10 ms a claim at 30,000 jobs).
    conn.execute(
        "INSERT INTO queued_jobs (queue, task) SELECT 'default', 't.work' "
        "FROM generate_series(1, 20000)"
    )
    conn.execute("VACUUM ANALYZE queued_jobs")
    tasks = [
        declared_task("t.work", max_attempts=3, lease=60.0),
        declared_task("t.limited", max_attempts=3, lease=60.0, concurrency=2, rate="10/s"),
    ]
    params = ClaimParams.for_tasks(OWNER, ["default"], tasks).bind(32, limited=limited)
    params.update(ok_ids="{}", ok_attempts="{}", ok_results=None)
    statement = queries.JOB_SUCCEED_AND_CLAIM_LIMITED if limited else queries.JOB_SUCCEED_AND_CLAIM
    plan = generic_plan(conn, statement, params)
    assert "Seq Scan on queued_jobs" not in plan, plan
    assert "Index Scan using ix_queued_jobs_claim on queued_jobs" in plan, plan


@pytest.mark.parametrize("limited", [False, True])
def test_a_plan_made_on_an_empty_queue_still_reads_jobs_by_index(conn, limited):
    # Planned while queued_jobs was empty (a drained queue, vacuumed), a generic plan found a
    # sequential scan cheapest and kept it for the session: fed 20 jobs at a time, a worker's
    # trips then read every dead row its earlier jobs left, 2-7 ms a trip after a minute.
    conn.execute("TRUNCATE queued_jobs CASCADE")
    conn.execute("VACUUM ANALYZE queued_jobs")
    tasks = [
        declared_task("t.work", max_attempts=3, lease=60.0),
        declared_task("t.limited", max_attempts=3, lease=60.0, concurrency=2, rate="10/s"),
    ]
    params = ClaimParams.for_tasks(OWNER, ["default"], tasks).bind(32, limited=limited)
    params.update(ok_ids="{1,2}", ok_attempts="{1,1}", ok_results="{NULL,NULL}")
    statement = queries.JOB_SUCCEED_AND_CLAIM_LIMITED if limited else queries.JOB_SUCCEED_AND_CLAIM
    plan = generic_plan(conn, statement, params)
    assert "Seq Scan on queued_jobs" not in plan, plan


def test_the_completer_applies_what_holds_and_marks_a_lost_lease(dsn, conn, enqueue):
    ids = enqueue(4)
    ok, stale, lost, _ = claim(conn, owner=OWNER, limit=4)
    completer = Completer(CLAIM)
    completer.outcomes.succeed(ok, None)
    completer.outcomes.succeed(stale._replace(attempts=stale.attempts + 1), None)
    held = JobContext(ok, refuse_extension)
    gone = JobContext(lost._replace(attempts=lost.attempts + 1), refuse_extension)
    completer.extend(gone, 60.0)

    assert completer_trip(dsn, completer, limit=0) == []

    assert not completer.pending
    assert gone.lease_lost and not held.lease_lost
    where = assert_one_home(conn, ids)
    assert where[ok.id] == "archived_jobs" and where[stale.id] == "queued_jobs"


def test_the_completer_keeps_everything_when_the_connection_is_lost(dsn, conn, enqueue):
    enqueue(1)
    [job] = claim(conn, owner=OWNER, limit=1)
    completer = Completer(CLAIM)
    completer.outcomes.succeed(job, None)
    completer.extend(JobContext(job, refuse_extension), 60.0)

    async def lost() -> None:
        aconn = await db.connect_async(dsn, hot=True)
        await aconn.close()
        await completer.trip(aconn, 1)

    with pytest.raises(PgjobsError):
        asyncio.run(lost())
    assert len(completer.outcomes) == 1 and completer.extensions_pending
    assert completer_trip(dsn, completer, limit=0) == []
    assert row(conn, "archived_jobs", job.id) is not None


def test_names_reach_the_claim_intact_whatever_characters_they_hold(dsn, conn, make_app):
    # The claim's arrays are sent as array literals: quoting must keep each name one element.
    app = make_app(check_task_names=False)
    names = ["a,b", 'say "hi"', "back\\slash", "NULL", "{brace s}", "l'été"]
    ids = [app.enqueue(name, {}, queue=name) for name in names]
    app.enqueue("other", {}, queue="a")  # a queue the claim does not name
    params = ClaimParams(
        OWNER,
        names,
        lease=300.0,
        lease_tasks=names[:1],
        lease_seconds=[77.5],
        at_most_once_tasks=names[1:2],
    )

    async def once() -> TripResult:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            return await settle_and_claim(aconn, None, None, params, 10)
        finally:
            await aconn.close()

    claimed = asyncio.run(once()).claimed

    assert sorted(job.id for job in claimed) == sorted(ids)
    leases = {
        name: scalar(
            conn,
            "SELECT extract(epoch FROM lease_expires_at - started_at) FROM queued_jobs "
            "WHERE id = %s",
            [job_id],
        )
        for name, job_id in zip(names, ids, strict=True)
    }
    assert float(leases[names[0]]) == 77.5 and float(leases[names[2]]) == 300.0
    once_only = conn.execute("SELECT task FROM queued_jobs WHERE at_most_once").fetchall()
    assert once_only == [(names[1],)]


def test_the_hot_statement_is_prepared_once_per_connection(dsn, conn, enqueue):
    enqueue(3)

    async def twice() -> list[str]:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            first = await settle_and_claim(aconn, None, None, CLAIM, 1)
            outcomes = Outcomes(OWNER)
            outcomes.succeed(first.claimed[0], None)
            await settle_and_claim(aconn, outcomes.drain(), None, CLAIM, 1)
            cur = await aconn.execute("SELECT name FROM pg_prepared_statements")
            return [row[0] for row in await cur.fetchall()]
        finally:
            await aconn.close()

    assert asyncio.run(twice()) == ["pgjobs_succeed_and_claim"]


def test_a_trip_cancelled_while_it_waits_closes_its_connection(dsn, conn, enqueue):
    # A success whose row another session holds locked: the trip waits for that lock.
    enqueue(2)
    [job] = claim(conn, owner=OWNER, limit=1)
    outcomes = Outcomes(OWNER)
    outcomes.succeed(job, None)

    async def cancelled() -> bool:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            trip = asyncio.ensure_future(settle_and_claim(aconn, outcomes.drain(), None, CLAIM, 1))
            await asyncio.sleep(0.3)
            assert not trip.done()
            trip.cancel()
            with pytest.raises(asyncio.CancelledError):
                await trip
            return aconn.closed
        finally:
            await aconn.close()

    with conn.transaction():
        conn.execute("SELECT 1 FROM queued_jobs WHERE id = %s FOR UPDATE", [job.id])
        assert asyncio.run(cancelled())
    # Nothing was applied; the next worker connection works as usual.
    outcomes.succeed(job, None)
    assert trip(dsn, outcomes, limit=0).settled == {job.id}


def test_results_reach_the_archive_intact_whatever_characters_they_hold(dsn, conn, enqueue):
    # Results go as an array literal too (quoted, escaped, None as NULL).
    values = ['say "hi"', "back\\slash \\u00e9", "{a,b}", "NULL", None, ["x", {"y": 'z"'}], "été"]
    enqueue(len(values))
    jobs = claim(conn, owner=OWNER, limit=len(values))
    outcomes = Outcomes(OWNER)
    for job, value in zip(jobs, values, strict=True):
        outcomes.succeed(job, result_json(value))

    assert trip(dsn, outcomes, limit=0).settled == {job.id for job in jobs}
    stored = [row(conn, "archived_jobs", job.id)["result"] for job in jobs]  # type: ignore[index]
    assert stored == values
