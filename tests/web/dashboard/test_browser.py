"""The dashboard in a real browser: Chromium from the OS packages, driven by Playwright, against
`pgjobs serve`'s app on a real uvicorn server and the test database.

Signing in through the form; the overview showing the numbers the tables hold, and refreshing
them without a reload; a dead group redriven from the browser; a bulk purge of exactly a filtered
set; cancel and replay from a job page, and a tampered form refused; a payload holding
``<script>`` shown as text with no dialog; a bulk purge of several batches followed on its
progress page until it ends, in place with the script and by reloads without it. Screenshots of
the overview, the dead letters and a job page are saved under $PGJOBS_SCREENSHOTS (else the test
run's temporary folder) and, with PGJOBS_UPDATE_SCREENSHOTS=1, to docs/screenshots/ for the
manual's Dashboard page.

One browser and one server for the module; each test has its own browser context (cookies).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs import App
from pgjobs.db.dsn import Dsn
from pgjobs.web.dashboard.frame import REFRESH_SECONDS
from pgjobs.web.dashboard.pages import dead as dead_pages
from tests.support.admin_factories import bury
from tests.support.factories import claim
from tests.support.helpers import REPO, assert_one_home, scalar, wait_until
from tests.web.conftest import TOKEN
from tests.web.dashboard.conftest import DeadTriggers, ids, status_of

CHROMIUM = Path("/usr/bin/chromium")

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]


def _need_browser() -> None:
    """Skip without Chromium or Playwright, saying why; but fail under CI, which has both."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if sync_playwright is None:
        missing.append("Playwright for Python (pip install playwright; no browser download)")
    if not missing:
        return
    reason = "browser tests need " + " and ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide them")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(database: Dsn) -> Iterator[str]:
    """`pgjobs serve`'s app on a real uvicorn server in a thread, on a free port: its URL."""
    _need_browser()
    import uvicorn

    from pgjobs.web import create_app

    app = create_app(dsn=database, tokens=[TOKEN], pool_size=2)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=_free_port(), log_level="warning", ws="none", lifespan="on"
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, name="dashboard-server", daemon=True)
    thread.start()
    wait_until(lambda: uv.started, timeout=20, what="uvicorn started")
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        uv.should_exit = True
        thread.join(20)


