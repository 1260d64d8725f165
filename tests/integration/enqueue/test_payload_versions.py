"""Payload versions against a real PostgreSQL: jobs are stored with the version they were
enqueued with; a worker upgrades older payloads step by step before the type check and the call;
an upgrade that fails sends the job to dead_letter naming the step; a payload newer than the
worker's task goes back to the queue (attempt refunded, held back a few seconds), not to
dead_letter. Two apps stand for two releases of the same code."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import pytest

from pgjobs import App, JobSpec, NonRetryableError, admin
from pgjobs.payloads import NEWER_VERSION_HOLD
from pgjobs.worker import Worker, WorkerConfig
from tests.support.factories import row, work
from tests.support.helpers import assert_one_home, scalar, wait_until


def cents_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {"order": payload["order"], "cents": round(payload["amount"] * 100)}


def currency_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "currency": "EUR"}


def release_1(make_app: Any) -> App:
    """The first release: charge(order, amount), unversioned (version 1)."""
    app: App = make_app()

    @app.task(name="billing.charge")
    def charge(order: int, amount: float) -> str:
        return f"v1 {order} {amount}"

    return app


def release_3(make_app: Any, ran: list[dict[str, Any]]) -> App:
    """The third release: charge(order, cents, currency), version 3, upgrading 1 -> 2 -> 3."""
    app: App = make_app()

    @app.task(name="billing.charge", version=3, upgrade={1: cents_v2, 2: currency_v3})
    def charge(order: int, cents: int, currency: str) -> str:
        ran.append({"order": order, "cents": cents, "currency": currency})
        return f"v3 {order} {cents} {currency}"

    return app


def test_jobs_are_stored_with_their_version(make_app, conn) -> None:
    old, new = release_1(make_app), release_3(make_app, [])
    v1 = old.enqueue("billing.charge", {"order": 1, "amount": 2.5})
    v3 = new.enqueue("billing.charge", {"order": 2, "cents": 250, "currency": "EUR"})
    scheduled = new.enqueue(
        "billing.charge", {"order": 3, "cents": 1, "currency": "EUR"}, run_in=3600
    )
    # Every insert path: one row, one scheduled row, a keyed batch, a batch by COPY.
    batch = new.enqueue_many(
        [
            JobSpec(
                "billing.charge", {"order": 4, "cents": 1, "currency": "EUR"}, idempotency_key="k"
            )
        ]
        + [JobSpec("billing.charge", {"order": 5, "cents": 1, "currency": "EUR"})] * 70
    )
    plain = old.enqueue_many([JobSpec("billing.charge", {"order": 6, "amount": 1})] * 70)
    versions = dict(conn.execute("SELECT id, payload_version FROM queued_jobs").fetchall())
    assert versions[v1] is None  # version 1: an unversioned task stores NULL
    assert {versions[i] for i in [v3, scheduled, *batch]} == {3}
    assert {versions[i] for i in plain} == {None}


def test_a_newer_worker_upgrades_the_jobs_an_older_producer_enqueued(make_app, conn) -> None:
    ran: list[dict[str, Any]] = []
    old, new = release_1(make_app), release_3(make_app, ran)
    from_v1 = old.enqueue("billing.charge", {"order": 1, "amount": 12.5})
    # A job stored at version 2 (by a release in between) takes the last step only.
    from_v2 = new.enqueue("billing.charge", {"order": 2, "cents": 300, "currency": "EUR"})
    conn.execute(
        "UPDATE queued_jobs SET payload = %s, payload_version = 2 WHERE id = %s",
        ['{"order": 2, "cents": 300}', from_v2],
    )
    current = new.enqueue("billing.charge", {"order": 3, "cents": 5, "currency": "USD"})

    assert work(new, concurrency=1) == 0

    assert sorted(ran, key=lambda r: r["order"]) == [
        {"order": 1, "cents": 1250, "currency": "EUR"},
        {"order": 2, "cents": 300, "currency": "EUR"},
        {"order": 3, "cents": 5, "currency": "USD"},
    ]
    assert set(assert_one_home(conn, [from_v1, from_v2, current]).values()) == {"archived_jobs"}
    archived = row(conn, "archived_jobs", from_v1)
    assert archived is not None
    # The stored payload stays what was enqueued, with its version: the history is not rewritten.
    assert archived["payload"] == {"order": 1, "amount": 12.5}
    assert archived["payload_version"] is None and archived["result"] == "v3 1 1250 EUR"


def test_an_upgrade_that_fails_sends_the_job_to_dead_letter_naming_the_step(make_app, conn) -> None:
    ran: list[dict[str, Any]] = []
    old, new = release_1(make_app), release_3(make_app, ran)
    broken = old.enqueue("billing.charge", {"order": 1})  # no amount: cents_v2 raises KeyError
    # Enqueued unchecked (a producer without the task registered): the upgrade raises too.
    wrong_type = make_app(check_task_names=False).enqueue(
        "billing.charge", {"order": 2, "amount": "ten"}
    )
    fine = old.enqueue("billing.charge", {"order": 3, "amount": 1})

    assert work(new, concurrency=1) == 0

    assert [r["order"] for r in ran] == [3]
    dead = row(conn, "dead_letter", broken)
    assert dead is not None
    assert dead["reason"] == "non_retryable" and dead["attempts"] == 1
    assert dead["last_error"] == (
        "UpgradeFailed: upgrade of billing.charge's payload from version 1 to 2 failed: "
        "KeyError: 'amount'"
    )
    assert dead["error_type"] == "pgjobs.tasks.UpgradeFailed"
    assert "cents_v2" in dead["traceback"]  # the upgrade's own frame, where it raised
    assert row(conn, "dead_letter", wrong_type)["reason"] == "non_retryable"  # type: ignore[index]
    assert assert_one_home(conn, [broken, wrong_type, fine])[fine] == "archived_jobs"


def test_an_upgraded_payload_is_type_checked_before_the_call(make_app, conn) -> None:
    app: App = make_app()
    ran: list[int] = []

    @app.task(name="t.count", version=2, upgrade={1: lambda p: {"n": str(p["n"])}})
    def count(n: int) -> None:
        ran.append(n)

    producer = make_app(check_task_names=False)
    job = producer.enqueue("t.count", {"n": 1})
    assert work(app) == 0
    assert ran == []
    dead = row(conn, "dead_letter", job)
    assert dead is not None and dead["reason"] == "invalid_payload"
    assert dead["last_error"] == "payload.n: expected int, got str"


def test_a_version_older_than_every_upgrade_is_invalid_payload(make_app, conn) -> None:
    app: App = make_app()

    @app.task(name="billing.charge", version=3, upgrade={2: currency_v3})
    def charge(order: int, cents: int, currency: str) -> None: ...

    old = release_1(make_app)
    job = old.enqueue("billing.charge", {"order": 1, "amount": 1})
    assert work(app) == 0
    dead = row(conn, "dead_letter", job)
    assert dead is not None and dead["reason"] == "invalid_payload"
    assert "version 1 is too old for task 'billing.charge' at version 3" in dead["last_error"]


def test_an_older_worker_gives_a_newer_job_back_and_a_newer_worker_runs_it(
    make_app, conn, dsn, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[dict[str, Any]] = []
    old, new = release_1(make_app), release_3(make_app, ran)
    job = new.enqueue("billing.charge", {"order": 7, "cents": 700, "currency": "EUR"})

    worker = Worker(old, WorkerConfig(concurrency=2, poll_interval=0.05, maintenance=False))
    observed: dict[str, Any] = {}

    def released() -> bool:
        with psycopg.connect(dsn.url, autocommit=True) as watch:
            state = watch.execute(
                "SELECT lease_owner IS NULL AND attempts = 0 AND run_at > now(), "
                "extract(epoch FROM run_at - now()) FROM queued_jobs WHERE id = %s",
                [job],
            ).fetchone()
        if state is not None and state[0]:
            observed["held"] = float(state[1])
            return True
        return False

    def watch_then_stop() -> None:
        try:
            wait_until(released, timeout=30, what="the job released by the older worker")
            time.sleep(1)  # the older worker keeps polling meanwhile: it must not take it again
        finally:
            worker.stop()

    watcher = threading.Thread(target=watch_then_stop)
    with caplog.at_level(logging.WARNING, logger="pgjobs.worker"):
        watcher.start()
        assert worker.run() == 0  # on this thread: the worker installs signal handlers
        watcher.join(30)
    # Released: not running, its attempt refunded, held back (run_at in the future), and not
    # claimed again by the same worker while held.
    assert 0 < observed["held"] <= NEWER_VERSION_HOLD
    assert scalar(conn, "SELECT attempts FROM queued_jobs WHERE id = %s", [job]) == 0
    lines = [r.getMessage() for r in caplog.records if f"job {job} " in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0] == (
        f"job {job} (billing.charge): its payload is version 3 and this worker's task knows "
        "versions up to 1; released for another worker (deploy the newer code), held back 5s"
    )
    assert row(conn, "dead_letter", job) is None

    # The newer release's worker runs it once the hold is over, on its first attempt.
    assert work(new) == 0
    assert ran == [{"order": 7, "cents": 700, "currency": "EUR"}]
    archived = row(conn, "archived_jobs", job)
    assert archived is not None and archived["attempts"] == 1
    assert archived["payload_version"] == 3


def test_a_redriven_or_replayed_job_keeps_its_version(make_app, conn) -> None:
    app: App = make_app()
    ran: list[tuple[int, bool]] = []
    failing = [True]

    def mark(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "upgraded": True}

    @app.task(name="t.v3", version=3, upgrade={1: mark, 2: mark})
    def v3(n: int, upgraded: bool = False) -> None:
        if failing[0]:
            raise NonRetryableError("not yet")
        ran.append((n, upgraded))

    job = app.enqueue("t.v3", {"n": 1})
    assert work(app) == 0
    assert row(conn, "dead_letter", job)["payload_version"] == 3  # type: ignore[index]
    failing[0] = False

    assert admin.redrive(app.dsn, admin.DeadFilter(ids=(job,))) == 1
    assert row(conn, "queued_jobs", job)["payload_version"] == 3  # type: ignore[index]
    assert work(app) == 0
    replay = admin.replay(app.dsn, job)
    assert row(conn, "queued_jobs", replay)["payload_version"] == 3  # type: ignore[index]
    assert work(app) == 0
    # Both runs took the payload as version 3: had the version been lost, it would have been
    # taken for version 1 and upgraded.
    assert ran == [(1, False), (1, False)]
