"""The two KEDA ScaledObjects of deploy/kubernetes/keda/ ask real figures: the PostgreSQL
scaler's query, as the manifest holds it, runs on a migrated database and counts the jobs of the
workers' queues that are ready (in a queue that is not paused) or running; the Prometheus
trigger's query, evaluated over what `pgjobs serve`'s /metrics exports, names a gauge and labels
that exist and sums the same jobs (paused queues included: the gauge does not say which are)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pgjobs import App, db, queries
from pgjobs.completer.outcomes import Outcomes
from pgjobs.db.dsn import Dsn
from pgjobs.models import DeadReason
from pgjobs.web.metrics import QueueMetrics
from tests.support.admin_factories import claim_one
from tests.support.factories import claim_limited, declared_task, settle
from tests.support.helpers import REPO

KEDA = REPO / "deploy" / "kubernetes" / "keda"


def _trigger(name: str) -> dict[str, str]:
    scaled = yaml.safe_load((KEDA / name).read_text(encoding="utf-8"))
    (trigger,) = scaled["spec"]["triggers"]
    metadata: dict[str, str] = trigger["metadata"]
    return metadata


@pytest.fixture
def jobs(make_app, conn: psycopg.Connection[Any]) -> None:
    """In the demo's queues (images, emails): 3 ready, 1 scheduled and 2 running images; 2 ready
    and 1 running e-mails, their queue then paused; and 4 ready jobs of a queue no worker here
    serves."""
    app: App = make_app(check_task_names=False)
    for _ in range(2):  # claimed first: a claim takes the next job of its queue
        claim_one(conn, app.enqueue("demo.resize", {}, queue="images"), queue="images")
    for _ in range(3):
        app.enqueue("demo.resize", {}, queue="images")
    app.enqueue("demo.resize", {}, queue="images", run_in=600)
    claim_one(conn, app.enqueue("demo.send_email", {}, queue="emails"), queue="emails")
    for _ in range(2):
        app.enqueue("demo.send_email", {}, queue="emails")
    app.pause_queue("emails")
    for _ in range(4):
        app.enqueue("other.task", {}, queue="reports")


@pytest.mark.usefixtures("jobs")
def test_the_postgresql_scalers_query_counts_ready_and_running_jobs(
    conn: psycopg.Connection[Any],
) -> None:
    metadata = _trigger("scaledobject-postgresql.yaml")
    rows = conn.execute(metadata["query"]).fetchall()
    # 3 ready + 2 running images, 1 running e-mail; the paused queue's ready e-mails and the
    # unserved queue's jobs are no work for these workers.
    assert rows == [(6,)]
    assert float(metadata["targetQueryValue"]) > 0


@pytest.fixture
def pool(dsn: Dsn) -> Iterator[psycopg_pool.ConnectionPool[Any]]:
    pool = db.open_pool(dsn, 2)
    yield pool
    pool.close()


def _promql_sum(query: str, exposition: str) -> float:
    """``sum(metric{label=~"re", ...})`` evaluated over a /metrics page (the only PromQL shape
    the manifest uses: a sum of one gauge over label matchers anchored as PromQL anchors them)."""
    shape = re.fullmatch(r'sum\((\w+)\{((?:\w+=~"[^"]*"(?:,\s*)?)+)\}\)', query)
    assert shape is not None, f"not a sum over label matchers: {query}"
    name, matchers = shape.groups()
    wanted = {
        label: re.compile(rf"^(?:{rx})$") for label, rx in re.findall(r'(\w+)=~"([^"]*)"', matchers)
    }
    total, seen = 0.0, 0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name != name:
                continue
            seen += 1
            if all(rx.match(sample.labels.get(label, "")) for label, rx in wanted.items()):
                total += sample.value
    assert seen, f"/metrics has no {name}"
    return total


@pytest.mark.usefixtures("jobs")
def test_the_prometheus_triggers_query_sums_the_serve_gauge(
    pool: psycopg_pool.ConnectionPool[Any],
) -> None:
    metadata = _trigger("scaledobject-prometheus.yaml")
    body, _ = QueueMetrics(ttl=0, hold=0).render(pool)
    # 3 ready + 2 running images, 2 ready + 1 running e-mails; not the reports queue.
    assert _promql_sum(metadata["query"], body.decode()) == 8
    assert float(metadata["threshold"]) > 0


DEMO_VALUES = {
    "queues": "'{images,emails}'",
    "group_tasks": "'{}'",
    "group_limits": "'{}'",
    "group_rate_tasks": "'{}'",
    "group_rate_jobs": "'{}'",
    "group_rate_seconds": "'{}'",
    "ordered_tasks": "'{}'",
    "hold_tasks": "'{}'",
}


def test_the_postgresql_scalers_query_is_the_demand_statement_with_the_demos_values() -> None:
    text = queries.JOB_DEMAND
    for name, value in DEMO_VALUES.items():
        text = text.replace(f"%({name})s", value)
    query = _trigger("scaledobject-postgresql.yaml")["query"]
    assert " ".join(query.split()) == " ".join(text.split())


PAIRS = declared_task("k.pairs", group_concurrency=2)
ORDERED = declared_task("k.ordered", ordered=True)
HOLDING = declared_task("k.holding", ordered="hold")
FREE = declared_task("k.free")


def _put(
    conn: psycopg.Connection[Any], task: str, group: str | None, queue: str, n: int = 1
) -> None:
    for _ in range(n):
        conn.execute(
            "INSERT INTO queued_jobs (queue, task, group_key) VALUES (%s, %s, %s)",
            [queue, task, group],
        )
    if group is not None:
        conn.execute(
            "INSERT INTO pgjobs_group_states (queue, group_key) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING",
            [queue, group],
        )


def test_the_demand_counts_only_the_ready_jobs_a_claim_could_take(
    conn: psycopg.Connection[Any],
) -> None:
    """Grouped jobs held by a task's limit (in every queue), a queue's group limit, an ordered
    group's earlier job (in a queue these workers do not serve) and a dead job of a "hold" task
    are no work for more workers: the demand is the running jobs and those a claim takes, and
    stays the same once the claim has taken them."""
    _put(conn, "k.holding", "d", "east")
    (dead,), _ = claim_limited(conn, [HOLDING], queues=["east"])
    outcomes = Outcomes("fake-worker")
    outcomes.bury(dead, DeadReason.NON_RETRYABLE, "no", "ValueError")
    settle(conn, outcomes)
    _put(conn, "k.holding", "d", "east", 2)  # held by the dead one
    _put(conn, "k.pairs", "a", "west")
    (running,), _ = claim_limited(conn, [PAIRS], queues=["west"])
    _put(conn, "k.pairs", "a", "east", 3)  # one more may start, in any queue
    _put(conn, "k.pairs", "a", "west", 2)
    _put(conn, "k.ordered", "b", "east", 3)  # its head may start
    _put(conn, "k.ordered", "c", "reports")  # c's head waits in a queue not served here
    _put(conn, "k.ordered", "c", "east", 2)
    conn.execute("INSERT INTO pgjobs_queues (name, group_concurrency) VALUES ('west', 1)")
    _put(conn, "k.free", "e", "west", 3)  # one at a time in west
    _put(conn, "k.free", None, "east", 2)
    conn.execute(
        "UPDATE queued_jobs SET run_at = now() + interval '1 hour' WHERE id = (SELECT max(id) FROM queued_jobs)"
    )
    params = {
        "queues": ["east", "west"],
        "group_tasks": ["k.pairs"],
        "group_limits": [2],
        "group_rate_tasks": [],
        "group_rate_jobs": [],
        "group_rate_seconds": [],
        "ordered_tasks": ["k.ordered", "k.holding"],
        "hold_tasks": ["k.holding"],
    }
    demand = conn.execute(queries.JOB_DEMAND, params).fetchone()
    # 1 running (a), and a's second, b's head, e's first, the ungrouped ready one.
    assert demand == (5,)
    claimed, _ = claim_limited(
        conn, [PAIRS, ORDERED, HOLDING, FREE], queues=["east", "west"], limit=100
    )
    assert len(claimed) == 4 and running.id not in {j.id for j in claimed}
    assert conn.execute(queries.JOB_DEMAND, params).fetchone() == (5,)
