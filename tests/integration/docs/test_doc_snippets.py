"""The manual's runnable snippets (docs/snippets/*.py) run as the pages show them: the pages
include these files, so a snippet that stops working fails here, not in a reader's hands. The
SQL cookbook and the Alembic recipes are run by test_admin_cookbook.py, test_migrations.py and
tests/acceptance/test_wheel.py."""

from __future__ import annotations

import runpy
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import pgjobs
from pgjobs.db.dsn import Dsn
from pgjobs.testing import drain
from tests.support.helpers import REPO, pgjobs_env

SNIPPETS = REPO / "docs" / "snippets"


@pytest.fixture
def snippet(monkeypatch: pytest.MonkeyPatch, dsn: Dsn) -> Iterator[Any]:
    """Run a snippet file as a module (not as __main__) with the test database as its DSN; its
    App is closed after the test."""
    apps: list[pgjobs.App] = []

    def run(name: str) -> dict[str, Any]:
        monkeypatch.setenv("PGJOBS_DATABASE_URL", dsn.url)
        monkeypatch.delenv("DATABASE_URL", raising=False)
        found = runpy.run_path(str(SNIPPETS / name))
        apps.append(found["app"])
        return found

    yield run
    for app in apps:
        app.close()


def test_the_quickstart_commands_enqueue_and_work_its_jobs(dsn: Dsn, conn):
    env = pgjobs_env(dsn.url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=SNIPPETS,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    enqueued = run("quickstart.py")
    assert enqueued.stdout.startswith("enqueued job ")
    # The app as the snippet's pyproject.toml names it: no --app.
    worked = run("-m", "pgjobs", "work", "--burst", "--log-level", "error")
    assert "welcome e-mail to user 42 (default)" in worked.stdout
    rows = conn.execute("SELECT task, status, result FROM archived_jobs ORDER BY id").fetchall()
    assert rows == [
        ("emails.welcome", "succeeded", None),
        ("images.resize", "succeeded", {"width": 640}),
    ]


def test_the_readme_quickstart_is_the_tested_snippet():
    """The README shows docs/snippets/quickstart.py and the pyproject.toml beside it as they are
    (GitHub cannot include files)."""
    readme = (REPO / "README.md").read_text()
    assert (SNIPPETS / "quickstart.py").read_text() in readme
    assert "```toml\n" + (SNIPPETS / "pyproject.toml").read_text() + "```" in readme


def test_typed_payloads_are_checked_at_enqueue_and_a_model_parameter_gets_its_instance(snippet):
    found = snippet("typed_payloads.py")
    app = found["app"]
    app.enqueue("billing.refund", {"order_id": 42, "amount": 9.5, "reason": "late"})
    with pytest.raises(pgjobs.InvalidPayload) as refused:
        app.enqueue("billing.refund", {"order_id": 42, "amount": "9.50", "reason": "late"})
    assert refused.value.field == "payload.amount"
    assert "expected float, got str" in str(refused.value)
    first = app.enqueue(found["book"], found["Shipment"](order_id=1, carrier="dhl", weight_kg=2.5))
    second = app.enqueue("shipping.book", {"order_id": 2, "carrier": "ups"})
    result = drain(app)
    assert result.dead == []
    assert (result.results[first], result.results[second]) == ("dhl", "ups")


def test_an_old_payload_is_upgraded_step_by_step(snippet, dsn: Dsn):
    app = snippet("payload_versions.py")["app"]
    with pgjobs.App(dsn.url, check_task_names=False) as old_producer:  # enqueues version 1
        job_id = old_producer.enqueue("billing.charge", {"order": 7, "amount": 9.99})
    assert drain(app).results == {job_id: "7: 999 EUR"}


def test_the_fairness_tasks_take_groups_and_unique_keys_as_the_guide_shows(snippet, conn):
    """docs/guides/fairness.md: a job keeps its group; a second enqueue of a unique key keeps,
    replaces or debounces the waiting job (same id, one job); bad input writes nothing."""
    app = snippet("fairness.py")["app"]
    grouped = app.enqueue("reports.build", {"report": 7}, group="customer-42")
    first = app.enqueue("search.reindex", {"item": 7}, unique_key="item-7")
    assert app.enqueue("search.reindex", {"item": 8}, unique_key="item-7") == first
    replaced = app.enqueue(
        "search.reindex", {"item": 9}, unique_key="item-7", on_conflict="replace"
    )
    assert replaced == first
    rows = conn.execute("SELECT id, group_key, unique_key, payload FROM queued_jobs ORDER BY id")
    assert rows.fetchall() == [
        (grouped, "customer-42", None, {"report": 7}),
        (first, None, "item-7", {"item": 9}),
    ]
    # The task's debounce (5 s) moves the waiting job's run time past the latest enqueue.
    assert (
        app.enqueue("search.reindex", {"item": 10}, unique_key="item-7", on_conflict="debounce")
        == first
    )
    waits = conn.execute(
        "SELECT extract(epoch FROM run_at - now()), payload FROM queued_jobs WHERE id = %s",
        (first,),
    ).fetchone()
    assert waits is not None and 4 < waits[0] <= 5 and waits[1] == {"item": 10}
    for bad in ("", "x" * 513, "a\x00b"):
        with pytest.raises(pgjobs.ConfigurationError):
            app.enqueue("reports.build", {"report": 8}, group=bad)
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (2,)
    with pytest.raises(pgjobs.ConfigurationError, match="ordered"):
        app.task(name="ledger.other", ordered=True, group_concurrency=2)(lambda entry: None)


def test_every_snippet_include_is_one_pymdownx_reads():
    """``--8<-- "file"`` inside a Python fence is rewritten by ruff format as Python
    (``--8 < --"file"``), which pymdownx.snippets does not read: the page then shows that line
    instead of the file. Such fences sit between ``<!-- fmt: off -->`` and ``<!-- fmt: on -->``."""
    mangled = [
        f"{page.relative_to(REPO)}:{number}"
        for page in (REPO / "docs").rglob("*.md")
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if line.startswith("--8 <")
    ]
    assert mangled == []


def test_the_workflows_guide_chains_fans_in_and_waits_as_it_shows(snippet, conn):
    """docs/guides/workflows.md: a chain runs in order, a graph enqueued in one call waits for
    all its parts, a batch's callback sees the counts, and app.wait returns the results."""
    found = snippet("workflows.py")
    app = found["app"]
    load = found["chain"]("2026-11-26")
    assert conn.execute(
        "SELECT run_at = 'infinity' FROM queued_jobs WHERE id = %s", (load,)
    ).fetchone() == (True,)
    *extracts, weekly = found["week"](["2026-11-24", "2026-11-25"])
    batch_id = found["report"](7, 3)
    with pytest.raises(pgjobs.WaitTimeout):
        app.wait(load, timeout=0)
    result = drain(app)
    assert result.dead == []
    assert app.wait(load, timeout=0) == "loaded 2026-11-26"
    assert app.wait(weekly, timeout=0) == "loaded 2026-11-25"
    assert [app.wait(job, timeout=0) for job in extracts] == [10, 10]
    status = app.batch_status(batch_id)
    assert (status.total, status.succeeded, status.pending) == (3, 3, 0)
    assert status.callback_job_id is not None
    assert app.wait(status.callback_job_id, timeout=0) == "report 7: 3 of 3 pages"
    # The graph's load ran after both extracts: its start follows their ends.
    (after_parts,) = conn.execute(
        "SELECT bool_and(p.finished_at <= w.started_at) FROM archived_jobs p, archived_jobs w "
        "WHERE p.id = ANY(%s) AND w.id = %s",
        (extracts, weekly),
    ).fetchone()
    assert after_parts is True
    # A dependency that dies takes its dependents with it, unrun.
    check = app.enqueue("etl.check", {"day": "2026-11-27"})
    doomed = app.enqueue("etl.load", {"day": "2026-11-27"}, after=[check])
    drain(app)
    with pytest.raises(pgjobs.JobFailed, match="dependency_failed") as failed:
        app.wait(doomed, timeout=0)
    assert failed.value.last_error == f"dependency {check} ended dead"


#: A burst worker with OpenTelemetry metrics, quiet but for what the handler and exporter print.
WORK_OTEL = ("--burst", "--otel-metrics", "--log-level=error")


def test_the_otel_metrics_snippet_exports_a_worker_s_outcomes(dsn: Dsn, conn):
    """`pgjobs work --otel-metrics` with the snippet's app: the SDK it sets up exports the
    worker's instruments (here to stdout, at exit)."""
    conn.execute(
        "INSERT INTO queued_jobs (queue, task, payload) VALUES ('billing', 'billing.invoice', "
        """'{"order_id": 7}')"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "pgjobs", "work", "--app=otel_metrics:app", *WORK_OTEL],
        cwd=SNIPPETS,
        env=pgjobs_env(dsn.url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "invoice for order 7" in done.stdout
    exported = done.stdout[done.stdout.index("{") :]
    assert '"name": "pgjobs.job.outcomes"' in exported
    assert '"outcome": "succeeded"' in exported
    assert '"name": "pgjobs.job.duration"' in exported


def test_the_mounted_dashboard_snippet_serves_the_sites_users_by_role(snippet, conn):
    """docs/operations/dashboard.md: the site's read user looks, its operator acts (recorded
    under its name), nobody is sent to the site's sign-in; all under /jobs."""
    from tests.web.conftest import TestClient
    from tests.web.dashboard.conftest import csrf_of

    found = snippet("mounted_dashboard.py")
    (mounted,) = (route for route in found["site"].routes if getattr(route, "path", "") == "/jobs")
    job = found["app"].enqueue("emails.send", {"to": "a@example.com"}, queue="mail")
    try:
        with TestClient(found["site"]) as client:
            page = client.get("/jobs/queues/mail", follow_redirects=False)
            assert page.headers["location"] == "/login?next=%2Fjobs%2Fqueues%2Fmail"
            client.cookies.set("demo_user", "bob")
            assert client.get(f"/jobs/api/v1/jobs/{job}").json()["id"] == job
            assert client.post(f"/jobs/api/v1/jobs/{job}/cancel").status_code == 403
            client.cookies.set("demo_user", "alice")
            page = client.get("/jobs/queues/mail")
            done = client.post("/jobs/queues/mail/pause", data={"csrf": csrf_of(page.text)})
            assert done.status_code == 200, done.text
            assert client.post(f"/jobs/api/v1/jobs/{job}/cancel").status_code == 200
    finally:
        mounted.app.state.pgjobs.close()
    row = conn.execute("SELECT paused_by FROM pgjobs_queues WHERE name = 'mail'").fetchone()
    assert row == ("alice",)
