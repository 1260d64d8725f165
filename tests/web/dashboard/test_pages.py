"""The dashboard without a browser: every page through HTTP against the real database, signed
in through the login form (a session cookie) or with the API's bearer header; the login's cookie
(its sessions: ``test_sessions``); CSRF refusals; read-only tokens; escaping of hostile job data;
combined filters; and every action, checked in the tables afterwards."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from pgjobs import App, admin, queries, queues
from pgjobs.db.dsn import Dsn
from pgjobs.models import DeadReason
from pgjobs.web.dashboard.data import EXACT_COUNT_CAP
from tests.support.admin_factories import bury, succeed
from tests.support.factories import claim
from tests.support.helpers import assert_one_home
from tests.web.conftest import AUTH, READ_AUTH, READ_TOKEN, TOKEN, TestClient
from tests.web.dashboard.conftest import csrf_of, ids, login, status_of

PAGES = (
    "/",
    "/partials/overview",
    "/dead",
    "/dead?groups=all",
    "/dead/confirm?action=purge",
    "/dead/confirm?action=redrive&task=images.resize",
    "/jobs",
    "/jobs?state=dead",
    "/queues/default",
    "/schedules",
)


def _row_ids(html: str, table_id: str) -> set[int]:
    """The job ids of the rows of the table ``table_id`` of a page."""
    start = html.index(f'id="{table_id}"')
    end = html.index("</table>", start)
    return {int(n) for n in re.findall(r'<tr data-id="(\d+)"', html[start:end])}


@pytest.fixture
def jobs(conn: psycopg.Connection[Any], make_app: Callable[..., App]) -> dict[str, Any]:
    """A job in every state: ready, scheduled, running, succeeded, and two dead ones."""
    app = make_app()
    ready = app.enqueue("emails.send", {"to": "a@example.com"}, idempotency_key="welcome-42")
    scheduled = app.enqueue("emails.send", {"to": "b@example.com"}, run_in=3600)
    done = app.enqueue("reports.build", {"n": 1}, queue="reports")
    (claimed,) = claim(conn, owner="w1", queues=["reports"], limit=1)
    succeed(conn, claimed)
    running = app.enqueue("reports.build", {"n": 2}, queue="reports")
    claim(conn, owner="worker-7", queues=["reports"], limit=1)
    dead = bury(conn, 2, task="images.resize", error=lambda n: f"timeout after {n + 3}s")
    return {
        "ready": ready,
        "scheduled": scheduled,
        "succeeded": done,
        "running": running,
        "dead": dead,
    }


def test_every_page_renders_signed_in_or_with_a_bearer_token(
    signed_in: TestClient, web: FastAPI, jobs: dict[str, Any]
) -> None:
    every = jobs["dead"] + [jobs[k] for k in ("ready", "scheduled", "running", "succeeded")]
    paths = [*PAGES, *(f"/jobs/{job_id}" for job_id in every), "/queues/reports"]
    with TestClient(web, headers=AUTH) as bearer:
        for client in (signed_in, bearer):
            for path in paths:
                page = client.get(path, follow_redirects=False)
                assert page.status_code == 200, (path, page.text[:2000])
                assert page.headers["content-type"].startswith("text/html")
                assert "script-src 'self'" in page.headers["content-security-policy"]
                assert page.headers["cache-control"] == "no-store"
    assert (
        signed_in.get("/static/dashboard.js").headers["content-type"].startswith("text/javascript")
    )


def test_pages_send_a_visitor_to_the_login_form(visitor: TestClient, web: FastAPI) -> None:
    for path in PAGES:
        page = visitor.get(path, follow_redirects=False)
        if path == "/partials/overview":  # the refresh script stops on 401
            assert page.status_code == 401
            continue
        assert page.status_code == 303, path
        assert page.headers["location"].startswith("/login?next="), page.headers
    # A bad bearer token is refused, not redirected (a script is not a browser).
    with TestClient(web, headers={"Authorization": "Bearer not-a-token-at-all-123"}) as bad:
        refused = bad.get("/", follow_redirects=False)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
    # A session cookie the server does not know (ended, expired, forged) is dropped.
    visitor.cookies.set("pgjobs_session", "some-session-id-nobody-was-given")
    page = visitor.get("/dead", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login?next=%2Fdead"
    assert 'pgjobs_session=""' in page.headers["set-cookie"]


def test_login_sets_a_strict_httponly_session_cookie(web: FastAPI) -> None:
    with TestClient(web) as client:
        form = client.get("/login?next=/dead")
        refused = client.post(
            "/login",
            data={"token": "wrong-token-0123456789", "csrf": csrf_of(form.text), "next": "/dead"},
            follow_redirects=False,
        )
        assert refused.status_code == 401 and "pgjobs_session" not in refused.headers.get(
            "set-cookie", ""
        )
        answer = client.post(
            "/login",
            data={"token": TOKEN, "csrf": csrf_of(form.text), "next": "/dead"},
            follow_redirects=False,
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/dead"
        cookie = answer.headers["set-cookie"].lower()
        assert "pgjobs_session=" in cookie and "httponly" in cookie
        assert "samesite=strict" in cookie and "path=/" in cookie
        assert "secure" not in cookie  # plain http: a Secure cookie would never come back
        assert client.get("/dead", follow_redirects=False).status_code == 200
        # Sign out: the cookie goes, and the pages want a login again.
        out = client.post("/logout", data={"csrf": csrf_of(client.get("/").text)})
        assert out.url.path == "/login"
        assert client.get("/", follow_redirects=False).status_code == 303
    # Over https (directly, or through a trusted proxy) the cookie is Secure too.
    with TestClient(web, base_url="https://dash.example") as client:
        form = client.get("/login")
        answer = client.post(
            "/login",
            data={"token": TOKEN, "csrf": csrf_of(form.text)},
            follow_redirects=False,
        )
        assert "secure" in answer.headers["set-cookie"].lower()
    # A login that does not come from the form (no CSRF cookie and token) is refused.
    with TestClient(web) as client:
        forged = client.post("/login", data={"token": TOKEN, "csrf": "0" * 64})
        assert forged.status_code == 403 and "pgjobs_session" not in client.cookies


def test_a_post_without_the_sessions_csrf_token_changes_nothing(
    signed_in: TestClient, web: FastAPI, conn: psycopg.Connection[Any], jobs: dict[str, Any]
) -> None:
    job_id = jobs["ready"]
    url = f"/jobs/{job_id}/cancel"
    good = csrf_of(signed_in.get(f"/jobs/{job_id}").text)
    with TestClient(web) as other:  # another token's CSRF token
        login(other, READ_TOKEN)
        foreign = csrf_of(other.get("/").text)
    for fields in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": foreign}):
        refused = signed_in.post(url, data=fields, follow_redirects=False)
        assert refused.status_code == 403, fields
        assert "nothing was changed" in refused.text
        assert status_of(conn, job_id) == "queued"
    # The bulk actions check it too.
    dead = jobs["dead"]
    refused = signed_in.post("/dead/bulk", data={"action": "purge", "expected": "2"})
    assert refused.status_code == 403 and ids(conn, "dead_letter") == set(dead)
    # JSON is not a form: the dashboard takes forms only.
    assert signed_in.post(url, json={"csrf": good}).status_code == 415
    assert status_of(conn, job_id) == "queued"
    # With its token the same form works.
    done = signed_in.post(url, data={"csrf": good}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{job_id}"
    assert status_of(conn, job_id) == "cancelled"
    assert f"Job {job_id} cancelled" in signed_in.get(done.headers["location"]).text


def test_a_read_only_token_sees_no_action_and_is_refused(
    read_only: TestClient, web: FastAPI, conn: psycopg.Connection[Any], jobs: dict[str, Any]
) -> None:
    dead_id = jobs["dead"][0]
    for path in (
        f"/jobs/{jobs['ready']}",
        f"/jobs/{dead_id}",
        "/dead",
        "/dead/confirm?action=purge",
        "/queues/default",
    ):
        page = read_only.get(path)
        assert page.status_code == 200
        assert "read-only" in page.text
        assert not re.search(r'<form method="post" action="/(jobs|dead|queues)', page.text), path
        assert "Purge all matching" not in page.text and "Redrive group" not in page.text
    csrf = csrf_of(read_only.get("/").text)  # its sign-out form's token is valid
    for url, fields in (
        (f"/jobs/{jobs['ready']}/cancel", {}),
        (f"/jobs/{dead_id}/redrive", {}),
        ("/dead/bulk", {"action": "purge", "expected": "2"}),
        ("/queues/default/pause", {}),
    ):
        refused = read_only.post(url, data={"csrf": csrf, **fields}, follow_redirects=False)
        assert refused.status_code == 403 and "read-only" in refused.text, url
    assert status_of(conn, jobs["ready"]) == "queued"
    assert ids(conn, "dead_letter") == set(jobs["dead"])
    assert not queues.queue(conn, "default").paused
    with TestClient(web, headers=READ_AUTH) as script:
        assert 'id="redrive"' not in script.get(f"/jobs/{dead_id}").text


def test_hostile_job_data_is_shown_as_text(
    signed_in: TestClient, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    controls = "red\x1b[31m\u202ereversed\x07"
    job_id = make_app().enqueue(
        "emails.<b>send</b>", {"html": hostile, "ctl": controls}, queue="<i>q</i>"
    )
    (dead_id,) = bury(
        conn, 1, task=f"evil{controls}<script>", queue="q", error=lambda _: f"{hostile}{controls}"
    )
    pages = [
        signed_in.get(f"/jobs/{job_id}").text,
        signed_in.get(f"/jobs/{dead_id}").text,
        signed_in.get("/dead").text,
        signed_in.get("/").text,
        signed_in.get("/jobs").text,
        signed_in.get("/queues/%3Ci%3Eq%3C%2Fi%3E").text,
    ]
    for html in pages:
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>send" not in html
        assert "\x1b" not in html and "\u202e" not in html and "\x07" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]  # the payload, as text
    # Control characters made visible: JSON's escapes, and printable()'s for the rest.
    assert "red\\u001b[31m\\u202ereversed\\u0007" in pages[0]
    assert "evilred\\x1b[31m" in pages[1] and "&lt;script&gt;" in pages[2]
    assert "&lt;i&gt;q&lt;/i&gt;" in pages[3]


def test_dead_letter_filters_combine(signed_in: TestClient, conn: psycopg.Connection[Any]) -> None:
    target = bury(
        conn, 3, task="billing.charge", queue="billing", error=lambda n: f"card {n} declined"
    )
    same_task_other_queue = bury(
        conn, 2, task="billing.charge", queue="eu", error=lambda n: f"card {n} declined"
    )
    same_queue_other_error = bury(
        conn, 2, task="billing.charge", queue="billing", error=lambda n: "gateway timeout"
    )
    other_task = bury(
        conn, 2, task="emails.send", queue="billing", error=lambda n: f"card {n} declined"
    )
    page = signed_in.get(
        "/dead", params={"task": "billing.charge", "queue": "billing", "error": "DECLINED"}
    )
    assert page.status_code == 200
    assert _row_ids(page.text, "dead-jobs") == set(target)
    assert "<strong>3</strong> dead jobs match" in page.text
    # With a time window that excludes them all, nothing matches.
    empty = signed_in.get("/dead", params={"task": "billing.charge", "until": "2000-01-01T00:00"})
    assert "No dead job matches" in empty.text
    # The groups of a filter count its jobs only.
    groups = signed_in.get("/dead", params={"queue": "billing"}).text
    assert re.search(r">3</a></td>\s*<td><code>billing.charge</code>", groups)
    # The same filters on the job listing.
    listed = signed_in.get(
        "/jobs", params={"state": "dead", "queue": "billing", "task": "emails.send"}
    )
    assert _row_ids(listed.text, "jobs") == set(other_task)
    # A bad filter is a 422 page saying what is wrong, never a 500.
    for params in (
        {"since": "yesterday"},
        {"reason": "tired"},
        {"since": "1h", "until": "2h"},
        {"since": "9" * 400 + "d"},  # past a float's range: no timedelta can hold it
        {"until": "0d"},
    ):
        bad = signed_in.get("/dead", params=params)
        assert bad.status_code == 422, params
        assert "flash-error" in bad.text
    assert signed_in.get("/jobs", params={"state": "lost"}).status_code == 422
    assert len(ids(conn, "dead_letter")) == 9 and same_task_other_queue and same_queue_other_error


def test_bulk_purge_removes_exactly_the_confirmed_set(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    doomed = bury(conn, 5, task="images.resize", queue="media", error=lambda n: f"corrupt {n}")
    kept = bury(conn, 3, task="images.resize", queue="other", error=lambda n: f"corrupt {n}")
    kept += bury(conn, 2, task="emails.send", queue="media", error=lambda n: f"corrupt {n}")
    filters = {"task": "images.resize", "queue": "media"}
    confirm = signed_in.get("/dead/confirm", params={"action": "purge", **filters})
    assert 'data-count="5"' in confirm.text and "Purge 5 dead jobs" in confirm.text
    fields = dict(
        re.findall(r'<input type="hidden" name="([a-z]+)" value="([^"]*)">', confirm.text)
    )
    assert fields["expected"] == "5" and fields["pinned"]
    # A job that fails after the count is not part of what was confirmed: the set changed, so
    # nothing is purged and the page says so.
    late = bury(conn, 1, task="images.resize", queue="media")
    conn.execute(
        "UPDATE dead_letter SET failed_at = failed_at - interval '1 hour' WHERE id = %s", late
    )
    refused = signed_in.post("/dead/bulk", data=fields)
    assert "the set changed" in refused.text and "nothing was purged" in refused.text
    assert ids(conn, "dead_letter") == {*doomed, *kept, *late}
    conn.execute("DELETE FROM dead_letter WHERE id = %s", late)
    done = signed_in.post("/dead/bulk", data=fields, follow_redirects=False)
    assert done.status_code == 303
    assert ids(conn, "dead_letter") == set(kept)
    shown = signed_in.get(done.headers["location"]).text
    assert "Purged 5 of 5 dead jobs in 1 batch" in shown
    # A purge is never done without its confirmation page.
    unconfirmed = signed_in.post(
        "/dead/bulk", data={"action": "purge", "csrf": fields["csrf"]}, follow_redirects=False
    )
    assert unconfirmed.headers["location"].startswith("/dead/confirm?")
    assert ids(conn, "dead_letter") == set(kept)


def test_replaying_an_expired_job_says_its_copy_expired_at_once(
    signed_in: TestClient, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    app = make_app(check_task_names=False)
    original = app.enqueue("t", {}, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    assert conn.execute(queries.JOB_EXPIRE_MANY, {"limit": 10}).fetchone() == (1,)
    csrf = csrf_of(signed_in.get(f"/jobs/{original}").text)
    said = signed_in.post(f"/jobs/{original}/replay", data={"csrf": csrf}).text
    (new_id,) = ids(conn, "archived_jobs") - {original}
    assert f"replayed as job {new_id}, archived at once as expired" in said
    assert status_of(conn, new_id) == "expired"


def test_group_redrive_and_job_actions(
    signed_in: TestClient, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    group = bury(conn, 4, task="images.resize", error=lambda n: f"timeout after {n}s")
    other = bury(conn, 2, task="images.resize", error=lambda n: "disk full")
    page = signed_in.get("/dead").text
    fingerprint = re.search(
        r'data-fingerprint="([0-9a-f]{8})" data-task="images.resize">\s*<td class="num"><a[^>]*>4<',
        page,
    )
    assert fingerprint is not None, page
    csrf = csrf_of(page)
    moved = signed_in.post(
        "/dead/bulk",
        data={
            "csrf": csrf,
            "action": "redrive",
            "task": "images.resize",
            "fingerprint": fingerprint.group(1),
        },
    )
    assert "Redrove 4 of 4 dead jobs" in moved.text
    assert ids(conn, "dead_letter") == set(other) and set(group) <= ids(conn, "queued_jobs")
    # One dead job redriven from its page, then replayed once it is archived.
    redriven = signed_in.post(f"/jobs/{other[0]}/redrive", data={"csrf": csrf}).text
    assert f"Job {other[0]} redriven" in redriven and status_of(conn, other[0]) == "queued"
    replay = signed_in.post(f"/jobs/{other[1]}/replay", data={"csrf": csrf}, follow_redirects=False)
    new_id = int(replay.headers["location"].rsplit("/", 1)[1])
    assert conn.execute("SELECT replay_of FROM queued_jobs WHERE id = %s", [new_id]).fetchone() == (
        other[1],
    )
    # A running job: cancel is refused with the reason; force-cancel archives it.
    app = make_app()
    running = app.enqueue("long.task", {}, queue="slow")
    claim(conn, owner="worker-1", queues=["slow"], limit=1)
    job_page = signed_in.get(f"/jobs/{running}").text
    assert "Force-cancel" in job_page and "outcome is discarded" in job_page
    refused = signed_in.post(f"/jobs/{running}/cancel", data={"csrf": csrf}).text
    assert "is running on worker worker-1" in refused and status_of(conn, running) == "queued"
    forced = signed_in.post(f"/jobs/{running}/cancel", data={"csrf": csrf, "force": "1"}).text
    assert "force-cancelled" in forced and status_of(conn, running) == "cancelled"
    assert_one_home(conn, [*group, *other, new_id, running])


def test_find_a_job_by_id_or_idempotency_key(signed_in: TestClient, jobs: dict[str, Any]) -> None:
    by_id = signed_in.get("/jobs", params={"find": str(jobs["ready"])}, follow_redirects=False)
    assert by_id.headers["location"] == f"/jobs/{jobs['ready']}"
    by_key = signed_in.get("/jobs", params={"find": "welcome-42"}, follow_redirects=False)
    assert by_key.headers["location"] == f"/jobs/{jobs['ready']}"
    assert "No job has that id" in signed_in.get("/jobs", params={"find": "nope"}).text
    assert signed_in.get("/jobs/123456789").status_code == 404
    assert signed_in.get("/jobs/not-a-number").status_code == 404


def test_the_overview_and_queue_pages_show_what_the_tables_hold(
    signed_in: TestClient, conn: psycopg.Connection[Any], jobs: dict[str, Any]
) -> None:
    conn.execute(
        "INSERT INTO pgjobs_workers (id, host, pid, queues, concurrency) "
        "VALUES ('host-a:1:0001', 'host-a', 1, ARRAY['reports'], 4)"
    )
    html = signed_in.get("/").text

    def cell(queue: str, column: str) -> str:
        row = html[html.index(f'<tr data-queue="{queue}">') :]
        found = re.search(rf'data-col="{column}">(?:<a[^>]*>)?([^<]*)<', row)
        assert found is not None
        return found.group(1)

    assert (cell("default", "ready"), cell("default", "scheduled"), cell("default", "dead")) == (
        "1",
        "1",
        "2",
    )
    assert (cell("reports", "running"), cell("reports", "finished")) == ("1", "1")
    assert "host-a:1:0001" in html and "0 / 4" in html  # the worker, its slots
    assert "1 running job</strong> leased to\n    1 worker" in html  # worker-7 is not live
    # Small tables are counted, analysed or not (this server runs without autovacuum).
    assert "<code>dead_letter</code> 2 rows" in html and "never analysed" not in html
    assert "<code>archived_jobs</code> 1 rows" in html
    # The queue with a ready job and no live worker is marked; the one a worker serves is not.
    assert "no live worker</span>" in _queue_row(html, "default")
    assert "no live worker</span>" not in _queue_row(html, "reports")
    queue = signed_in.get("/queues/reports").text
    assert '<dd data-col="running">1</dd>' in queue and '<tr data-task="reports.build">' in queue
    assert _row_ids(queue, "jobs") == {jobs["running"], jobs["succeeded"]}
    finished = signed_in.get("/queues/reports", params={"state": "succeeded"}).text
    assert _row_ids(finished, "jobs") == {jobs["succeeded"]}
    # A paused queue says so, with who paused it and why; it is paused and resumed from its page.
    queues.pause(conn, "reports", reason="<b>migrating</b> the warehouse", by="ops@host")
    assert '<span class="badge badge-paused">paused</span>' in signed_in.get("/").text
    paused = signed_in.get("/queues/reports").text
    assert 'id="paused"' in paused and "ops@host" in paused
    assert "&lt;b&gt;migrating&lt;/b&gt; the warehouse" in paused
    resumed = signed_in.post("/queues/reports/resume", data={"csrf": csrf_of(paused)}).text
    assert "Queue reports resumed." in resumed and not queues.queue(conn, "reports").paused
    signed_in.post("/queues/reports/pause", data={"csrf": csrf_of(resumed), "reason": "deploy"})
    state = queues.queue(conn, "reports")
    assert state.paused and state.pause_reason == "deploy"
    assert state.paused_by == "dashboard (testclient)"
    # A limited queue says so on its page.
    assert 'id="limits"' not in signed_in.get("/queues/reports").text
    queues.limit(conn, "reports", concurrency=3, rate="5/10s")
    limited = signed_in.get("/queues/reports").text
    assert 'id="limits"' in limited and "at most 3 running, 5/10s starts" in limited


def _queue_row(html: str, queue: str) -> str:
    start = html.index(f'<tr data-queue="{queue}">')
    return html[start : html.index("</tr>", start)]


def test_a_big_table_never_analysed_says_how_to_get_its_size(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    bury(conn, EXACT_COUNT_CAP + 1)
    html = signed_in.get("/").text
    assert (
        "<code>dead_letter</code> more than 10,000 rows (never analysed: run ANALYZE dead_letter"
        in html
    )
    assert "dead_letter holds more than 10,000 jobs" in signed_in.get("/dead").text
    conn.execute("ANALYZE dead_letter")
    assert "<code>dead_letter</code> ≈10k rows" in signed_in.get("/").text
    bury(conn, 1)  # counted or estimated, never a number that stays wrong below the cap
    conn.execute(
        "DELETE FROM dead_letter WHERE id NOT IN (SELECT id FROM dead_letter ORDER BY id LIMIT 100)"
    )
    assert "<code>dead_letter</code> 100 rows" in signed_in.get("/").text


def test_insecure_no_auth_shows_everything_but_still_checks_csrf(
    make_web: Callable[..., FastAPI], conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    web = make_web(tokens=None, read_only_tokens=None, insecure_no_auth=True)
    (dead_id,) = bury(conn, 1)
    with TestClient(web) as client:
        page = client.get(f"/jobs/{dead_id}")
        assert page.status_code == 200 and "--insecure-no-auth" in page.text
        assert client.post(f"/jobs/{dead_id}/redrive", data={}).status_code == 403
        with TestClient(web) as stranger:  # another browser's token is no use
            stranger_csrf = csrf_of(stranger.get(f"/jobs/{dead_id}").text)
        assert (
            client.post(f"/jobs/{dead_id}/redrive", data={"csrf": stranger_csrf}).status_code == 403
        )
        assert status_of(conn, dead_id) == "dead"
        done = client.post(f"/jobs/{dead_id}/redrive", data={"csrf": csrf_of(page.text)})
        assert done.status_code == 200 and status_of(conn, dead_id) == "queued"


def test_links_and_cookies_follow_a_path_prefix(web: FastAPI) -> None:
    with TestClient(web, root_path="/pgjobs") as client:
        page = client.get("/pgjobs/dead", follow_redirects=False)
        assert page.headers["location"] == "/pgjobs/login?next=%2Fdead"
        form = client.get("/pgjobs/login")
        assert 'action="/pgjobs/login"' in form.text and "/pgjobs/static/dashboard.css" in form.text
        answer = client.post(
            "/pgjobs/login",
            data={"token": TOKEN, "csrf": csrf_of(form.text)},
            follow_redirects=False,
        )
        assert (
            answer.headers["location"] == "/pgjobs/"
            and "path=/pgjobs/" in answer.headers["set-cookie"].lower()
        )


@pytest.mark.parametrize("path", ["/dead/confirm?action=explode", "/queues/%01"])
def test_bad_input_is_a_page_not_a_500(signed_in: TestClient, path: str) -> None:
    assert signed_in.get(path).status_code == 422


def test_dead_jobs_page_on_and_the_reason_filter_acts_on_its_jobs_only(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    many = bury(conn, 60, task="emails.send", error=lambda n: f"bounce {n}")
    expired = bury(conn, 3, task="emails.send", reason=DeadReason.LEASE_EXPIRED, error_type=None)
    first = signed_in.get("/dead", params={"reason": "exhausted"}).text
    shown = _row_ids(first, "dead-jobs")
    assert len(shown) == 50
    older = re.search(r'href="(/dead\?[^"]*before=[^"]+)" rel="next"', first)
    assert older is not None
    rest = _row_ids(signed_in.get(older.group(1).replace("&amp;", "&")).text, "dead-jobs")
    assert shown | rest == set(many) and not shown & rest
    # A bulk redrive of one reason moves that reason's jobs only.
    confirm = signed_in.get(
        "/dead/confirm", params={"action": "redrive", "reason": "lease_expired"}
    )
    fields = dict(
        re.findall(r'<input type="hidden" name="([a-z]+)" value="([^"]*)">', confirm.text)
    )
    assert fields["expected"] == "3" and fields["reason"] == "lease_expired"
    done = signed_in.post("/dead/bulk", data=fields).text
    assert "Redrove 3 of 3 dead jobs" in done
    assert ids(conn, "dead_letter") == set(many) and set(expired) <= ids(conn, "queued_jobs")


def test_the_chart_says_its_red_bars_are_the_jobs_still_dead(
    signed_in: TestClient, conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    # What the red bars count is what their legend says, before and after a redrive: the jobs in
    # the dead letter now, by the minute they failed (no table keeps when a redriven job died).
    dead = bury(conn, 3)
    html = signed_in.get("/").text
    assert "dead-lettered, still dead 3" in html
    assert html.count('class="bar-fail"') == 1
    assert 'id="chart-note"' in html and "a redrive or a purge takes jobs out" in html
    admin.redrive(dsn, admin.DeadFilter(ids=tuple(dead[:2])))
    after = signed_in.get("/").text
    assert "dead-lettered, still dead 1" in after
    assert "1 dead-lettered, still dead</title>" in after
