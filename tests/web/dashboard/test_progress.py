"""Bulk redrives and purges of more than one batch, over HTTP against the real database: they run
in the background and the browser follows them on a progress page (batches and jobs done of the
pinned total, then the final message); the page is shown to the credential that started the
action only; a batch that fails stops the action and the page says how much was committed; a
server that stops mid-action leaves every job in one table and forgets the action; two actions
over the same set move each job once.

A trigger on dead_letter (``DeadTriggers``) holds or fails a chosen batch, so that the tests
look at a running action without depending on how fast it runs."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI

from pgjobs.admin import DeadFilter, DeadSelection
from pgjobs.web.dashboard import actions, routes
from pgjobs.web.dashboard.pages import dead as dead_pages
from tests.support.admin_factories import bury
from tests.support.helpers import assert_one_home, scalar, wait_until
from tests.web.conftest import AUTH, READ_TOKEN, TOKEN, TestClient
from tests.web.dashboard.conftest import DeadTriggers, csrf_of, ids, login

OTHER_TOKEN = "other-full-token-0123456789abcdef"

_STATE = re.compile(
    r'data-state="(\w+)"\s+data-batches-done="(\d+)" data-moved="(\d+)"', re.MULTILINE
)


@pytest.fixture(autouse=True)
def _batches_of_1000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_pages, "BATCH_SIZE", 1000)


def _confirmed(client: TestClient, action: str, **filters: str) -> dict[str, str]:
    """The hidden fields of the confirmation form of ``action`` over ``filters``."""
    page = client.get("/dead/confirm", params={"action": action, **filters})
    assert page.status_code == 200, page.text
    return dict(re.findall(r'<input type="hidden" name="([a-z]+)" value="([^"]*)">', page.text))


def _start(client: TestClient, fields: dict[str, str]) -> str:
    """Post a bulk action that runs in the background: the path of its progress page."""
    answer = client.post("/dead/bulk", data=fields, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    location = str(answer.headers["location"])
    assert re.fullmatch(r"/dead/actions/[A-Za-z0-9_-]{24,}", location), location
    return location


def _progress(client: TestClient, path: str) -> tuple[str, int, int]:
    """(state, batches done, jobs moved) as the progress page shows them."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = _STATE.search(page.text)
    assert found is not None, page.text
    return found.group(1), int(found.group(2)), int(found.group(3))


def _wait_state(client: TestClient, path: str, state: str) -> str:
    """Wait until the action of ``path`` is in ``state``; its page then."""
    wait_until(
        lambda: _progress(client, path)[0] == state,
        timeout=60,
        what=lambda: f"{state}: {_progress(client, path)}",
    )
    return str(client.get(path).text)


def test_a_bulk_purge_of_several_batches_shows_its_progress_and_purges_exactly_that_set(
    signed_in: TestClient, conn: psycopg.Connection[Any], dead_triggers: DeadTriggers
) -> None:
    doomed = bury(conn, 2500, task="images.resize", queue="media")
    kept = bury(conn, 4, task="images.resize", queue="other")
    kept += bury(conn, 3, task="emails.send", queue="media")
    dead_triggers.hold_at(doomed[1500])  # the second batch waits until released
    fields = _confirmed(signed_in, "purge", task="images.resize", queue="media")
    assert fields["expected"] == "2500"
    path = _start(signed_in, fields)
    first = signed_in.get(path).text
    assert "Purging 2,500 dead jobs in 3 batches of up to 1,000, in the background" in first
    assert re.search(r"<noscript><meta http-equiv=\"refresh\" content=\"2\"></noscript>", first)
    wait_until(lambda: _progress(signed_in, path) == ("running", 1, 1000), timeout=60)
    running = signed_in.get(path).text
    assert "1 of 3 batches" in running and "1,000 of 2,500 jobs</strong> purged" in running
    assert "s elapsed" in running and 'max="2500" value="1000"' in running
    # The script's fragment: the live part only.
    action_id = path.rsplit("/", 1)[1]
    partial = signed_in.get(f"/partials/actions/{action_id}")
    assert partial.status_code == 200 and 'data-state="running"' in partial.text
    assert "<html" not in partial.text and "1 of 3 batches" in partial.text
    assert partial.headers["content-security-policy"].startswith("default-src 'none'")
    assert len(ids(conn, "dead_letter")) == 1500 + len(kept)  # batch 1 committed, 2 waits
    dead_triggers.release()
    done = _wait_state(signed_in, path, "finished")
    assert "Purged 2,500 of 2,500 dead jobs in 3 batches of up to 1,000." in done
    assert "3 of 3 batches" in done and "2,500 of 2,500 jobs</strong> purged" in done
    assert 'http-equiv="refresh"' not in done  # a finished action's page stays still
    assert ids(conn, "dead_letter") == set(kept)
    assert_one_home(conn, kept)


