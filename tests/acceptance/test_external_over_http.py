"""External completion over HTTP from end to end, with real processes: `pgjobs work` delivers
each job to a downstream service (in a thread of the test), and the downstream reports the
outcome to `pgjobs serve` at the ``report_url_path`` it was given, with a bearer token. The
attempt fences the report: a stale one answers 409 and changes nothing."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs import App
from tests.support.external import downstream_service
from tests.support.factories import row
from tests.support.helpers import Proc, assert_one_home, wait_until

pytest.importorskip("fastapi")  # the web extra: `pgjobs serve`
pytestmark = pytest.mark.slow

APP = "tests.acceptance.http_app:app"
TOKEN = "external-test-token-1f4e"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_the_downstream_reports_to_pgjobs_serve(
    spawn: Callable[..., Proc],
    subprocess_env: dict[str, str],
    make_app,
    conn: psycopg.Connection[Any],
):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = spawn(
        "serve", "--app", APP, "--port", str(port), "--pool-size", "2",
        env={**subprocess_env, "PGJOBS_API_TOKENS": TOKEN},
    )  # fmt: skip
    wait_until(lambda: _healthy(base), timeout=30, what="pgjobs serve", procs=[server])
    app: App = make_app(check_task_names=False)
    with downstream_service() as downstream:
        worker = spawn(
            "work", "--app", APP, "--queue", "downstream", "--poll-interval", "0.1",
            "--external-url", downstream.url,
        )  # fmt: skip
        job_id = app.enqueue("http.external", {"invoice": 12}, queue="downstream")

        [first] = downstream.wait_for(1)
        assert first["report_url_path"] == f"/api/v1/jobs/{job_id}/outcome"
        report = f"{base}{first['report_url_path']}"
        status, job = _post(report, {"attempt": 1, "status": "failed", "error": "busy, later"})
        assert status == 200, job
        assert (job["table"], job["last_error"]) == ("queued_jobs", "busy, later")

        [_, second] = downstream.wait_for(2, timeout=30)
        assert second["attempt"] == 2
        # The downstream retries its first report (a lost answer): 409, nothing changes.
        status, refused = _post(report, {"attempt": 1, "status": "succeeded"})
        assert (status, refused["error"]["code"]) == (409, "stale_outcome"), refused
        leased = row(conn, "queued_jobs", job_id)
        assert leased is not None and leased["attempts"] == 2 and leased["lease_owner"]

        status, job = _post(report, {"attempt": 2, "status": "succeeded", "result": {"paid": True}})
        assert status == 200, job
        assert (job["status"], job["result"]) == ("succeeded", {"paid": True})
        assert worker.stop() == 0
    assert assert_one_home(conn, [job_id]) == {job_id: "archived_jobs"}
    archived = row(conn, "archived_jobs", job_id)
    assert archived is not None
    assert (archived["attempts"], archived["result"]) == (2, {"paid": True})
    server.stop()
    assert TOKEN not in server.err() + server.out() + worker.err()
