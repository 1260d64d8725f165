"""External tasks end to end: a worker delivers each job to a real downstream HTTP service (in a
thread of the test), which reports the outcome through ``pgjobs.admin.report_outcome``. The
attempt fences every report; the lease is the downstream's deadline."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs import App, ConfigurationError, admin
from pgjobs.errors import StaleOutcome
from pgjobs.models import JobStatus
from pgjobs.retry import RetryPolicy
from pgjobs.targets import ExternalTarget
from pgjobs.worker import Worker, WorkerConfig, external
from tests.support.external import downstream_service, run_worker_while
from tests.support.factories import row
from tests.support.helpers import assert_one_home, scalar, wait_until

FAST_RETRY = RetryPolicy(base=0.05, cap=0.1)


def _running(conn: psycopg.Connection[Any], job_id: int) -> tuple[int, str | None, datetime | None]:
    """(attempts, lease_owner, lease_expires_at) of a job in queued_jobs."""
    found = conn.execute(
        "SELECT attempts, lease_owner, lease_expires_at FROM queued_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert found is not None, f"job {job_id} is not in queued_jobs"
    return found[0], found[1], found[2]


def test_delivered_job_stays_running_until_the_downstream_reports_success(
    make_app, dsn, conn, monkeypatch
):
    monkeypatch.setenv("PGJOBS_EXTERNAL_TOKEN", "from-the-environment")
    app: App = make_app()
    with downstream_service() as downstream:
        charge = app.external_task(
            "billing.charge",
            url=downstream.url,
            headers={"X-Tenant": "acme"},
            lease=120,
            queue="billing",
        )
        job_id = app.enqueue(charge, {"order": 42, "amount": "9.99"})
        history: list[Any] = []

        def scenario(worker: Worker) -> None:
            [body] = downstream.wait_for(1)
            attempts, owner, lease = _running(conn, job_id)
            assert (attempts, owner) == (1, worker.id), "the job stays leased to the worker"
            assert body == {
                "id": job_id,
                "task": "billing.charge",
                "payload": {"order": 42, "amount": "9.99"},
                "attempt": 1,
                "max_attempts": 5,
                "queue": "billing",
                "lease_expires_at": lease.isoformat() if lease else None,
                "report_url_path": f"/api/v1/jobs/{job_id}/outcome",
            }
            # The slot is free at once: the worker is not waiting for the report.
            wait_until(lambda: not worker.slots.busy, what="the slot to be free")
            history.append(
                admin.report_outcome(
                    dsn, job_id, attempt=1, status="succeeded", result={"charged": "9.99"}
                )
            )

        _, code = run_worker_while(app, scenario)
    assert code == 0
    [delivery] = downstream.received
    assert delivery.path == "/jobs"
    assert delivery.headers["Content-Type"] == "application/json"
    assert delivery.headers["X-Tenant"] == "acme"
    assert delivery.headers["Authorization"] == "Bearer from-the-environment"
    assert (delivery.headers["Pgjobs-Job-Id"], delivery.headers["Pgjobs-Attempt"]) == (
        str(job_id),
        "1",
    )
    [reported] = history
    assert reported.status is JobStatus.SUCCEEDED
    assert reported.result == {"charged": "9.99"}
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["status"], archived["attempts"], archived["result"]) == (
        "succeeded",
        1,
        {"charged": "9.99"},
    )


def test_retryable_failure_is_retried_and_delivered_again(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        app.external_task(
            "mail.send", url=downstream.url, lease=120, retry_base=0.05, retry_cap=0.1
        )
        job_id = app.enqueue("mail.send", {"to": "a@example.com"})

        def scenario(worker: Worker) -> None:
            downstream.wait_for(1)
            failed = admin.report_outcome(
                dsn,
                job_id,
                attempt=1,
                status="failed",
                error="SMTP 451: try later",
                retry=FAST_RETRY,
            )
            # Back in the queue; with so short a backoff it may already run again as attempt 2.
            assert (failed.table, failed.last_error) == ("queued_jobs", "SMTP 451: try later")
            assert failed.status is not JobStatus.RUNNING or failed.attempts == 2
            [first, second] = downstream.wait_for(2)
            assert (first["attempt"], second["attempt"]) == (1, 2)
            admin.report_outcome(dsn, job_id, attempt=2, status="succeeded")

        run_worker_while(app, scenario)
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["attempts"], archived["last_error"]) == (2, "SMTP 451: try later")


def test_non_retryable_failure_goes_to_dead_letter(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        app.external_task("billing.refund", url=downstream.url, lease=120)
        job_id = app.enqueue("billing.refund", {"order": 7})

        def scenario(worker: Worker) -> None:
            downstream.wait_for(1)
            dead = admin.report_outcome(
                dsn, job_id, attempt=1, status="failed", retryable=False, error="no such order"
            )
            assert dead.status is JobStatus.DEAD

        run_worker_while(app, scenario)
    assert len(downstream.received) == 1, "a dead job is not delivered again"
    assert assert_one_home(conn, [job_id]) == {job_id: "dead_letter"}
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert (dead["reason"], dead["last_error"], dead["attempts"]) == (
        "non_retryable",
        "no such order",
        1,
    )


def test_a_downstream_answering_non_2xx_fails_the_attempt(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        # Attempt 1 is refused with a 500, attempt 2 taken.
        downstream.answer = lambda body: (500 if body["attempt"] == 1 else 202, 0.0)
        app.external_task("sync.crm", url=downstream.url, lease=120, retry_base=0.05, retry_cap=0.1)
        job_id = app.enqueue("sync.crm", {"contact": 1})

        def scenario(worker: Worker) -> None:
            downstream.wait_for(2)
            wait_until(lambda: _running(conn, job_id)[1] is not None, what="attempt 2 leased")
            error = scalar(conn, "SELECT last_error FROM queued_jobs WHERE id = %s", [job_id])
            assert error.startswith("DeliveryFailed: delivery to ")
            assert "answered HTTP 500 Internal Server Error" in error
            assert "the downstream says no" in error, "the start of the answer's body is kept"
            admin.report_outcome(dsn, job_id, attempt=2, status="succeeded")

        run_worker_while(app, scenario)
    assert [body["attempt"] for body in downstream.bodies()] == [1, 2]
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}


def test_a_non_2xx_answer_on_the_last_attempt_is_dead_lettered(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        downstream.answer = lambda body: (409, 0.0)
        app.external_task("sync.erp", url=downstream.url, lease=120, max_attempts=1)
        job_id = app.enqueue("sync.erp", {})

        def scenario(worker: Worker) -> None:
            wait_until(lambda: row(conn, "dead_letter", job_id), what="the job dead-lettered")

        run_worker_while(app, scenario)
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "exhausted"
    assert dead["error_type"] == "pgjobs.external.DeliveryFailed"
    assert "answered HTTP 409 Conflict" in dead["last_error"]
    assert_one_home(conn, [job_id])


def test_a_downstream_that_does_not_answer_in_time_fails_the_attempt(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        downstream.answer = lambda body: (202, 5.0)  # answers long after the timeout
        app.external_task("slow.thing", url=downstream.url, timeout=1, lease=60, max_attempts=1)
        job_id = app.enqueue("slow.thing", {})

        def scenario(worker: Worker) -> None:
            wait_until(lambda: row(conn, "dead_letter", job_id), what="the job dead-lettered")

        run_worker_while(app, scenario)
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["last_error"] == (
        f"DeliveryFailed: delivery to {downstream.url} timed out after 1s"
    )


def test_an_unreachable_downstream_fails_the_attempt(make_app, dsn, conn):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app: App = make_app()
    app.external_task("gone.away", url=f"http://127.0.0.1:{port}/jobs", lease=60, max_attempts=1)
    job_id = app.enqueue("gone.away", {})

    def scenario(worker: Worker) -> None:
        wait_until(lambda: row(conn, "dead_letter", job_id), what="the job dead-lettered")

    run_worker_while(app, scenario)
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["last_error"] == (
        f"DeliveryFailed: delivery to http://127.0.0.1:{port}/jobs failed: connection refused"
    )


def test_a_stale_report_changes_nothing(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        app.external_task("report.build", url=downstream.url, lease=120)
        job_id = app.enqueue("report.build", {"month": "2030-01"})

        def scenario(worker: Worker) -> None:
            downstream.wait_for(1)
            admin.report_outcome(
                dsn, job_id, attempt=1, status="failed", error="disk full", retry=FAST_RETRY
            )
            downstream.wait_for(2)
            wait_until(lambda: _running(conn, job_id)[0] == 2, what="attempt 2 running")
            before = _running(conn, job_id)
            # Attempt 1 reports again (a retry of its request, or a late duplicate).
            for status in ("succeeded", "failed"):
                with pytest.raises(StaleOutcome, match="attempt 1"):
                    admin.report_outcome(dsn, job_id, attempt=1, status=status)
            assert _running(conn, job_id) == before, "the stale report changed the job"
            assert row(conn, "queued_jobs", job_id)["last_error"] == "disk full"  # type: ignore[index]
            admin.report_outcome(dsn, job_id, attempt=2, status="succeeded", result=[1, 2])
            with pytest.raises(StaleOutcome):
                admin.report_outcome(dsn, job_id, attempt=2, status="succeeded")

        run_worker_while(app, scenario)
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    assert row(conn, "archived_jobs", job_id)["result"] == [1, 2]  # type: ignore[index]


def test_no_report_before_the_lease_ends_delivers_the_job_again(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        app.external_task("video.encode", url=downstream.url, timeout=1, lease=2)
        job_id = app.enqueue("video.encode", {"video": 3})

        def report_attempt_2(body: dict[str, Any]) -> None:
            # Within the delivery, so well within attempt 2's short lease.
            if body["attempt"] == 2:
                admin.report_outcome(dsn, job_id, attempt=2, status="succeeded")

        downstream.before_answer = report_attempt_2

        def scenario(worker: Worker) -> None:
            # Nobody reports attempt 1: its lease ends, the rescuer frees the job, and it is
            # delivered again.
            [first, second] = downstream.wait_for(2, timeout=30)
            assert (first["attempt"], second["attempt"]) == (1, 2)
            wait_until(lambda: row(conn, "archived_jobs", job_id), what="attempt 2 archived")
            with pytest.raises(StaleOutcome):
                admin.report_outcome(dsn, job_id, attempt=1, status="succeeded")

        run_worker_while(app, scenario, maintenance=True, rescue_interval=0.2)
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert archived["attempts"] == 2
    assert archived["last_error"].startswith("lease of worker ")
    assert_one_home(conn, [job_id])


def test_an_at_most_once_job_whose_lease_ends_is_dead_lettered_not_delivered_again(
    make_app, dsn, conn
):
    app: App = make_app()
    with downstream_service() as downstream:
        app.external_task("card.capture", url=downstream.url, timeout=1, lease=2, at_most_once=True)
        job_id = app.enqueue("card.capture", {"card": "tok_1"})

        def scenario(worker: Worker) -> None:
            downstream.wait_for(1)
            wait_until(
                lambda: row(conn, "dead_letter", job_id), timeout=30, what="the job dead-lettered"
            )
            with pytest.raises(StaleOutcome):
                admin.report_outcome(dsn, job_id, attempt=1, status="succeeded")

        run_worker_while(app, scenario, maintenance=True, rescue_interval=0.2)
    assert len(downstream.received) == 1
    dead = row(conn, "dead_letter", job_id)
    assert dead is not None
    assert dead["reason"] == "lease_expired"
    assert "at-most-once" in dead["last_error"]
    assert_one_home(conn, [job_id])


def test_a_report_that_arrives_before_the_2xx_breaks_nothing(make_app, dsn, conn):
    app: App = make_app()
    with downstream_service() as downstream:
        # The downstream finishes the work and reports while the worker waits for its answer.
        def report_first(body: dict[str, Any]) -> None:
            admin.report_outcome(
                dsn, body["id"], attempt=body["attempt"], status="succeeded", result="done"
            )

        downstream.before_answer = report_first
        app.external_task("quick.thing", url=downstream.url, lease=60)
        ids = [app.enqueue("quick.thing", {"n": n}) for n in range(5)]

        def scenario(worker: Worker) -> None:
            wait_until(
                lambda: scalar(conn, "SELECT count(*) FROM archived_jobs") == len(ids),
                what="every job archived",
            )
            wait_until(lambda: not worker.slots.busy, what="every slot free")

        run_worker_while(app, scenario)
    assert len(downstream.received) == len(ids)
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}
    results = conn.execute("SELECT DISTINCT result, attempts FROM archived_jobs").fetchall()
    assert results == [("done", 1)]


def test_the_workers_url_and_headers_serve_tasks_that_set_none(make_app, dsn, conn, monkeypatch):
    monkeypatch.setenv("PGJOBS_EXTERNAL_TOKEN", "env-token")
    app: App = make_app()
    with downstream_service() as downstream:
        app.external_task("plain", lease=60)  # no URL: the worker's
        app.external_task(
            "own",
            lease=60,
            headers={"authorization": "Bearer task-token", "User-Agent": "billing-client/2"},
        )
        job_ids = [app.enqueue("plain", {}), app.enqueue("own", {})]
        defaults = ExternalTarget(
            url=downstream.url,
            headers=(("X-Region", "eu"), ("Authorization", "Bearer worker-token")),
        )

        def scenario(worker: Worker) -> None:
            downstream.wait_for(2)

        run_worker_while(app, scenario, external=defaults)
    by_task = {d.body["task"]: d.headers for d in downstream.received}
    assert by_task["plain"]["Authorization"] == "Bearer worker-token", "the worker's beats $TOKEN"
    assert by_task["own"]["authorization"] == "Bearer task-token", "the task's beats the worker's"
    assert "Bearer worker-token" not in by_task["own"].values()
    assert by_task["plain"]["X-Region"] == by_task["own"]["X-Region"] == "eu"
    user_agents = {
        d.body["task"]: [v for k, v in d.lines if k.lower() == "user-agent"]
        for d in downstream.received
    }
    assert user_agents == {"plain": ["pgjobs"], "own": ["billing-client/2"]}
    assert_one_home(conn, job_ids)


def test_a_worker_refuses_an_external_task_without_a_url(make_app):
    app: App = make_app()
    app.external_task("nowhere", queue="q")
    with pytest.raises(ConfigurationError, match="external task 'nowhere' has no URL"):
        Worker(app, WorkerConfig())
    # A worker of other queues does not deliver it, so it needs no URL.
    app.external_task("elsewhere", url="http://127.0.0.1:1/", queue="other")
    Worker(app, WorkerConfig(queues=["other"]))
    with pytest.raises(ConfigurationError, match="shorter than the lease"):
        Worker(app, WorkerConfig(external=ExternalTarget(url="http://x/", timeout=400)))


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"url": "ftp://files.internal/"}, "http:// or https://"),
        ({"url": "https://user:secret@billing.internal/"}, "user or password"),
        ({"url": "billing.internal/jobs"}, "http:// or https://"),
        ({"url": "http://billing.internal/a b"}, "without spaces"),
        ({"url": "http://billing.internal:0/"}, "port 0"),
        ({"url": "http://h/", "timeout": 0}, "timeout must be"),
        ({"url": "http://h/", "timeout": 30, "lease": 30}, "shorter than the lease"),
        ({"url": "http://h/", "headers": {"X Bad": "v"}}, "not an HTTP header name"),
        ({"url": "http://h/", "headers": {"X-Ok": "a\r\nX-Evil: 1"}}, "no line breaks"),
        ({"url": "http://h/", "headers": {"Content-Length": "1"}}, "sets the Content-Length"),
        ({"url": "http://h/", "headers": {"pgjobs-attempt": "9"}}, "sets the pgjobs-attempt"),
    ],
)
def test_bad_declarations_are_refused_in_one_line(options, words):
    app = App("postgresql://nobody@127.0.0.1:1/never")
    with pytest.raises(ConfigurationError) as refused:
        app.external_task("t", **options)
    message = str(refused.value)
    assert words in message and "\n" not in message
    assert "secret" not in message and "Evil" not in message, "a secret was shown"
    assert app.tasks == {}


@pytest.fixture
def certificate(tmp_path: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (key and certificate in one PEM file)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    pem = tmp_path / "downstream.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(pem), "-out", str(pem)],
        check=True, capture_output=True,
    )  # fmt: skip
    return pem


def test_https_deliveries_verify_the_downstreams_certificate(
    make_app, dsn, conn, certificate, monkeypatch
):
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(certificate)
    app: App = make_app()
    with downstream_service(tls=server_side) as downstream:
        assert downstream.url.startswith("https://")
        app.external_task("tls.untrusted", url=downstream.url, lease=60, max_attempts=1)
        app.external_task("tls.trusted", url=downstream.url, lease=60)
        untrusted = app.enqueue("tls.untrusted", {})

        def refused(worker: Worker) -> None:
            wait_until(lambda: row(conn, "dead_letter", untrusted), what="dead-lettered")

        external._tls_context.cache_clear()
        run_worker_while(app, refused)
        dead = row(conn, "dead_letter", untrusted)
        assert dead is not None
        assert "TLS failed: certificate not trusted" in dead["last_error"], dead["last_error"]
        assert downstream.received == []

        # Trusted through $SSL_CERT_FILE, as OpenSSL reads it.
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate))
        external._tls_context.cache_clear()
        trusted = app.enqueue("tls.trusted", {"n": 1})

        def delivered(worker: Worker) -> None:
            [body] = downstream.wait_for(1)
            assert body["id"] == trusted
            admin.report_outcome(dsn, trusted, attempt=1, status="succeeded")

        try:
            run_worker_while(app, delivered)
        finally:
            external._tls_context.cache_clear()
    assert assert_one_home(conn, [untrusted, trusted]) == {
        untrusted: "dead_letter",
        trusted: "archived_jobs",
    }
