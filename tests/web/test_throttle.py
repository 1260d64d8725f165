"""Failed sign-ins slowed per client address: wrong bearer tokens (on reads and on writes,
refused before their body) and wrong tokens in the dashboard's login form end in 429 with
``Retry-After`` after a few, whatever the client presents next; other clients are not slowed;
a success resets the count; the table stays bounded whatever the sequence."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from pgjobs.web.throttle import FREE_FAILURES, SignInThrottle
from tests.web.conftest import AUTH, TOKEN, TestClient, assert_error
from tests.web.dashboard.conftest import csrf_of, login

WRONG = {"Authorization": "Bearer wrong-token-0123456789abcdef"}


class Clock:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _client(web: FastAPI, address: str, **kwargs: object) -> TestClient:
    return TestClient(web, client=(address, 40000), **kwargs)  # type: ignore[arg-type]


def test_wrong_tokens_from_one_address_end_in_429_and_others_still_get_in(
    make_web: Callable[..., FastAPI],
) -> None:
    web = make_web()
    clock = Clock()
    throttle = web.state.pgjobs.throttle
    throttle.clock = clock
    with _client(web, "203.0.113.7") as guesser, _client(web, "198.51.100.2") as other:
        answers = []
        for n in range(FREE_FAILURES + 3):
            # Reads and writes alike; a write is refused before its body is read.
            if n % 2:
                answers.append(guesser.get("/api/v1/jobs", headers=WRONG))
            else:
                answers.append(guesser.post("/api/v1/jobs", json={"task": "t"}, headers=WRONG))
        for refused in answers[:FREE_FAILURES]:
            assert_error(refused, 401, "unauthenticated")
        for refused in answers[FREE_FAILURES:]:
            message = assert_error(refused, 429, "too_many_requests")
            assert int(refused.headers["retry-after"]) >= 1
            assert "too many failed sign-ins" in message
        # While it waits, even the right token is refused: the answer tells nothing.
        assert_error(guesser.get("/api/v1/jobs", headers=AUTH), 429, "too_many_requests")
        # Another address is not slowed.
        assert other.get("/api/v1/jobs", headers=AUTH).status_code == 200
        assert other.post("/api/v1/jobs", json={"task": "t"}, headers=AUTH).status_code == 201
        # Once the wait is over, the right token gets in and the count starts again.
        clock.now += int(answers[-1].headers["retry-after"])
        assert guesser.get("/api/v1/jobs", headers=AUTH).status_code == 200
        assert_error(guesser.get("/api/v1/jobs", headers=WRONG), 401, "unauthenticated")
        assert len(throttle) == 1


def test_the_dashboard_slows_wrong_tokens_in_the_form_and_in_headers(
    make_web: Callable[..., FastAPI],
) -> None:
    web = make_web()
    clock = Clock()
    web.state.pgjobs.throttle.clock = clock
    with _client(web, "203.0.113.8") as guesser, _client(web, "198.51.100.3") as other:
        csrf = csrf_of(guesser.get("/login").text)
        statuses = []
        for _ in range(FREE_FAILURES + 2):
            page = guesser.post("/login", data={"token": "wrong-token-0123456789", "csrf": csrf})
            statuses.append(page.status_code)
        assert statuses == [401] * FREE_FAILURES + [429] * 2
        assert int(page.headers["retry-after"]) >= 1
        assert "Too many failed sign-ins" in page.text
        assert "pgjobs_session" not in guesser.cookies
        right = guesser.post("/login", data={"token": TOKEN, "csrf": csrf})
        assert right.status_code == 429 and "pgjobs_session" not in guesser.cookies
        # The bearer header of the dashboard's pages counts against the same address.
        assert guesser.get("/dead", headers=AUTH).status_code == 429
        login(other, TOKEN)
        assert other.get("/dead").status_code == 200
        clock.now += 3600
        login(guesser, TOKEN)
        assert guesser.get("/dead").status_code == 200


def test_the_server_shares_one_throttle_between_the_api_and_the_dashboard(
    make_web: Callable[..., FastAPI],
) -> None:
    web = make_web()
    with _client(web, "203.0.113.9") as guesser:
        for _ in range(FREE_FAILURES):
            guesser.get("/api/v1/jobs", headers=WRONG)
        csrf = csrf_of(guesser.get("/login").text)
        page = guesser.post("/login", data={"token": "wrong-token-0123456789", "csrf": csrf})
        assert page.status_code == 429


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.booleans(), st.floats(0, 400)),
        max_size=200,
    ),
    st.integers(1, 8),
)
def test_the_throttle_is_bounded_and_spares_clients_below_the_free_failures(
    events: list[tuple[int, bool, float]], cap: int
) -> None:
    clock = Clock()
    throttle = SignInThrottle(max_clients=cap, clock=clock)
    failures: dict[int, int] = {}
    for client, ok, later in events:
        clock.now += later
        address = f"10.0.0.{client}"
        if ok:
            throttle.succeeded(address)
            failures[client] = 0
            assert throttle.wait(address) is None
        else:
            wait = throttle.failed(address)
            failures[client] = failures.get(client, 0) + 1
            if failures[client] <= FREE_FAILURES:
                assert wait is None
            assert wait is None or 1 <= wait <= 300
        assert len(throttle) <= cap
