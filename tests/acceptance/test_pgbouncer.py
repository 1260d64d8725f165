"""pgjobs behind PgBouncer in transaction mode (Debian 12's 1.18, started by the tests in front
of the test server, see ``tests/support/pgbouncer.py``): with ``PGJOBS_POOLER=transaction``
enqueues (one, many, in the caller's transaction, async), `pgjobs work` to the end of a backlog,
limits, a periodic schedule, external reports to `pgjobs serve`, and kill -9 of a worker keep
every job in exactly one of the three tables. Without the mode, the worker stops working there
(the server session that prepared its claim is not the one that runs the next one).

Without pgbouncer installed these tests skip, unless $CI is set: then they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec, db
from pgjobs.db.dsn import Dsn
from pgjobs.db.pooler import Pooler
from tests.acceptance.conftest import APP, lease_owner_pattern
from tests.acceptance.periodic_app import TICKS_DDL
from tests.acceptance.test_limits_workers import most_at_once
from tests.acceptance.workload import LIMITED_CONCURRENCY, SHORT_LEASE
from tests.support import pgbouncer
from tests.support.external import downstream_service
from tests.support.helpers import (
    Proc,
    assert_one_home,
    count,
    run_pgjobs,
    scalar,
    stop,
    wait_archived,
    wait_until,
)

pytestmark = pytest.mark.slow


def _require_pgbouncer() -> None:
    if pgbouncer.binary() is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI runs the PgBouncer tests")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[pgbouncer.Bouncer]:
    """A transaction-mode PgBouncer of the module's own in front of the test server."""
    _require_pgbouncer()
    with pgbouncer.pgbouncer(server_url) as running:
        yield running


@pytest.fixture
def own_url(server_url: str, dsn: Dsn) -> Iterator[str]:
    """The test database through a PgBouncer of the test's own: for a test that leaves
    session state on its server sessions (the default mode), or that must find none there."""
    _require_pgbouncer()
    with pgbouncer.pgbouncer(server_url) as running:
        yield running.url(dsn.url)


@pytest.fixture
def pooled_url(bouncer: pgbouncer.Bouncer, dsn: Dsn) -> str:
    """The test database, through PgBouncer."""
    return bouncer.url(dsn.url)


@pytest.fixture
def pooled_env(subprocess_env: dict[str, str], pooled_url: str) -> dict[str, str]:
    """`pgjobs` subprocesses on the test database through PgBouncer, in transaction mode."""
    return {**subprocess_env, "PGJOBS_DATABASE_URL": pooled_url, "PGJOBS_POOLER": "transaction"}


@pytest.fixture
def pooled_app(pooled_url: str) -> Iterator[App]:
    app = App(pooled_url, pooler="transaction", check_task_names=False)
    yield app
    app.close()


def _work(spawn: Callable[..., Proc], env: dict[str, str], *extra: str) -> Proc:
    return spawn("work", "--app", APP, "--poll-interval", "0.2", *extra, env=env)


def test_enqueue_one_many_async_and_in_the_callers_transaction(
    pooled_app: App, pooled_url: str, conn: psycopg.Connection[Any]
) -> None:
    ids = [pooled_app.enqueue("accept.record", {"key": n}) for n in range(60)]  # the libpq path
    ids += pooled_app.enqueue_many(JobSpec("accept.record", {"key": 100 + n}) for n in range(300))
    keyed = [JobSpec("accept.record", {"key": n}, idempotency_key=f"k{n % 20}") for n in range(40)]
    ids += pooled_app.enqueue_many(keyed)

    async def enqueue_async() -> list[int]:
        async with pooled_app:
            return [
                await pooled_app.enqueue_async("accept.record", {"key": 500 + n}) for n in range(30)
            ]

    ids += asyncio.run(enqueue_async())
    # In the caller's transaction, on the caller's own connection through PgBouncer.
    with psycopg.connect(pooled_url, prepare_threshold=None) as own:
        with own.transaction():
            kept = pooled_app.enqueue("accept.record", {"key": 900}, connection=own)
        with pytest.raises(ZeroDivisionError), own.transaction():
            pooled_app.enqueue("accept.record", {"key": 901}, connection=own)
            raise ZeroDivisionError
    ids.append(kept)
    assert len(set(ids)) == 60 + 300 + 20 + 30 + 1
    assert count(conn, "queued_jobs") == len(set(ids))
    assert_one_home(conn, set(ids))


def test_the_default_mode_breaks_behind_pgbouncer(
    spawn: Callable[..., Proc], subprocess_env: dict[str, str], own_url: str, runs: Any
) -> None:
    """What PGJOBS_POOLER=transaction is for: a worker in the default mode prepares its claim on
    one server session, and PgBouncer runs the next transaction on another."""
    with App(own_url, pooler="transaction") as app:
        app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(200))
    worker = _work(spawn, {**subprocess_env, "PGJOBS_DATABASE_URL": own_url}, "-c", "8")
    # "prepared statement ... does not exist" (or "already exists", for psycopg's own names
    # left behind on a server session by another client).
    wait_until(
        lambda: "prepared statement" in worker.err(),
        timeout=60,
        what="the worker's statements refused through PgBouncer",
        procs=[worker],
    )