def test_a_small_bulk_action_is_done_at_once(
    signed_in: TestClient, conn: psycopg.Connection[Any]
) -> None:
    dead = bury(conn, 1000, task="images.resize")
    fields = _confirmed(signed_in, "redrive", task="images.resize")
    answer = signed_in.post("/dead/bulk", data=fields, follow_redirects=False)
    assert answer.headers["location"].startswith("/dead?")
    assert (
        "Redrove 1,000 of 1,000 dead jobs in 1 batch"
        in signed_in.get(answer.headers["location"]).text
    )
    assert_one_home(conn, dead)
    assert ids(conn, "queued_jobs") == set(dead)


def test_the_progress_page_is_shown_to_the_credential_that_started_it_only(
    make_web: Callable[..., FastAPI], conn: psycopg.Connection[Any]
) -> None:
    dead = bury(conn, 1500, task="images.resize")
    web = make_web(tokens=[TOKEN, OTHER_TOKEN])
    with TestClient(web) as mine, TestClient(web) as other, TestClient(web) as reader:
        login(mine, TOKEN)
        login(other, OTHER_TOKEN)
        login(reader, READ_TOKEN)
        # A read-only token may not start one: refused, nothing moves.
        refused = reader.post(
            "/dead/bulk",
            data={"csrf": csrf_of(reader.get("/dead").text), "action": "redrive"},
            follow_redirects=False,
        )
        assert refused.status_code == 403 and len(ids(conn, "dead_letter")) == 1500
        path = _start(mine, _confirmed(mine, "purge"))
        action_id = path.rsplit("/", 1)[1]
        _wait_state(mine, path, "finished")
        # Another session (another full token, a read-only one) is told nothing: 404, the same
        # answer as for an id that never existed.
        for client in (other, reader):
            page = client.get(path)
            assert page.status_code == 404 and "Unknown action" in page.text
            assert "Purged" not in page.text
            assert client.get(f"/partials/actions/{action_id}").status_code == 404
        assert mine.get("/dead/actions/" + "x" * 24).status_code == 404
        # The same token is the same credential: a script with its bearer header sees it.
        with TestClient(web, headers=AUTH) as script:
            assert _progress(script, path) == ("finished", 2, 1500)
        # Signed out, the page asks for a login; the fragment answers 401.
        with TestClient(web) as visitor:
            assert visitor.get(path, follow_redirects=False).status_code == 303
            assert visitor.get(f"/partials/actions/{action_id}").status_code == 401
    assert not ids(conn, "dead_letter") and not set(dead) & ids(conn, "queued_jobs")
    # Another server (a restart) does not know the action.
    with TestClient(make_web()) as restarted:
        login(restarted, TOKEN)
        page = restarted.get(path)
        assert page.status_code == 404 and "Unknown action" in page.text


def test_a_failing_batch_stops_the_action_and_says_what_was_committed(
    signed_in: TestClient, conn: psycopg.Connection[Any], dead_triggers: DeadTriggers
) -> None:
    dead = bury(conn, 2500, task="images.resize")
    dead_triggers.fail_at(dead[1500], "disk on fire")
    csrf = csrf_of(signed_in.get("/dead").text)
    path = _start(signed_in, {"csrf": csrf, "action": "redrive", "task": "images.resize"})
    page = _wait_state(signed_in, path, "failed")
    assert "Stopped by an error:" in page and "disk on fire" in page
    assert "1 of 3 batches (1,000 jobs) were committed before it and stay redriven" in page
    assert "up to 1,500 jobs are still in dead_letter" in page
    assert 'http-equiv="refresh"' not in page
    # The first batch is back in the queue; the failed one and the one after it are still dead.
    assert ids(conn, "queued_jobs") == set(dead[:1000])
    assert ids(conn, "dead_letter") == set(dead[1000:])
    assert_one_home(conn, dead)


