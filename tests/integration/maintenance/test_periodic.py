"""Periodic schedules against the database: the scheduler service records declarations, enqueues
each due occurrence once (also when several schedulers run at the same moment), catches up per
the rule, and `pgjobs schedule` / `pgjobs stats` show next and last run."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgjobs import App
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, InvalidPayload, UnknownTask
from pgjobs.maintenance import ServiceConfig, run_services
from pgjobs.maintenance.scheduler import Scheduled, Scheduler
from pgjobs.periodic import CatchUp
from tests.support.factories import run_service
from tests.support.helpers import run, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


@pytest.fixture(autouse=True)
def no_schedules(dsn: Dsn) -> Iterator[None]:
    def clear() -> None:
        with psycopg.connect(dsn.url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgjobs_schedules")

    clear()
    yield
    clear()


def scheduler(app: App) -> Scheduler:
    return Scheduler(app.periodics.values(), app.enqueue_many_async)


def schedule_row(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgjobs_schedules WHERE name = %s", [name])
    names = [c.name for c in cur.description or []]
    found = cur.fetchone()
    assert found is not None, f"no row for schedule {name!r}"
    return dict(zip(names, found, strict=True))


def move_back(conn: psycopg.Connection[Any], name: str, by: timedelta) -> datetime:
    """Pretend the schedule's workers were down for ``by``: its next occurrence lies that far in
    the past. Returns the new next_run_at."""
    moved: datetime = scalar(
        conn,
        "UPDATE pgjobs_schedules SET next_run_at = next_run_at - %s WHERE name = %s "
        "RETURNING next_run_at",
        [by, name],
    )
    return moved


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[str, datetime, str]]:
    return [
        (task, run_at, key)
        for task, run_at, key in conn.execute(
            "SELECT task, run_at, idempotency_key FROM queued_jobs ORDER BY run_at"
        )
    ]


def hourly_app(make_app: Callable[..., App], catch_up: CatchUp = "last") -> App:
    app = make_app()

    @app.periodic("0 * * * *", name="reports.hourly", payload={"kind": "sales"}, catch_up=catch_up)
    @app.task(name="reports.build", queue="reports")
    def build(kind: str) -> None: ...

    return app


def test_a_new_schedule_starts_at_its_next_occurrence(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = hourly_app(make_app)
    assert run_service(dsn, scheduler(app)) == Scheduled(0, 0)
    row = schedule_row(conn, "reports.hourly")
    now = scalar(conn, "SELECT now()")
    assert now < row["next_run_at"] <= now + timedelta(hours=1)
    assert row["next_run_at"].minute == row["next_run_at"].second == 0
    assert (row["task"], row["queue"], row["schedule"], row["timezone"], row["catch_up"]) == (
        "reports.build",
        "reports",
        "0 * * * *",
        "UTC",
        "last",
    )
    assert row["last_run_at"] is None
    assert jobs(conn) == []


def test_a_due_occurrence_is_enqueued_once_with_its_instant_and_key(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = hourly_app(make_app)
    run_service(dsn, scheduler(app))
    due_at = move_back(conn, "reports.hourly", timedelta(hours=1))

    assert run_service(dsn, scheduler(app)) == Scheduled(1, 0)
    key = f"periodic:reports.hourly:{due_at.astimezone(UTC).isoformat()}"
    assert jobs(conn) == [("reports.build", due_at, key)]
    job = conn.execute("SELECT queue, payload, max_attempts FROM queued_jobs").fetchone()
    assert job == ("reports", {"kind": "sales"}, 5)
    row = schedule_row(conn, "reports.hourly")
    assert row["last_run_at"] == due_at
    assert row["next_run_at"] == due_at + timedelta(hours=1)
    assert row["last_job_id"] == scalar(conn, "SELECT id FROM queued_jobs")

    # Nothing more is due: another round (any worker's) enqueues nothing.
    assert run_service(dsn, scheduler(app)) == Scheduled(0, 0)
    assert len(jobs(conn)) == 1


def test_a_schedule_added_is_said_at_info_and_each_occurrence_only_at_debug(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn, caplog: Any
) -> None:
    # The scheduler's own loop, as a worker runs it, a round every 50 ms.
    app = hourly_app(make_app, catch_up=5)
    service = Scheduler(
        app.periodics.values(), app.enqueue_many_async, ServiceConfig(interval=0.05, jitter=0)
    )

    async def rounds() -> datetime:
        stop = asyncio.Event()
        loop = asyncio.create_task(run_services([service], dsn, stop))
        deadline = time.monotonic() + 20  # a bound, not a measurement
        while not scalar(conn, "SELECT count(*) FROM pgjobs_schedules"):
            assert time.monotonic() < deadline, "the schedule was never declared"
            await asyncio.sleep(0.02)
        first: datetime = schedule_row(conn, "reports.hourly")["next_run_at"]
        move_back(conn, "reports.hourly", timedelta(hours=3))  # three occurrences due
        while len(jobs(conn)) < 3:
            assert time.monotonic() < deadline, "the occurrences were not enqueued"
            await asyncio.sleep(0.02)
        stop.set()
        await loop
        return first

    with caplog.at_level(logging.DEBUG, logger="pgjobs.maintenance"):
        first = asyncio.run(rounds())
        run_service(dsn, scheduler(app))  # another worker declares it again: nothing new
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "pgjobs.maintenance"]
    assert [(level, message) for level, message in said if level >= logging.INFO] == [
        (
            logging.INFO,
            "scheduler: schedule reports.hourly added (0 * * * *, UTC): enqueues reports.build, "
            f"first at {first.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
        )
    ]
    assert (logging.DEBUG, "scheduler: enqueued=3 skipped=0") in said


def test_catch_up_after_downtime(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    if scalar(conn, "SELECT extract(minute FROM now()) = 0 AND extract(second FROM now()) < 15"):
        time.sleep(15)  # the hour's occurrence would be on time, not missed
    cases: dict[CatchUp, int] = {"last": 1, "skip": 0, 3: 3}
    for catch_up, expected in cases.items():
        conn.execute("TRUNCATE pgjobs_schedules, queued_jobs")
        app = hourly_app(make_app, catch_up=catch_up)
        run_service(dsn, scheduler(app))
        # Down for 10 hours and a bit: 10 missed occurrences, none on time.
        move_back(conn, "reports.hourly", timedelta(hours=10, minutes=1))
        conn.execute("UPDATE pgjobs_schedules SET next_run_at = date_trunc('hour', next_run_at)")
        now = scalar(conn, "SELECT now()")
        result = run_service(dsn, scheduler(app))
        found = [run_at for _, run_at, _ in jobs(conn)]
        assert result.enqueued == expected, catch_up
        assert len(found) == expected, catch_up
        latest = now.replace(minute=0, second=0, microsecond=0)
        assert found == [latest - timedelta(hours=n) for n in reversed(range(expected))]
        assert result.enqueued + result.skipped >= 10
        assert schedule_row(conn, "reports.hourly")["next_run_at"] > now


def test_concurrent_schedulers_enqueue_each_occurrence_once(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    """Three schedulers (three workers' services) run rounds at the same moments for a few
    seconds on a seconds-level schedule: each occurrence is enqueued by exactly one of them."""
    app = make_app()

    @app.periodic("* * * * * *", name="tick")
    @app.task(name="tick.task")
    def tick() -> None: ...

    async def race(seconds: float) -> list[Scheduled]:
        services = [scheduler(app) for _ in range(3)]
        conns = [await psycopg.AsyncConnection.connect(dsn.url, autocommit=True) for _ in services]
        results: list[Scheduled] = []
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while loop.time() < end:
                results += await asyncio.gather(
                    *(s.run_once(c) for s, c in zip(services, conns, strict=True))
                )
                await asyncio.sleep(0.2)
        finally:
            for c in conns:
                await c.close()
        return results

    results = asyncio.run(race(4.5))
    found = jobs(conn)
    run_ats = [run_at for _, run_at, _ in found]
    assert len(found) >= 3
    assert sum(r.enqueued for r in results) == len(found)
    assert len(set(run_ats)) == len(run_ats), "an occurrence was enqueued twice"
    assert all(t.microsecond == 0 for t in run_ats)
    # No occurrence lost either: one per second from the first to the last.
    assert [b - a for a, b in itertools.pairwise(run_ats)] == [timedelta(seconds=1)] * (
        len(run_ats) - 1
    )
    assert {key for _, _, key in found} == {
        f"periodic:tick:{t.astimezone(UTC).isoformat()}" for t in run_ats
    }


def test_the_idempotency_key_keeps_an_occurrence_once_when_its_row_is_recreated(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = hourly_app(make_app)
    run_service(dsn, scheduler(app))
    due_at = move_back(conn, "reports.hourly", timedelta(hours=1))
    run_service(dsn, scheduler(app))
    # The row is forgotten and recorded again with the same occurrence due (as by a restore).
    conn.execute("DELETE FROM pgjobs_schedules")
    fresh = scheduler(app)
    run_service(dsn, fresh)
    conn.execute("UPDATE pgjobs_schedules SET next_run_at = %s", [due_at])
    run_service(dsn, fresh)
    assert [run_at for _, run_at, _ in jobs(conn)] == [due_at]


def test_a_changed_expression_starts_again_from_its_own_next_occurrence(
    make_app: Callable[..., App], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    app = hourly_app(make_app)
    run_service(dsn, scheduler(app))
    move_back(conn, "reports.hourly", timedelta(days=3))

    changed = make_app()

    @changed.periodic("*/5 * * * *", name="reports.hourly")
    @changed.task(name="reports.build")
    def build() -> None: ...

    assert run_service(dsn, scheduler(changed)) == Scheduled(0, 0)  # no catch-up of the old one
    row = schedule_row(conn, "reports.hourly")
    now = scalar(conn, "SELECT now()")
    assert row["schedule"] == "*/5 * * * *"
    assert now < row["next_run_at"] <= now + timedelta(minutes=5)


def test_declarations_are_checked(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="known")
    def known() -> None: ...

    with pytest.raises(UnknownTask):
        app.periodic("* * * * *", task="unknown")
    with pytest.raises(InvalidPayload) as bad_payload:
        app.periodic("* * * * *", task="known", payload={"x": float("nan")})
    assert bad_payload.value.field == "payload"
    with pytest.raises(ConfigurationError) as raised:
        app.periodic("* * * * *", task="known", timezone="Nowhere/Never")
    assert raised.value.field == "timezone"
    app.periodic("* * * * *", task="known")
    with pytest.raises(ConfigurationError) as raised:
        app.periodic(every=timedelta(minutes=1), task="known")
    assert raised.value.field == "name"
    assert list(app.periodics) == ["known"]
    every = app.periodic(every=timedelta(minutes=1), task="known", name="known.every")
    assert every.schedule == "every 1m"


def test_decorating_a_plain_function_registers_it_as_a_task(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.periodic(every=timedelta(seconds=30), name="plain")
    def plain() -> None: ...

    assert app.periodics["plain"].task in app.tasks


def test_schedule_command_and_stats_show_next_and_last_run(
    capsys: pytest.CaptureFixture[str],
    make_app: Callable[..., App],
    conn: psycopg.Connection[Any],
    dsn: Dsn,
) -> None:
    app = hourly_app(make_app)
    run_service(dsn, scheduler(app))
    due_at = move_back(conn, "reports.hourly", timedelta(hours=1))
    run_service(dsn, scheduler(app))

    code, out, err = run(capsys, "schedule", "--json", "--dsn", dsn.url)
    assert (code, err) == (0, "")
    (listed,) = json.loads(out)
    assert listed["name"] == "reports.hourly" and listed["declared"] is True
    assert datetime.fromisoformat(listed["last_run_at"]) == due_at
    assert datetime.fromisoformat(listed["next_run_at"]) == due_at + timedelta(hours=1)

    code, out, _ = run(capsys, "schedule", "--dsn", dsn.url)
    assert code == 0 and "reports.hourly" in out and "0 * * * *" in out and "yes" in out

    code, out, _ = run(capsys, "stats", "--dsn", dsn.url)
    assert "schedules" in out and "reports.hourly" in out
    code, out, _ = run(capsys, "stats", "--json", "--verbose", "--dsn", dsn.url)
    assert [s["name"] for s in json.loads(out)["schedules"]] == ["reports.hourly"]

    # A schedule no worker declares any more keeps its row, listed as such, until forgotten.
    conn.execute("UPDATE pgjobs_schedules SET declared_at = now() - interval '2 minutes'")
    code, out, _ = run(capsys, "schedule", "--dsn", dsn.url)
    assert "no live worker declares it" in out
    code, out, _ = run(capsys, "schedule", "--forget", "reports.hourly", "--dsn", dsn.url)
    assert code == 0 and "forgotten" in out
    assert scalar(conn, "SELECT count(*) FROM pgjobs_schedules") == 0
    code, _, err = run(capsys, "schedule", "--forget", "reports.hourly", "--dsn", dsn.url)
    assert code == 2 and "no schedule named 'reports.hourly'" in err