def test_work_through_pgbouncer_to_the_end(
    spawn: Callable[..., Proc], pooled_env: dict[str, str], pooled_app: App, runs: Any
) -> None:
    conn = runs
    env_without = {k: v for k, v in pooled_env.items() if k != "PGJOBS_POOLER"}
    workers = [
        _work(spawn, pooled_env, "-c", "8"),  # $PGJOBS_POOLER
        # --pooler, handed to the worker processes of --processes
        _work(spawn, env_without, "-c", "4", "--processes", "2", "--pooler", "transaction"),
    ]
    # All three worker processes up before the jobs come, so that each takes some, and the
    # supervisor is past its start when it gets SIGTERM.
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pgjobs_workers") == 3,
        timeout=60,
        what="three worker processes registered",
        procs=workers,
    )
    ids = pooled_app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(400))
    wait_archived(conn, len(ids), timeout=120, procs=workers)
    assert scalar(conn, "SELECT count(DISTINCT key) FROM runs WHERE phase = 'done'") == 400
    assert scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'done'") == 400
    assert scalar(conn, "SELECT count(*) FROM archived_jobs WHERE status <> 'succeeded'") == 0
    assert_one_home(conn, ids)
    # Polling, no LISTEN through the pooler (it would stay on a server session others use).
    assert "polling every 0.2s" in workers[0].err()
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%' "
        "AND datname = current_database()"
    )
    assert scalar(conn, listening) == 0
    assert stop(workers, timeout=30) == [0, 0], [w.describe() for w in workers]
    for worker in workers:
        assert "does not exist" not in worker.err(), worker.describe()


def test_listen_dsn_listens_directly(
    spawn: Callable[..., Proc], pooled_env: dict[str, str], pooled_app: App, runs: Any, dsn: Dsn
) -> None:
    conn = runs
    worker = _work(spawn, pooled_env, "--listen-dsn", dsn.url, "--poll-interval", "30")
    wait_until(
        lambda: (
            scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' "
                "AND datname = current_database() AND pid <> pg_backend_pid()",
            )
            == 1
        ),
        timeout=30,
        what="a LISTEN session on the direct DSN",
        procs=[worker],
    )
    ids = pooled_app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(5))
    # Woken by the NOTIFY, not by a poll 30 s later (the bound is well under it).
    wait_archived(conn, len(ids), timeout=20, procs=[worker])
    assert worker.stop() == 0


def test_limits_hold_through_pgbouncer(
    spawn: Callable[..., Proc], pooled_env: dict[str, str], pooled_app: App, runs: Any
) -> None:
    conn = runs
    workers = [_work(spawn, pooled_env, "-c", "2") for _ in range(3)]
    ids = pooled_app.enqueue_many(
        JobSpec("accept.limited", {"key": k, "seconds": 0.1}) for k in range(30)
    )
    wait_archived(conn, len(ids), timeout=120, procs=workers)
    assert most_at_once(conn, 0, 30) == LIMITED_CONCURRENCY  # reached, never passed
    assert_one_home(conn, ids)
    assert stop(workers, timeout=30) == [0, 0, 0]