def test_a_server_stopping_mid_action_leaves_every_job_in_one_table(
    web: FastAPI,
    conn: psycopg.Connection[Any],
    dead_triggers: DeadTriggers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routes, "SHUTDOWN_WAIT", 0.2)
    dead = bury(conn, 2500, task="images.resize")
    dead_triggers.hold_at(dead[1500])
    with TestClient(web) as client:
        login(client, TOKEN)
        csrf = csrf_of(client.get("/dead").text)
        path = _start(client, {"csrf": csrf, "action": "redrive"})
        wait_until(lambda: _progress(client, path)[1] == 1, timeout=60)
    # The server stopped while batch 2 waited: it commits once released, and no batch follows.
    dead_triggers.release()
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM dead_letter") == 500, timeout=60)
    with TestClient(web) as again:  # the same process serving again still knows it
        login(again, TOKEN)
        page = _wait_state(again, path, "stopped")
        assert "The server stopped before the action ended: 2 of 3 batches (2,000 jobs)" in page
    assert ids(conn, "dead_letter") == set(dead[2000:])
    assert_one_home(conn, dead)


def test_two_redrives_of_the_same_set_at_once_move_each_job_once(
    signed_in: TestClient, conn: psycopg.Connection[Any], dead_triggers: DeadTriggers
) -> None:
    dead = bury(conn, 2500, task="images.resize")
    dead_triggers.hold_at(dead[1500])
    csrf = csrf_of(signed_in.get("/dead").text)
    fields = {"csrf": csrf, "action": "redrive", "task": "images.resize"}
    first = _start(signed_in, fields)
    wait_until(lambda: _progress(signed_in, first)[1] == 1, timeout=60)
    # The second selects the 1,500 still dead. The rows the first one's waiting batch has
    # locked it skips (it does not wait for them), the others it moves.
    second = _start(signed_in, fields)
    page = _wait_state(signed_in, second, "finished")
    _, _, moved = _progress(signed_in, second)
    assert 0 < moved < 1500
    assert f"Redrove {moved:,} of 1,500 dead jobs in 2 batches" in page
    assert f"{1500 - moved:,} were not" in page
    dead_triggers.release()
    _wait_state(signed_in, first, "finished")
    assert _progress(signed_in, first) == ("finished", 3, 2500 - moved)
    assert_one_home(conn, dead)
    assert ids(conn, "queued_jobs") == set(dead)
    # Each job was moved once (a second move would have counted a second redrive).
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE redrive_count = 1") == 2500


# -- the registry alone (no database) -------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _selection(count: int) -> DeadSelection:
    return DeadSelection(DeadFilter(), tuple(range(1, count + 1)))


def test_the_registry_is_bounded_and_forgets_finished_actions_after_an_hour() -> None:
    clock = _Clock()
    registry = actions.Actions(keep=2, expire_seconds=3600, max_running=1, clock=clock)
    owner, stranger = b"k" * 32, b"s" * 32
    gate = threading.Event()

    def held(batch: DeadSelection) -> int:
        gate.wait(30)
        return len(batch.ids)

    first = registry.start(owner, "purge", _selection(5), 2, held, {"task": "t"})
    # One may run at a time here: a second is refused, and nothing about it is kept.
    with pytest.raises(actions.TooManyActions, match="running already"):
        registry.start(owner, "purge", _selection(5), 2, held, {})
    running = registry.get(first, owner)
    assert running is not None and running.running and running.batches == 3
    assert registry.get(first, stranger) is None
    gate.set()
    wait_until(lambda: not registry.get(first, owner).running, timeout=30)  # type: ignore[union-attr]
    done = registry.get(first, owner)
    assert done is not None and (done.state, done.batches_done, done.moved) == ("finished", 3, 5)
    assert done.message == "Purged 5 of 5 dead jobs in 3 batches of up to 2."
    # Beyond ``keep`` finished actions, the oldest goes first.
    later = []
    for _ in range(2):
        clock.now += 1
        later.append(registry.start(owner, "redrive", _selection(1), 2, len_of, {}))
        wait_until(lambda: not registry.get(later[-1], owner).running, timeout=30)  # type: ignore[union-attr]
    assert registry.get(first, owner) is None
    assert all(registry.get(one, owner) is not None for one in later)
    # An hour after it ended, an action is forgotten.
    clock.now += 3601
    assert all(registry.get(one, owner) is None for one in later)
    # A stopping server starts nothing.
    registry.stop(0)
    with pytest.raises(actions.TooManyActions, match="stopping"):
        registry.start(owner, "purge", _selection(1), 2, len_of, {})


def len_of(batch: DeadSelection) -> int:
    return len(batch.ids)
