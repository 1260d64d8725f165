"""The queue metrics of `pgjobs serve` (pgjobs.web.metrics): Prometheus' text format, values equal
to what the tables hold, counters that count each finished job once (late commits included, a
backlog read over several refreshes), the cache's ttl, and a failed refresh that keeps serving."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import App, NonRetryableError, db, queries
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.web.metrics import DURATION_BUCKETS, QueueMetrics
from tests.support.factories import claim, work
from tests.support.helpers import assert_one_home, scalar
from tests.web.conftest import READ_AUTH

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def pool(dsn: Dsn) -> Iterator[psycopg_pool.ConnectionPool[Any]]:
    pool = db.open_pool(dsn, 2)
    yield pool
    pool.close()


def scrape(metrics: QueueMetrics, pool: psycopg_pool.ConnectionPool[Any]) -> Samples:
    """Render and parse: every sample by (name, labels)."""
    body, content_type = metrics.render(pool)
    assert content_type.startswith("text/plain; version=0.0.4")
    return parse(body)


def parse(body: bytes) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def finished(samples: Samples, outcome: str, queue: str = "default", task: str = "t") -> float:
    return (
        value(samples, "pgjobs_jobs_finished_total", queue=queue, task=task, outcome=outcome) or 0.0
    )


def archive(conn: psycopg.Connection[Any], jobs: int, *, task: str = "t") -> list[int]:
    """Enqueue ``jobs`` jobs, claim them and archive them as succeeded, as a worker would (one
    transaction each way); their started_at is the claim's, finished_at the archive's."""
    ids = [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (task) SELECT %s FROM generate_series(1, %s) RETURNING id",
            (task, jobs),
        ).fetchall()
    ]
    claim(conn, limit=jobs)
    conn.execute(_ARCHIVE_SUCCEEDED, {"ids": ids})
    return ids


# Every column the tables share is copied (started_at included), as JOB_SETTLE_MANY does.
_ARCHIVE_SUCCEEDED = """
WITH gone AS (DELETE FROM queued_jobs WHERE id = ANY(%(ids)s) RETURNING *)
INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                           created_at, started_at, status, worker)
SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
       started_at, 'succeeded', lease_owner
FROM gone
"""

_BURY = """
WITH gone AS (DELETE FROM queued_jobs WHERE id = ANY(%(ids)s) RETURNING *)
INSERT INTO dead_letter (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                         created_at, started_at, reason, last_error)
SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at,
       started_at, 'exhausted', 'boom'
