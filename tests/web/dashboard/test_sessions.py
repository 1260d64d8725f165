"""The dashboard's sessions: the cookie holds a random id and never the token (nor does any
page), signing out ends the session for whoever holds its cookie, a session expires when idle
and at the end of its lifetime, and an id the server did not give (a token, a guess) is refused.
"""

from __future__ import annotations

from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from pgjobs.web.auth import Access
from pgjobs.web.dashboard.sessions import Sessions
from tests.web.conftest import READ_TOKEN, TOKEN, TestClient
from tests.web.dashboard.conftest import csrf_of, login


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _signed_in(web: FastAPI, token: str = TOKEN) -> tuple[TestClient, str]:
    client = TestClient(web)
    login(client, token)
    cookie = client.cookies["pgjobs_session"]
    return client, cookie


def _with_cookie(web: FastAPI, cookie: str) -> TestClient:
    client = TestClient(web)
    client.cookies.set("pgjobs_session", cookie)
    return client


def test_the_cookie_and_the_pages_never_hold_the_token(web: FastAPI) -> None:
    first, cookie = _signed_in(web)
    second, other = _signed_in(web)
    with first, second:
        assert TOKEN not in cookie and len(cookie) >= 32
        assert cookie != other  # one session per sign-in, not one per token
        for path in ("/", "/dead", "/jobs", "/login"):
            assert TOKEN not in first.get(path).text
        assert first.get("/dead", follow_redirects=False).status_code == 200
    # The token itself is no cookie: the pages want a login.
    with _with_cookie(web, TOKEN) as forged:
        assert forged.get("/dead", follow_redirects=False).status_code == 303


def test_signing_out_ends_the_session(web: FastAPI) -> None:
    client, cookie = _signed_in(web)
    with client, _with_cookie(web, cookie) as copy, _signed_in(web)[0] as elsewhere:
        assert copy.get("/dead", follow_redirects=False).status_code == 200
        out = client.post("/logout", data={"csrf": csrf_of(client.get("/").text)})
        assert out.url.path == "/login"
        # Whoever kept the old cookie is signed out too; other sessions are not.
        page = copy.get("/dead", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        assert 'pgjobs_session=""' in page.headers["set-cookie"]
        refused = copy.post("/queues/default/pause", data={"csrf": "0" * 64})
        assert refused.status_code == 403
        assert elsewhere.get("/dead", follow_redirects=False).status_code == 200


def test_a_session_expires_when_idle_and_at_the_end_of_its_lifetime(web: FastAPI) -> None:
    sessions: Sessions = web.state.sessions
    clock = Clock()
    sessions.clock = clock
    idle, lifetime = sessions.idle_seconds, sessions.lifetime_seconds
    client, _ = _signed_in(web)
    with client:
        clock.now += idle - 1
        assert client.get("/dead", follow_redirects=False).status_code == 200
        clock.now += idle - 1  # used a moment ago: still alive
        assert client.get("/dead", follow_redirects=False).status_code == 200
        clock.now += idle
        assert client.get("/dead", follow_redirects=False).status_code == 303
    busy, _ = _signed_in(web, READ_TOKEN)
    with busy:
        started = clock.now
        while clock.now + idle / 2 < started + lifetime:
            clock.now += idle / 2
            assert busy.get("/dead", follow_redirects=False).status_code == 200
        clock.now = started + lifetime
        assert busy.get("/dead", follow_redirects=False).status_code == 303
    assert len(sessions) == 0


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=200).filter(lambda s: s.isprintable() and ";" not in s))
def test_an_id_the_server_did_not_give_is_refused(guess: str) -> None:
    sessions = Sessions()
    given_id = sessions.start(Access.FULL, b"owner")
    assert guess == given_id or sessions.get(guess) is None
    assert sessions.get(given_id) is not None


def test_the_table_is_bounded() -> None:
    sessions = Sessions(max_sessions=3)
    ids = [sessions.start(Access.FULL, b"o") for _ in range(5)]
    assert len(sessions) == 3
    assert sessions.get(ids[0]) is None and sessions.get(ids[-1]) is not None
