"""OpenTelemetry metrics of a worker against a real PostgreSQL, collected with the SDK's in-memory
reader: a real worker's outcomes, run time and pickup latency as they happened (and as the
worker's own /metrics counts them), and nothing recorded or imported when they are off. The
queue gauges of `pgjobs serve`: tests/web/test_otel_gauges.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import App, NonRetryableError, Worker, WorkerConfig, instruments
from pgjobs.errors import ConfigurationError

Points = dict[frozenset[tuple[str, Any]], Any]


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    yield reader
    reader.shutdown()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> MeterProvider:
    """A meter provider as an application's SDK setup makes one, read in memory."""
    return MeterProvider(metric_readers=[reader], shutdown_on_exit=False)


def collect(reader: InMemoryMetricReader) -> dict[str, tuple[Any, Points]]:
    """pgjobs' instruments of one collection: name -> (the metric, its points by attributes)."""
    data = reader.get_metrics_data()
    found: dict[str, tuple[Any, Points]] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != instruments.METER_NAME:
                continue
            for metric in scope.metrics:
                points = {
                    frozenset((p.attributes or {}).items()): p for p in metric.data.data_points
                }
                found[metric.name] = (metric, points)
    return found


def attrs(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


def outcome_app(make_app: Any) -> App:
    """Three tasks: one that succeeds (queue emails), one that fails once then succeeds, one
    that fails for good."""
    app: App = make_app()
    failed: set[int] = set()

    @app.task(name="emails.send", queue="emails")
    def send(n: int) -> None:
        pass

    @app.task(name="t.flaky", max_attempts=3, retry_base=0.01, retry_cap=0.02)
    def flaky(n: int) -> None:
        if n not in failed:
            failed.add(n)
            raise ValueError("the first attempt fails")

    @app.task(name="t.dead")
    def dead(n: int) -> None:
        raise NonRetryableError("never")

    for n in range(3):
        app.enqueue("emails.send", {"n": n})
    for n in range(2):
        app.enqueue("t.flaky", {"n": n})
    app.enqueue("t.dead", {"n": 0})
    return app


def burst(app: App, **options: Any) -> Worker:
    worker = Worker(
        app,
        WorkerConfig(burst=True, poll_interval=0.02, maintenance=False, **options),
    )
    assert worker.run() == 0
    return worker


def test_a_worker_records_each_outcome_run_time_and_pickup(make_app, conn, provider, reader):
    app = outcome_app(make_app)
    worker = burst(app, otel_metrics=provider)

    found = collect(reader)
    expected = {
        attrs(queue="emails", task="emails.send", outcome="succeeded"): 3,
        attrs(queue="default", task="t.flaky", outcome="retried"): 2,
        attrs(queue="default", task="t.flaky", outcome="succeeded"): 2,
        attrs(queue="default", task="t.dead", outcome="dead"): 1,
    }
    counter, points = found[instruments.JOB_OUTCOMES]
    assert counter.unit == "{job}"
    assert counter.data.is_monotonic
    assert {key: p.value for key, p in points.items()} == expected

    # Each attempt that ran has its run time, by the same attributes.
    duration, points = found[instruments.JOB_DURATION]
    assert duration.unit == "s"
    assert {key: p.count for key, p in points.items()} == expected
    for p in points.values():
        assert tuple(p.explicit_bounds) == instruments.DURATION_BUCKETS
        assert p.sum >= 0 and p.min >= 0
        assert sum(p.bucket_counts) == p.count

    # Each claim has its pickup latency: the flaky jobs were claimed twice.
    pickup, points = found[instruments.JOB_PICKUP_LATENCY]
    assert pickup.unit == "s"
    assert {key: p.count for key, p in points.items()} == {
        attrs(queue="emails", task="emails.send"): 3,
        attrs(queue="default", task="t.flaky"): 4,
        attrs(queue="default", task="t.dead"): 1,
    }
    assert all(p.min >= 0 for p in points.values())

    # The same figures as the database holds, and as the worker's own /metrics counts them.
    archived = Counter(
        task for (task,) in conn.execute("SELECT task FROM archived_jobs").fetchall()
    )
    assert archived == {"emails.send": 3, "t.flaky": 2}
    assert conn.execute("SELECT count(*) FROM dead_letter").fetchone() == (1,)
    assert worker.metrics is not None
    text = worker.metrics.render(busy=0, connected=True)
    prometheus = {
        frozenset((k, v) for k, v in s.labels.items() if k != "worker"): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "pgjobs_worker_jobs_finished_total"
    }
    assert prometheus == expected


def test_the_global_meter_provider_is_used_when_told_true(
    make_app, provider, reader, monkeypatch
) -> None:
    """True records through the provider the application set globally."""
    monkeypatch.setattr(metrics._internal, "_METER_PROVIDER", provider)
    app: App = make_app()

    @app.task(name="t")
    def t() -> None:
        pass

    app.enqueue("t")
    burst(app, otel_metrics=True)
    _, points = collect(reader)[instruments.JOB_OUTCOMES]
    assert {key: p.value for key, p in points.items()} == {
        attrs(queue="default", task="t", outcome="succeeded"): 1
    }


def test_off_nothing_is_recorded_and_nothing_counted(make_app, provider, reader, monkeypatch):
    """Off (the default), with a provider set globally: no instrument, no point, and the worker
    counts nothing at all (its hot path tests one None per job)."""
    monkeypatch.setattr(metrics._internal, "_METER_PROVIDER", provider)
    app = outcome_app(make_app)
    worker = burst(app)
    assert worker.metrics is None
    assert collect(reader) == {}


CHECK = """
import json, sys
from pgjobs import App, Worker, WorkerConfig
app = App("postgresql://u@127.0.0.1:1/db")
app.task(name="t")(lambda: None)
Worker(app, WorkerConfig({options}))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
"""


@pytest.mark.parametrize(("options", "imports"), [("", False), ("otel_metrics=True", True)])
def test_a_plain_worker_imports_no_opentelemetry(options: str, imports: bool) -> None:
    """A worker built without metrics loads nothing of the otel extra; one with them does (the
    check can fail)."""
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(options=options)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert bool(json.loads(result.stdout)) is imports


def test_bad_settings_are_one_line_errors(make_app, monkeypatch) -> None:
    with pytest.raises(ConfigurationError, match="True, False or an OpenTelemetry MeterProvider"):
        WorkerConfig(otel_metrics="yes")
    monkeypatch.setenv(instruments.ENV, "maybe")
    with pytest.raises(ConfigurationError, match=r"\$PGJOBS_OTEL_METRICS='maybe': use 1 or 0"):
        instruments.enabled_from_env()
    # Without the otel extra: a clear refusal, not an ImportError.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    app: App = make_app()
    app.task(name="t")(lambda: None)
    with pytest.raises(ConfigurationError, match=r"pip install 'pgjobs-queue\[otel\]'"):
        Worker(app, WorkerConfig(otel_metrics=True))