def test_periodic_through_pgbouncer(
    spawn: Callable[..., Proc], pooled_env: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    conn.execute("TRUNCATE pgjobs_schedules")
    conn.execute(TICKS_DDL)
    app = "tests.acceptance.periodic_app:app"
    workers = [
        spawn("work", "--app", app, "--poll-interval", "0.2", env=pooled_env) for _ in range(2)
    ]

    def ran() -> int:
        return int(scalar(conn, "SELECT count(*) FROM ticks"))

    wait_until(lambda: ran() >= 4, timeout=60, what=lambda: f"4 ticks (now {ran()})", procs=workers)
    assert stop(workers, timeout=30) == [0, 0]
    instants = [
        row[0]
        for row in conn.execute(
            "SELECT run_at FROM queued_jobs WHERE task = 'accept.tick' UNION ALL "
            "SELECT run_at FROM archived_jobs WHERE task = 'accept.tick'"
        ).fetchall()
    ]
    assert len(set(instants)) == len(instants), "an occurrence was enqueued twice"
    ticks = conn.execute("SELECT job_id FROM ticks").fetchall()
    assert len({t[0] for t in ticks}) == len(ticks), "an occurrence ran twice"
    conn.execute("TRUNCATE pgjobs_schedules")


def test_external_reports_through_pgbouncer(
    spawn: Callable[..., Proc], pooled_env: dict[str, str], pooled_app: App, conn: Any
) -> None:
    pytest.importorskip("fastapi")
    from tests.acceptance.test_external_over_http import TOKEN, _free_port, _healthy, _post

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env_without = {k: v for k, v in pooled_env.items() if k != "PGJOBS_POOLER"}
    server = spawn(
        "serve", "--app", "tests.acceptance.http_app:app", "--port", str(port),
        "--pool-size", "2", "--pooler", "transaction",
        env={**env_without, "PGJOBS_API_TOKENS": TOKEN},
    )  # fmt: skip
    wait_until(lambda: _healthy(base), timeout=30, what="pgjobs serve", procs=[server])
    with downstream_service() as downstream:
        worker = spawn(
            "work", "--app", "tests.acceptance.http_app:app", "--queue", "downstream",
            "--poll-interval", "0.1", "--external-url", downstream.url, env=pooled_env,
        )  # fmt: skip
        job_ids = [
            pooled_app.enqueue("http.external", {"invoice": n}, queue="downstream")
            for n in range(5)
        ]
        deliveries = downstream.wait_for(5, timeout=30)
        for delivery in deliveries:
            status, job = _post(
                f"{base}{delivery['report_url_path']}",
                {"attempt": delivery["attempt"], "status": "succeeded", "result": {"ok": 1}},
            )
            assert status == 200, job
        assert worker.stop() == 0
    assert set(assert_one_home(conn, job_ids).values()) == {"archived_jobs"}
    assert server.stop() == 0


def test_kill9_through_pgbouncer_loses_nothing(
    spawn: Callable[..., Proc], pooled_env: dict[str, str], pooled_app: App, runs: Any
) -> None:
    conn = runs
    jobs = 16
    ids = pooled_app.enqueue_many(
        JobSpec("accept.slow_short_lease", {"key": n, "seconds": 1.0}) for n in range(jobs)
    )
    interval = ("--rescue-interval", "0.5")
    victim = _work(spawn, pooled_env, "-c", "4", *interval)
    survivor = _work(spawn, pooled_env, "-c", "4", *interval)
    pattern = lease_owner_pattern(victim.pid)
    wait_until(
        lambda: scalar(
            conn, "SELECT count(*) FROM queued_jobs WHERE lease_owner LIKE %s", [pattern]
        ),
        timeout=30,
        what="the victim to hold jobs",
        procs=[victim, survivor],
    )
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    wait_archived(conn, jobs, timeout=SHORT_LEASE + jobs + 30, procs=[survivor], interval=0.25)
    assert count(conn, "queued_jobs") == 0
    assert count(conn, "dead_letter") == 0
    assert scalar(conn, "SELECT count(DISTINCT key) FROM runs WHERE phase = 'done'") == jobs
    assert_one_home(conn, ids)
    assert survivor.stop() == 0


def test_migrate_and_prune_refuse_the_transaction_mode(pooled_env: dict[str, str]) -> None:
    for args in (("migrate",), ("prune", "--older-than", "30d")):
        done = run_pgjobs(pooled_env, *args)
        assert done.returncode == 2, done
        [line] = done.stderr.strip().splitlines()
        assert "transaction-mode pooler" in line and "direct DSN" in line


def _pooler_check(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = run_pgjobs(env, "doctor", "--json", *args)
    report = json.loads(done.stdout)
    check: dict[str, Any] = next(c for c in report["checks"] if c["name"] == "pooler")
    return check


def test_doctor_detects_pgbouncer_and_names_the_mode(
    pooled_env: dict[str, str], subprocess_env: dict[str, str]
) -> None:
    unset = {k: v for k, v in pooled_env.items() if k != "PGJOBS_POOLER"}
    found = _pooler_check(unset)
    assert found["status"] == "fail", found
    assert "transaction-mode pooler" in found["message"]
    assert "PGJOBS_POOLER=transaction" in found["fix"]
    assert _pooler_check(pooled_env)["status"] == "pass"
    # The option as the workers take it, without the variable.
    assert _pooler_check(unset, "--pooler", "transaction")["status"] == "pass"
    # Set where no pooler is: a warning, and no harm.
    direct = _pooler_check({**subprocess_env, "PGJOBS_POOLER": "transaction"})
    assert direct["status"] == "warn", direct
    assert "PGJOBS_POOLER=transaction is set" in direct["message"]
    assert _pooler_check(subprocess_env)["status"] == "pass"


def test_a_claim_connection_leaves_no_setting_behind(own_url: str) -> None:
    """A worker's claim connection sets only the time zone, which PgBouncer keeps per client:
    another client that gets the same server session next finds its own settings, and the
    claim connection keeps UTC on whichever session runs its next transaction."""

    async def scenario() -> tuple[str, str, str]:
        hot = await db.connect_async(Dsn(own_url, "test", Pooler.TRANSACTION), hot=True)
        try:
            # The other client's transaction most likely gets the session the claim connection
            # just left.
            with (
                psycopg.connect(own_url, prepare_threshold=None) as other,
                other.transaction(),
            ):
                found = other.execute("SELECT current_setting('plan_cache_mode')").fetchone()
                cursor = await hot.execute("SELECT current_setting('TimeZone')")
                zone = await cursor.fetchone()
            assert found is not None and zone is not None
            return str(found[0]), str(zone[0]), str(hot.info.timezone)
        finally:
            await hot.close()

    plan_cache_mode, zone, loaded_in = asyncio.run(scenario())
    assert plan_cache_mode == "auto"
    assert zone == "UTC" and loaded_in == "UTC"
