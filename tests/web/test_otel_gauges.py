"""The queue gauges of `pgjobs serve --otel-metrics` (``create_app(otel_metrics=...)``), collected
with the SDK's in-memory reader against a real PostgreSQL: equal to the server's /metrics for the
same database, one reading per collection, none once the server stopped or without the
setting."""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import instruments, queues
from pgjobs.web.metrics import QueueMetrics
from tests.integration.worker.test_otel_metrics import (
    attrs,
    burst,
    collect,
    outcome_app,
    provider,
    reader,
)
from tests.support.factories import claim
from tests.web.conftest import READ_AUTH, TestClient

__all__ = ["provider", "reader"]  # the fixtures


def queue_state(make_app: Any, conn: Any, dsn: Any) -> None:
    """Ready, scheduled and running jobs in two queues, a dead letter, groups at their limit."""
    app = outcome_app(make_app)
    burst(app)  # one job in dead_letter; the queues empty
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, run_at) VALUES "
        "('emails', 'emails.send', now() - interval '1 hour'), ('emails', 'emails.send', now()), "
        "('emails', 'emails.send', now() + interval '1 day'), ('default', 't.flaky', now())"
    )
    claim(conn, limit=1, queues=["default"])
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, group_key, lease_owner, lease_expires_at, "
        "attempts) VALUES ('tenants', 't', 'customer-1', 'w1', '2999-01-01', 1)"
    )
    queues.limit(dsn, "tenants", group_concurrency=1)


def scraped(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics", headers=READ_AUTH)
    assert response.status_code == 200, response.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_the_server_s_gauges_equal_its_metrics_for_the_same_database(
    make_app, make_web, conn, dsn, provider, reader
) -> None:
    queue_state(make_app, conn, dsn)
    web = make_web(otel_metrics=provider)
    # One reading for the whole test: the scrape and the collection see the same one.
    web.state.pgjobs._metrics = QueueMetrics(ttl=3600)
    with TestClient(web) as client:
        samples = scraped(client)
        found = collect(reader)

    def prometheus(name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: v for (n, labels), v in samples.items() if n == name}

    def otel(name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {key: p.value for key, p in found[name][1].items()}

    depth = otel(instruments.QUEUE_DEPTH)
    assert depth == prometheus("pgjobs_jobs")
    assert depth[attrs(queue="emails", task="emails.send", state="ready")] == 2
    assert depth[attrs(queue="emails", task="emails.send", state="scheduled")] == 1
    assert depth[attrs(queue="default", task="t.flaky", state="running")] == 1
    assert depth[attrs(queue="tenants", task="t", state="running")] == 1
    oldest = otel(instruments.QUEUE_OLDEST_READY_AGE)
    assert oldest == prometheus("pgjobs_oldest_ready_age_seconds")
    assert oldest[attrs(queue="emails")] >= 3600
    dead = otel(instruments.DEAD_LETTER_DEPTH)
    assert dead == prometheus("pgjobs_dead_letter_jobs")
    assert dead == {attrs(queue="default", task="t.dead"): 1}
    at_limit = otel(instruments.QUEUE_GROUPS_AT_LIMIT)
    assert at_limit == prometheus("pgjobs_groups_at_limit")
    assert at_limit[attrs(queue="tenants")] == 1
    assert found[instruments.QUEUE_DEPTH][0].unit == "{job}"
    assert found[instruments.QUEUE_OLDEST_READY_AGE][0].unit == "s"


def test_the_gauges_read_the_database_once_per_collection(
    make_web, conn, provider, reader, monkeypatch
) -> None:
    """One reading per collection for all the gauges, even with a metrics ttl of 0 (every call
    reads); after the server stops, nothing more. (Gauges of nothing, here the dead letters and
    the groups, have no point, and the SDK leaves them out.)"""
    conn.execute("INSERT INTO queued_jobs (queue, task) VALUES ('emails', 'emails.send')")
    web = make_web(otel_metrics=provider)
    metrics_ = web.state.pgjobs._metrics = QueueMetrics(ttl=0)
    refreshes: list[int] = []
    original = metrics_._refresh

    def refresh(*args: Any) -> None:
        refreshes.append(1)
        original(*args)

    monkeypatch.setattr(metrics_, "_refresh", refresh)
    with TestClient(web):
        for collections in (1, 2, 3):
            found = collect(reader)
            assert set(found) == {instruments.QUEUE_DEPTH, instruments.QUEUE_OLDEST_READY_AGE}
            assert len(refreshes) == collections
        conn.execute("INSERT INTO queued_jobs (queue, task) VALUES ('emails', 'emails.send')")
        found = collect(reader)
        key = attrs(queue="emails", task="emails.send", state="ready")
        assert found[instruments.QUEUE_DEPTH][1][key].value == 2
    assert len(refreshes) == 4
    collect(reader)
    assert len(refreshes) == 4  # closed with the server


def test_a_server_without_the_setting_exports_no_gauge(
    make_web, conn, provider, reader, monkeypatch
) -> None:
    conn.execute("INSERT INTO queued_jobs (queue, task) VALUES ('emails', 'emails.send')")
    monkeypatch.setattr(metrics._internal, "_METER_PROVIDER", provider)
    monkeypatch.delenv(instruments.ENV, raising=False)
    with TestClient(make_web()) as client:
        scraped(client)
        assert collect(reader) == {}
    monkeypatch.setenv(instruments.ENV, "1")  # the environment turns it on
    with TestClient(make_web()) as client:
        assert set(collect(reader)) == {
            instruments.QUEUE_DEPTH,
            instruments.QUEUE_OLDEST_READY_AGE,
        }