@pytest.fixture(scope="module")
def browser(server: str) -> Iterator[Browser]:
    assert sync_playwright is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox"] if os.geteuid() == 0 else [],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser, server: str, dsn: Dsn) -> Iterator[Page]:
    """A fresh browser context (no cookie) on an emptied database; every dialog is recorded
    (and dismissed) in ``page.dialogs``."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=server)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", on_dialog)
    tab.dialogs = dialogs  # type: ignore[attr-defined]
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Save a full-page screenshot ``NAME.png``; with PGJOBS_UPDATE_SCREENSHOTS=1 also as the
    manual's docs/screenshots/NAME.png (docs/operations/dashboard.md shows them)."""
    folder = Path(os.environ.get("PGJOBS_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)

    def save(tab: Page, name: str, *, full_page: bool = True) -> Path:
        path = folder / f"{name}.png"
        tab.screenshot(path=str(path), full_page=full_page)
        if os.environ.get("PGJOBS_UPDATE_SCREENSHOTS") == "1":
            docs = REPO / "docs" / "screenshots"
            docs.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, docs / f"{name}.png")
        return path

    return save


def sign_in(tab: Page, path: str = "/") -> None:
    tab.goto(path)
    assert "/login" in tab.url  # every page asks for a login first
    tab.get_by_label("API token").fill(TOKEN)
    tab.get_by_role("button", name="Sign in").click()
    tab.wait_for_url(lambda url: "/login" not in url)


def _seed(conn: psycopg.Connection[Any], app: App) -> dict[str, Any]:
    """A day's worth of a small system: queues with ready and scheduled jobs, an hour of
    finished and dead-lettered jobs, two live workers running jobs, and one gone."""
    for queue, task, ready in (
        ("emails", "emails.send", 37),
        ("billing", "billing.charge", 4),
        ("reports", "reports.nightly", 2),
    ):
        for n in range(ready):
            app.enqueue(task, {"n": n}, queue=queue)
    app.enqueue("reports.nightly", {"day": "2026-11-24"}, queue="reports", run_in=6 * 3600)
    conn.execute(
        """
        INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts,
                                   max_attempts, status, worker, created_at, started_at,
                                   finished_at)
        SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id')), q, t, '{}', 0, at, a, 5,
               'succeeded', 'web-1:812:7f3a', at, at, at
        FROM generate_series(1, 900) g,
             LATERAL (SELECT (ARRAY['emails', 'emails', 'billing', 'reports'])[1 + g % 4] AS q,
                             (ARRAY['emails.send', 'emails.send', 'billing.charge',
                                    'reports.nightly'])[1 + g % 4] AS t,
                             1 + (g % 11 = 0)::int AS a,
                             now() - (3590 * (g / 900.0) ^ 1.3) * interval '1 second' AS at) x
        """
    )
    conn.execute(
        "INSERT INTO pgjobs_workers (id, host, pid, queues, concurrency) VALUES "
        "('web-1:812:7f3a', 'web-1', 812, ARRAY['emails', 'reports'], 8), "
        "('web-2:907:1c9e', 'web-2', 907, ARRAY['billing'], 4)"
    )
    claim(conn, owner="web-1:812:7f3a", queues=["emails"], limit=3)
    claim(conn, owner="web-2:907:1c9e", queues=["billing"], limit=1)
    claim(conn, owner="web-3:555:dead", queues=["reports"], limit=1)  # a worker that is gone
    timeouts = bury(
        conn,
        23,
        task="billing.charge",
        queue="billing",
        error=lambda n: (
            f"TimeoutError: gateway did not answer in {5 + n % 3}.0s (charge ch_{n:06d})"
        ),
        error_type="builtins.TimeoutError",
    )
    declined = bury(
        conn,
        6,
        task="billing.charge",
        queue="billing",
        error=lambda n: f"CardDeclined: card ending {4242 + n} was declined by the issuer",
        error_type="billing.CardDeclined",
    )
    bounced = bury(
        conn,
        9,
        task="emails.send",
        queue="emails",
        error=lambda n: f"SMTPRecipientsRefused: 550 mailbox user{n}@example.org unavailable",
        error_type="smtplib.SMTPRecipientsRefused",
    )
    conn.execute(
        "UPDATE dead_letter SET failed_at = now() - (id % 57) * interval '1 minute', "
        "worker = 'web-2:907:1c9e', "
        "payload = jsonb_build_object('order_id', 7000 + id, 'amount_cents', 1999, "
        "'currency', 'EUR', 'customer', jsonb_build_object('id', 'cus_' || id))"
    )
    conn.execute(
        "UPDATE dead_letter SET created_at = failed_at - interval '4 minutes', "
        "run_at = failed_at - interval '4 minutes', started_at = failed_at - interval '5 seconds'"
    )
    conn.execute("ANALYZE queued_jobs, archived_jobs, dead_letter")
    return {"timeouts": timeouts, "declined": declined, "bounced": bounced}


def _queue_cell(tab: Page, queue: str, column: str) -> str:
    return tab.locator(f'#queues tr[data-queue="{queue}"] td[data-col="{column}"]').inner_text()


def test_sign_in_and_the_overview_shows_what_the_tables_hold(
    page: Page,
    conn: psycopg.Connection[Any],
    make_app: Callable[..., App],
    screenshots: Callable[..., Path],
) -> None:
    app = make_app()
    _seed(conn, app)
    sign_in(page)
    assert page.get_by_role("heading", name="Overview").is_visible()
    for queue in ("emails", "billing", "reports"):
        expected = conn.execute(
            "SELECT count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at <= now()), "
            "count(*) FILTER (WHERE lease_expires_at IS NULL AND run_at > now()), "
            "count(*) FILTER (WHERE lease_expires_at IS NOT NULL), "
            "(SELECT count(*) FROM dead_letter WHERE queue = %(q)s) "
            "FROM queued_jobs WHERE queue = %(q)s",
            {"q": queue},
        ).fetchone()
        shown = tuple(
            int(_queue_cell(page, queue, c).replace(",", ""))
            for c in ("ready", "scheduled", "running", "dead")
        )
        assert shown == expected, queue
    finished = scalar(
        conn,
        "SELECT count(*) FROM archived_jobs WHERE queue = 'emails' AND finished_at > now() - interval '1 hour'",
    )
    assert _queue_cell(page, "emails", "finished") == f"{finished:,}"
    assert page.locator("#workers").get_by_text("web-1:812:7f3a").is_visible()
    assert "1 running job" in page.locator("#orphaned").inner_text()
    assert page.locator("svg.chart rect.bar-ok").count() > 30
    screenshots(page, "overview")
    # The live part refreshes in place: new jobs show up without a reload.
    page.evaluate("window.notReloaded = true")
    for n in range(5):
        app.enqueue("billing.charge", {"n": 100 + n}, queue="billing")
    ready = int(
        scalar(
            conn,
            "SELECT count(*) FROM queued_jobs WHERE queue = 'billing' AND lease_expires_at IS NULL",
        )
    )
    page.wait_for_function(
        'expected => document.querySelector(\'#queues tr[data-queue="billing"] td[data-col="ready"]\').textContent.trim() === expected',
        arg=str(ready),
        timeout=20_000,
    )
    assert page.evaluate("window.notReloaded") is True
    # Hidden, the tab stops asking (for longer than the refresh interval); shown again, it asks
    # at once.
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    assert "Paused" in page.locator("#refresh-status").inner_text()
    page.wait_for_timeout((REFRESH_SECONDS + 2) * 1000)
    assert not [url for url in asked if "/partials/overview" in url]
    with page.expect_request("**/partials/overview"):
        page.evaluate(
            "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
            "document.dispatchEvent(new Event('visibilitychange'))"
        )
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_a_dead_group_redriven_from_the_browser_is_queued_again(
    page: Page,
    conn: psycopg.Connection[Any],
    make_app: Callable[..., App],
    screenshots: Callable[..., Path],
) -> None:
    seeded = _seed(conn, make_app())
    sign_in(page, "/dead")
    assert page.url.endswith("/dead")
    screenshots(page, "dead", full_page=False)
    row = page.locator('#groups tr[data-task="billing.charge"]').filter(
        has_text="gateway did not answer"
    )
    assert row.locator("td.num").inner_text() == "23"
    row.get_by_role("button", name="Redrive group").click()
    page.wait_for_url("**/dead*")
    assert "Redrove 23 of 23 dead jobs" in page.locator(".flash").inner_text()
    timeouts = set(seeded["timeouts"])
    assert not timeouts & ids(conn, "dead_letter")
    assert timeouts <= ids(conn, "queued_jobs")
    assert set(seeded["declined"] + seeded["bounced"]) <= ids(conn, "dead_letter")


def test_bulk_purge_of_a_filtered_set_purges_exactly_that_set(
    page: Page, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    seeded = _seed(conn, make_app())
    sign_in(page, "/dead")
    page.get_by_label("Task").fill("billing.charge")
    page.get_by_label("Error contains").fill("declined")
    page.get_by_role("button", name="Filter").click()
    assert "6 dead jobs match" in page.locator("#matching").inner_text()
    page.get_by_role("link", name="Purge all matching…").click()
    assert page.locator("#confirm-count").get_attribute("data-count") == "6"
    page.get_by_role("button", name="Purge 6 dead jobs").click()
    assert "Purged 6 of 6 dead jobs" in page.locator(".flash").inner_text()
    assert not set(seeded["declined"]) & ids(conn, "dead_letter")
    assert ids(conn, "dead_letter") == set(seeded["timeouts"] + seeded["bounced"])


def test_cancel_and_replay_from_a_job_page(
    page: Page,
    conn: psycopg.Connection[Any],
    make_app: Callable[..., App],
    screenshots: Callable[..., Path],
) -> None:
    app = make_app()
    seeded = _seed(conn, app)
    job_id = app.enqueue(
        "emails.send", {"to": "ada@example.org", "template": "welcome"}, queue="emails"
    )
    sign_in(page, f"/jobs/{job_id}")
    # A form whose CSRF token was tampered with is refused, and nothing changes.
    page.evaluate(
        "document.querySelectorAll('input[name=csrf]').forEach(i => i.value = 'f'.repeat(64))"
    )
    page.get_by_role("button", name="Cancel").click()
    assert "nothing was changed" in page.locator("main").inner_text()
    assert status_of(conn, job_id) == "queued"
    page.goto(f"/jobs/{job_id}")
    page.get_by_role("button", name="Cancel").click()
    assert f"Job {job_id} cancelled" in page.locator(".flash").inner_text()
    assert status_of(conn, job_id) == "cancelled"
    page.get_by_role("button", name="Replay as a new job").click()
    assert "replayed as job" in page.locator(".flash").inner_text()
    new_id = int(page.url.rsplit("/", 1)[1])
    assert scalar(conn, "SELECT replay_of FROM queued_jobs WHERE id = %s", [new_id]) == job_id
    assert_one_home(
        conn, [*ids(conn, "queued_jobs"), *ids(conn, "archived_jobs"), *ids(conn, "dead_letter")]
    )
    # The manual's job page: a dead charge, its payload, error and traceback.
    dead_id = seeded["timeouts"][0]
    conn.execute(
        "UPDATE dead_letter SET traceback = %s WHERE id = %s",
        [
            "Traceback (most recent call last):\n"
            '  File "/srv/app/pgjobs/worker.py", line 412, in _run\n'
            "    result = handler(**job.payload)\n"
            '  File "/srv/app/billing/tasks.py", line 57, in charge\n'
            "    receipt = gateway.charge(order_id, amount_cents, currency)\n"
            '  File "/srv/app/billing/gateway.py", line 88, in charge\n'
            '    raise TimeoutError(f"gateway did not answer in {timeout}s (charge {charge_id})")\n'
            "TimeoutError: gateway did not answer in 5.0s (charge ch_000000)",
            dead_id,
        ],
    )
    page.goto(f"/jobs/{dead_id}")
    assert page.get_by_role("button", name="Redrive").is_visible()
    screenshots(page, "job")
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_a_queued_job_edited_from_its_page(
    page: Page, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    job_id = make_app().enqueue("emails.send", {"to": "ada@example.org"}, queue="emails")
    sign_in(page, f"/jobs/{job_id}")
    page.get_by_label("Priority").fill("7")
    page.get_by_label("Tags").fill("customer:42, urgent")
    page.get_by_role("button", name="Save changes").click()
    assert f"Job {job_id} edited: priority, tags changed." in page.locator(".flash").inner_text()
    assert scalar(conn, "SELECT priority FROM queued_jobs WHERE id = %s", [job_id]) == 7
    history = page.locator("#edits").inner_text()
    assert "priority" in history and "customer:42" in history
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_a_payload_holding_script_is_shown_as_text(
    page: Page, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    hostile = "<script>alert('payload')</script><img src=x onerror=\"alert('img')\">"
    app = make_app()
    job_id = app.enqueue("emails.<script>alert('task')</script>", {"html": hostile}, queue="q")
    (dead_id,) = bury(conn, 1, task="t<script>alert(1)</script>", error=lambda _: hostile)
    sign_in(page, f"/jobs/{job_id}")
    assert "<script>alert('payload')</script>" in page.locator("#payload").inner_text()
    # Every page that shows the hostile names and errors (a dialog would be recorded).
    for path in (f"/jobs/{dead_id}", "/dead", "/", "/jobs", "/queues/q"):
        page.goto(path)
        page.wait_for_load_state("load")
    page.goto(f"/jobs/{dead_id}")
    assert hostile in page.locator("#last-error").inner_text()
    assert page.locator("img[src=x]").count() == 0
    time.sleep(0.5)  # an onerror handler would have fired by now
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_a_large_bulk_purge_shows_its_progress_until_it_ends_without_a_reload(
    page: Page,
    browser: Browser,
    server: str,
    conn: psycopg.Connection[Any],
    dead_triggers: DeadTriggers,
    monkeypatch: pytest.MonkeyPatch,
    screenshots: Callable[..., Path],
) -> None:
    monkeypatch.setattr(dead_pages, "BATCH_SIZE", 1000)
    doomed = bury(conn, 2500, task="reports.nightly", queue="reports")
    kept = bury(conn, 3, task="emails.send", queue="emails")
    dead_triggers.hold_at(doomed[1500])  # the second batch waits until released
    sign_in(page, "/dead")
    page.get_by_label("Task").fill("reports.nightly")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name="Purge all matching…").click()
    page.get_by_role("button", name="Purge 2,500 dead jobs").click()
    page.wait_for_url("**/dead/actions/*")
    page.locator('#action-state[data-batches-done="1"]').wait_for()
    assert "1 of 3 batches done" in page.locator("#action-counts").inner_text()
    assert "1,000 of 2,500 jobs purged" in page.locator("#action-counts").inner_text()
    screenshots(page, "progress", full_page=False)
    page.evaluate("window.notReloaded = true")
    # While it runs, the script asks for the live part (the page's own reload, for browsers
    # without the script, would have fired within 2 seconds).
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.wait_for_timeout(3000)
    assert [url for url in asked if "/partials/actions/" in url]
    assert page.evaluate("window.notReloaded") is True
    dead_triggers.release()
    page.locator('#action-state[data-state="finished"]').wait_for(timeout=30_000)
    assert (
        "Purged 2,500 of 2,500 dead jobs in 3 batches"
        in page.locator("#action-status").inner_text()
    )
    assert page.evaluate("window.notReloaded") is True  # followed by the script, in place
    assert ids(conn, "dead_letter") == set(kept)
    # Without JavaScript the page reloads itself (a meta refresh the CSP lets through) until
    # the action has ended.
    more = bury(conn, 1500, task="reports.nightly", queue="reports")
    dead_triggers.hold_at(more[1200])
    context = browser.new_context(base_url=server, java_script_enabled=False)
    try:
        tab = context.new_page()
        sign_in(tab, "/dead/confirm?action=purge&task=reports.nightly")
        tab.get_by_role("button", name="Purge 1,500 dead jobs").click()
        tab.wait_for_url("**/dead/actions/*")
        tab.locator('#action-state[data-batches-done="1"]').wait_for(timeout=30_000)
        dead_triggers.release()
        tab.locator('#action-state[data-state="finished"]').wait_for(timeout=30_000)
        assert "Purged 1,500 of 1,500" in tab.locator("#action-status").inner_text()
    finally:
        context.close()
    assert ids(conn, "dead_letter") == set(kept)
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_the_api_docs_render_without_the_internet(
    browser: Browser, server: str, screenshots: Callable[..., Path]
) -> None:
    """/api/v1/docs asks for nothing beyond the server: every other request is refused, as on a
    machine without internet, and the page still shows the API's routes."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, base_url=server)
    context.set_default_timeout(15_000)
    elsewhere: list[str] = []

    def only_the_server(route: Any) -> None:
        if route.request.url.startswith(server + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_server)
    try:
        tab = context.new_page()
        tab.goto("/api/v1/docs")
        tab.locator(".swagger-ui .info .title").filter(has_text="pgjobs").wait_for()
        tab.get_by_text("Enqueue a job", exact=True).first.wait_for()
        screenshots(tab, "api-docs", full_page=False)
        assert elsewhere == []
    finally:
        context.close()


def test_a_schedule_paused_and_resumed_and_a_tag_followed_from_the_browser(
    page: Page, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    conn.execute("TRUNCATE pgjobs_schedules")
    conn.execute(
        "INSERT INTO pgjobs_schedules (name, task, queue, schedule, timezone, catch_up, "
        "next_run_at, declared_at) VALUES ('reports.hourly', 'reports.build', 'reports', "
        "'0 * * * *', 'UTC', 'last', now() + interval '20 minutes', now())"
    )
    try:
        sign_in(page, "/schedules")
        row = page.locator('#schedules tr[data-schedule="reports.hourly"]')
        assert "active" in row.inner_text()
        row.get_by_label("Reason").fill("warehouse migration")
        row.get_by_role("button", name="Pause").click()
        assert "Schedule reports.hourly paused" in page.locator(".flash").inner_text()
        assert "warehouse migration" in row.locator(".state").inner_text()
        paused = "SELECT paused_at IS NOT NULL FROM pgjobs_schedules WHERE name = 'reports.hourly'"
        assert scalar(conn, paused) is True
        row.get_by_role("button", name="Resume").click()
        assert "Schedule reports.hourly resumed" in page.locator(".flash").inner_text()
        assert scalar(conn, paused) is False
        assert "active" in row.locator(".state").inner_text()
    finally:
        conn.execute("TRUNCATE pgjobs_schedules")

    app = make_app(check_task_names=False)
    tagged = app.enqueue("imports.row", {}, tags=["import:7"])
    app.enqueue("imports.row", {}, tags=["import:8"])
    page.goto(f"/jobs/{tagged}")
    page.locator("#job-tags").get_by_role("link", name="import:7").click()
    page.wait_for_url(lambda url: "tag=import" in url)
    assert page.locator("#jobs tbody tr").count() == 1
    assert page.locator(f'#jobs tr[data-id="{tagged}"]').is_visible()
    assert page.get_by_label("Tag", exact=True).input_value() == "import:7"
    assert page.dialogs == []  # type: ignore[attr-defined]