FROM gone
"""


def test_settings_are_checked() -> None:
    for kwargs, field in (
        ({"ttl": -1.0}, "ttl"),
        ({"ttl": float("nan")}, "ttl"),
        ({"batch": 0}, "batch"),
        ({"overlap": -5.0}, "overlap"),
        ({"hold": -0.1}, "hold"),
    ):
        with pytest.raises(ConfigurationError) as caught:
            QueueMetrics(**kwargs)
        assert caught.value.field == field


def test_gauges_equal_what_the_tables_hold(conn, pool) -> None:
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, run_at) VALUES "
        "('mail', 'send', now() - interval '2 minutes'), ('mail', 'send', now()), "
        "('mail', 'send', now() + interval '1 hour'), ('mail', 'digest', now()), "
        "('media', 'resize', now() + interval '1 day')"
    )
    # Two running jobs: one of a live worker, one of a worker that stopped beating.
    conn.execute(
        "INSERT INTO pgjobs_workers (id, host, pid, queues, concurrency, last_seen_at) VALUES "
        "('h:1:a', 'h', 1, '{mail}', 8, now() - interval '3 seconds')"
    )
    ids = [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (queue, task) VALUES ('mail', 'send'), ('mail', 'send') "
            "RETURNING id"
        ).fetchall()
    ]
    conn.execute(
        "UPDATE queued_jobs SET lease_owner = CASE WHEN id = %s THEN 'h:1:a' ELSE 'gone:2:b' END, "
        "lease_expires_at = now() + interval '5 minutes', attempts = 1 WHERE id = ANY(%s)",
        (ids[0], ids),
    )
    dead = [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (queue, task) VALUES ('mail', 'send'), ('media', 'resize'), "
            "('media', 'resize') RETURNING id"
        ).fetchall()
    ]
    conn.execute(_BURY, {"ids": dead})

    samples = scrape(QueueMetrics(ttl=0, hold=0), pool)

    def jobs(queue: str, task: str, state: str) -> float | None:
        return value(samples, "pgjobs_jobs", queue=queue, task=task, state=state)

    assert (jobs("mail", "send", "ready"), jobs("mail", "send", "scheduled")) == (2, 1)
    assert jobs("mail", "send", "running") == 2
    assert (jobs("mail", "digest", "ready"), jobs("media", "resize", "scheduled")) == (1, 1)
    assert jobs("media", "resize", "ready") == 0
    oldest = value(samples, "pgjobs_oldest_ready_age_seconds", queue="mail")
    expected = scalar(
        conn,
        "SELECT extract(epoch FROM now() - min(run_at))::float8 FROM queued_jobs "
        "WHERE queue = 'mail' AND lease_expires_at IS NULL AND run_at <= now()",
    )
    assert oldest is not None and 120 <= oldest <= expected
    assert value(samples, "pgjobs_oldest_ready_age_seconds", queue="media") == 0
    assert value(samples, "pgjobs_dead_letter_jobs", queue="mail", task="send") == 1
    assert value(samples, "pgjobs_dead_letter_jobs", queue="media", task="resize") == 2
    assert value(samples, "pgjobs_workers_live") == 1
    assert value(samples, "pgjobs_worker_slots", worker="h:1:a") == 8
    assert value(samples, "pgjobs_worker_running", worker="h:1:a") == 1
    heartbeat = value(samples, "pgjobs_worker_last_heartbeat_age_seconds", worker="h:1:a")
    assert heartbeat is not None and 3 <= heartbeat < 60
    assert value(samples, "pgjobs_orphaned_leases") == 1
    assert value(samples, "pgjobs_metrics_up") == 1
    assert value(samples, "pgjobs_metrics_scrape_errors_total") == 0
    assert (value(samples, "pgjobs_metrics_scrape_duration_seconds") or 0) > 0


def test_a_pair_that_empties_reads_zero(conn, pool) -> None:
    metrics = QueueMetrics(ttl=0, hold=0)
    conn.execute("INSERT INTO queued_jobs (task) VALUES ('t')")
    assert value(scrape(metrics, pool), "pgjobs_jobs", queue="default", task="t", state="ready")
    conn.execute("DELETE FROM queued_jobs")
    samples = scrape(metrics, pool)
    assert value(samples, "pgjobs_jobs", queue="default", task="t", state="ready") == 0
    assert value(samples, "pgjobs_oldest_ready_age_seconds", queue="default") == 0


def test_counters_start_at_zero_and_count_each_job_once(conn, pool) -> None:
    archive(conn, 3)  # before the first scrape: not counted
    metrics = QueueMetrics(ttl=0, hold=0)
    assert finished(scrape(metrics, pool), "succeeded") == 0
    archive(conn, 5)
    assert finished(scrape(metrics, pool), "succeeded") == 5
    assert finished(scrape(metrics, pool), "succeeded") == 5  # read again: not counted again
    archive(conn, 2)
    archive(conn, 4, task="other")
    samples = scrape(metrics, pool)
    assert finished(samples, "succeeded") == 7
    assert finished(samples, "succeeded", task="other") == 4
    assert finished(scrape(metrics, pool), "succeeded") == 7


def test_every_outcome_is_counted(conn, pool, make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="t")
    def ok(n: int) -> None:
        pass

    @app.task(name="bad", max_attempts=1)
    def bad(n: int) -> None:
        raise NonRetryableError(f"job {n} cannot succeed")

    metrics = QueueMetrics(ttl=0, hold=0)
    scrape(metrics, pool)
    ids = [app.enqueue("t", {"n": n}) for n in range(4)]
    ids += [app.enqueue("bad", {"n": n}) for n in range(3)]
    cancelled = app.enqueue("t", {"n": 99}, run_in=3600)
    app.cancel(cancelled)
    expiring = app.enqueue("t", {"n": 100}, run_in=3600)
    conn.execute("UPDATE queued_jobs SET expires_at = now() WHERE id = %s", [expiring])
    assert scalar(conn, queries.JOB_EXPIRE_MANY, {"limit": 10}) == 1
    assert work(app) == 0
    assert_one_home(conn, [*ids, cancelled, expiring])

    samples = scrape(metrics, pool)
    assert finished(samples, "succeeded") == 4
    assert finished(samples, "cancelled") == 1
    assert finished(samples, "expired") == 1
    assert finished(samples, "dead", task="bad") == 3
    assert value(samples, "pgjobs_dead_letter_jobs", queue="default", task="bad") == 3

    # Run time and pickup latency of the successes, as the archive has them.
    run_count = value(samples, "pgjobs_job_run_duration_seconds_count", queue="default", task="t")
    run_sum = value(samples, "pgjobs_job_run_duration_seconds_sum", queue="default", task="t")
    pickup_sum = value(samples, "pgjobs_job_pickup_latency_seconds_sum", queue="default", task="t")
    expected_run, expected_pickup = conn.execute(
        "SELECT sum(extract(epoch FROM finished_at - started_at)::float8), "
        "sum(extract(epoch FROM started_at - run_at)::float8) "
        "FROM archived_jobs WHERE status = 'succeeded'"
    ).fetchone()
    assert run_count == 4
    assert run_sum == pytest.approx(expected_run)
    assert pickup_sum == pytest.approx(expected_pickup)
    inf = value(
        samples, "pgjobs_job_run_duration_seconds_bucket", queue="default", task="t", le="+Inf"
    )
    assert inf == 4
    assert len(DURATION_BUCKETS) + 1 == sum(
        1 for name, _ in samples if name == "pgjobs_job_run_duration_seconds_bucket"
    )

    # A redrive empties dead_letter: the gauge drops to 0, the counter keeps what happened.
    app.redrive(task="bad")
    samples = scrape(metrics, pool)
    assert value(samples, "pgjobs_dead_letter_jobs", queue="default", task="bad") == 0
    assert finished(samples, "dead", task="bad") == 3


def test_a_row_that_commits_late_is_counted_once(conn, pool, dsn) -> None:
    """A row's finished_at is its transaction's start: a long transaction's rows commit after
    rows with later times were read; the window behind the cursor finds them."""
    metrics = QueueMetrics(ttl=0, hold=0, overlap=60)
    scrape(metrics, pool)
    late_ids = [
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (task) SELECT 't' FROM generate_series(1, 3) RETURNING id"
        ).fetchall()
    ]
    claim(conn, limit=3)
    with psycopg.connect(dsn.url) as slow:  # a transaction that starts first, commits last
        slow.execute(_ARCHIVE_SUCCEEDED, {"ids": late_ids})
        archive(conn, 2)
        assert finished(scrape(metrics, pool), "succeeded") == 2  # the cursor passes them
        slow.commit()
    assert finished(scrape(metrics, pool), "succeeded") == 5
    assert finished(scrape(metrics, pool), "succeeded") == 5
    archive(conn, 1)
    assert finished(scrape(metrics, pool), "succeeded") == 6


def test_a_late_row_is_found_when_another_row_left_the_window(conn, pool, dsn) -> None:
    """A dead job purged and a late one committed between two refreshes leave the window's row
    count as it was; the sum of its ids tells them apart."""
    metrics = QueueMetrics(ttl=0, hold=0, overlap=60)
    scrape(metrics, pool)
    first, late, last = (
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (task) SELECT 't' FROM generate_series(1, 3) RETURNING id"
        ).fetchall()
    )
    conn.execute(_BURY, {"ids": [first]})
    assert finished(scrape(metrics, pool), "dead") == 1
    with psycopg.connect(dsn.url) as slow:
        slow.execute(_BURY, {"ids": [late]})
        conn.execute(_BURY, {"ids": [last]})
        assert finished(scrape(metrics, pool), "dead") == 2
        conn.execute("DELETE FROM dead_letter WHERE id = %s", [first])
        slow.commit()
    assert finished(scrape(metrics, pool), "dead") == 3
    assert finished(scrape(metrics, pool), "dead") == 3


def test_a_job_dead_again_after_a_redrive_counts_again(conn, pool, dsn) -> None:
    """The same id in dead_letter twice (redriven, dead again, this time committed late) is two
    deaths: rows are told apart by id and time."""
    metrics = QueueMetrics(ttl=0, hold=0, overlap=60)
    scrape(metrics, pool)
    job, other = (
        int(r[0])
        for r in conn.execute(
            "INSERT INTO queued_jobs (task) SELECT 't' FROM generate_series(1, 2) RETURNING id"
        ).fetchall()
    )
    conn.execute(_BURY, {"ids": [job]})
    assert finished(scrape(metrics, pool), "dead") == 1
    conn.execute("DELETE FROM dead_letter WHERE id = %s", [job])  # a redrive, by hand
    conn.execute("INSERT INTO queued_jobs (id, task) VALUES (%s, 't')", [job])
    with psycopg.connect(dsn.url) as slow:
        slow.execute(_BURY, {"ids": [job]})
        conn.execute(_BURY, {"ids": [other]})
        assert finished(scrape(metrics, pool), "dead") == 2
        slow.commit()
    assert finished(scrape(metrics, pool), "dead") == 3
    assert finished(scrape(metrics, pool), "dead") == 3


def test_a_row_later_than_the_overlap_is_missed(conn, pool, dsn) -> None:
    """What the overlap buys: without it the same late rows are never counted."""
    metrics = QueueMetrics(ttl=0, hold=0, overlap=0)
    scrape(metrics, pool)
    late_ids = [
        int(r[0]) for r in conn.execute("INSERT INTO queued_jobs (task) VALUES ('t') RETURNING id")
    ]
    claim(conn, limit=1)
    with psycopg.connect(dsn.url) as slow:
        slow.execute(_ARCHIVE_SUCCEEDED, {"ids": late_ids})
        archive(conn, 2)
        assert finished(scrape(metrics, pool), "succeeded") == 2
        slow.commit()
    assert finished(scrape(metrics, pool), "succeeded") == 2


def test_hold_leaves_fresh_rows_for_the_next_refresh(conn, pool) -> None:
    metrics = QueueMetrics(ttl=0, hold=3600)
    scrape(metrics, pool)
    archive(conn, 2)
    assert finished(scrape(metrics, pool), "succeeded") == 0


def test_a_backlog_is_read_over_several_refreshes(conn, pool) -> None:
    metrics = QueueMetrics(ttl=0, hold=0, batch=10)
    scrape(metrics, pool)
    archive(conn, 25)
    seen = []
    for _ in range(4):
        samples = scrape(metrics, pool)
        seen.append((finished(samples, "succeeded"), value(samples, "pgjobs_metrics_catching_up")))
    assert seen == [(10, 1), (20, 1), (25, 0), (25, 0)]


def test_the_cache_honours_ttl(conn, pool) -> None:
    now = [1000.0]
    metrics = QueueMetrics(ttl=5, hold=0, clock=lambda: now[0])
    first = scrape(metrics, pool)
    conn.execute("INSERT INTO queued_jobs (task) VALUES ('t')")
    now[0] += 4.9
    assert scrape(metrics, pool) == first
    now[0] += 0.1
    assert value(scrape(metrics, pool), "pgjobs_jobs", queue="default", task="t", state="ready")


def test_concurrent_scrapes_refresh_once(pool, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = QueueMetrics(ttl=60, hold=0)
    refreshes = []
    original = metrics._refresh

    def counted(*args: Any) -> None:
        refreshes.append(threading.get_ident())
        original(*args)

    monkeypatch.setattr(metrics, "_refresh", counted)
    bodies: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: bodies.append(metrics.render(pool)[0])) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(refreshes) == 1
    assert len(bodies) == 8 and len(set(bodies)) == 1


def test_a_failed_refresh_serves_the_last_values(
    conn, dsn, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = QueueMetrics(ttl=0, hold=0)
    pool = db.open_pool(dsn, 1)
    try:
        conn.execute("INSERT INTO queued_jobs (queue, task) VALUES ('later', 't'), ('later', 't')")
        scrape(metrics, pool)
        archive(conn, 3)
        assert finished(scrape(metrics, pool), "succeeded") == 3
        archive(conn, 1)
    finally:
        pool.close()  # the database is out of reach for this pool

    samples = scrape(metrics, pool)
    assert value(samples, "pgjobs_metrics_up") == 0
    assert value(samples, "pgjobs_metrics_scrape_errors_total") == 1
    assert value(samples, "pgjobs_jobs", queue="later", task="t", state="ready") == 2
    assert finished(samples, "succeeded") == 3
    assert value(scrape(metrics, pool), "pgjobs_metrics_scrape_errors_total") == 2
    outage = [r.getMessage() for r in caplog.records if r.name == "pgjobs.web.metrics"]
    assert len(outage) == 1 and "cannot read the database" in outage[0], outage  # once

    with db.open_pool(dsn, 1) as again:
        samples = scrape(metrics, again)
    assert value(samples, "pgjobs_metrics_up") == 1
    assert value(samples, "pgjobs_metrics_scrape_errors_total") == 2
    assert finished(samples, "succeeded") == 4  # the job archived during the outage too


def test_a_failed_first_refresh_answers_with_the_scrape_metrics_only(dsn) -> None:
    pool = db.open_pool(dsn, 1)
    pool.close()
    samples = scrape(QueueMetrics(), pool)
    assert value(samples, "pgjobs_metrics_up") == 0
    assert value(samples, "pgjobs_metrics_scrape_errors_total") == 1
    assert not any(name.startswith("pgjobs_jobs") for name, _ in samples)


def test_each_instance_has_its_own_registry(conn, pool) -> None:
    one, two = QueueMetrics(ttl=0, hold=0), QueueMetrics(ttl=0, hold=0)
    scrape(one, pool)
    archive(conn, 2)
    assert finished(scrape(one, pool), "succeeded") == 2
    assert finished(scrape(two, pool), "succeeded") == 0  # started after those jobs finished
    global_names = {name for family in REGISTRY.collect() for name in [family.name]}
    assert not any(name.startswith("pgjobs_") for name in global_names)


def test_get_metrics_through_the_app(make_web: Callable[..., FastAPI], conn) -> None:
    conn.execute("INSERT INTO queued_jobs (queue, task) VALUES ('mail', 'send')")
    web = make_web()
    with TestClient(web) as anonymous, TestClient(web, headers=READ_AUTH) as reader:
        assert anonymous.get("/metrics").status_code == 401
        response = reader.get("/metrics")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = parse(response.content)
        assert value(samples, "pgjobs_jobs", queue="mail", task="send", state="ready") == 1
        assert value(samples, "pgjobs_metrics_up") == 1
