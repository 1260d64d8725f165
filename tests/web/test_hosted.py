"""pgjobs mounted in a host application that signs people in itself (``create_app(auth=...)``):
a FastAPI site with a fake sign-in (Starlette's AuthenticationMiddleware reading a cookie of the
site's own), and a Django ASGI site with Django's own sessions (``test_django_*``).

What holds: the host's read role sees pages and GETs the API but is refused every action (403,
the one JSON error shape on the API); its operate role acts; nobody signed in gets 401 from the
API and the host's sign-in page (or a 401 page) from the dashboard; every link, asset and form
carries the mount's prefix; the dashboard's CSRF check still refuses a form without its token;
what an operator does is recorded under their name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import psycopg
import pytest
from fastapi import FastAPI
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    BaseUser,
    SimpleUser,
)
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request

from pgjobs import App, queues
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.web import Principal, Role, create_app
from pgjobs.web.dashboard.security import csrf_token, host_key
from tests.support.admin_factories import bury
from tests.web.conftest import TOKEN, TestClient, assert_error
from tests.web.dashboard.conftest import csrf_of, status_of

PREFIX = "/jobs"
#: The site's own sessions: its cookie's value -> (name, role).
SITE_SESSIONS = {
    "s-alice": ("alice@example.com", "operate"),
    "s-bob": ("bob@example.com", "read"),
}


class SiteSignIn(AuthenticationBackend):
    """The host's sign-in, faked: its ``site_session`` cookie names a user of SITE_SESSIONS."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        found = SITE_SESSIONS.get(conn.cookies.get("site_session", ""))
        if found is None:
            return None
        name, role = found
        return AuthCredentials([role]), SimpleUser(name)


def site_principal(request: Request) -> Principal | None:
    """The ``auth`` the site gives pgjobs: its user, operate for its "operate" scope."""
    if not request.user.is_authenticated:
        return None
    role = Role.OPERATE if "operate" in request.auth.scopes else Role.READ
    return Principal(request.user.display_name, role)


def _site(pgjobs_web: FastAPI) -> FastAPI:
    site = FastAPI()
    site.add_middleware(AuthenticationMiddleware, backend=SiteSignIn())

    @site.get("/login")
    def login() -> dict[str, str]:
        return {"page": "the site's own sign-in"}

    site.mount(PREFIX, pgjobs_web)
    return site


@pytest.fixture
def make_hosted(dsn: Dsn) -> Iterator[Callable[..., FastAPI]]:
    """Factory of sites mounting pgjobs at /jobs under the site's sign-in; pools closed after."""
    made: list[FastAPI] = []

    def make(**kwargs: Any) -> FastAPI:
        options: dict[str, Any] = {
            "dsn": dsn,
            "pool_size": 2,
            "auth": site_principal,
            "sign_in_url": "/login",
        }
        options.update(kwargs)
        web = create_app(**options)
        made.append(web)
        return _site(web)

    yield make
    for web in made:  # a mounted app's lifespan is not run by its host
        web.state.pgjobs.close()


@pytest.fixture
def site(make_hosted: Callable[..., FastAPI]) -> FastAPI:
    return make_hosted()


def _as(site: FastAPI, session: str | None) -> TestClient:
    client = TestClient(site)
    if session is not None:
        client.cookies.set("site_session", session)
    return client


@pytest.fixture
def alice(site: FastAPI) -> Iterator[TestClient]:
    """The site's operator."""
    with _as(site, "s-alice") as client:
        yield client


@pytest.fixture
def bob(site: FastAPI) -> Iterator[TestClient]:
    """The site's read-only user."""
    with _as(site, "s-bob") as client:
        yield client


@pytest.fixture
def nobody(site: FastAPI) -> Iterator[TestClient]:
    with _as(site, None) as client:
        yield client


def _valid_csrf(client: TestClient, name: str) -> str:
    """The CSRF token the dashboard would put in a form for ``name`` in ``client``'s browser
    (a read-only page shows no form to take it from)."""
    cookie = client.cookies.get("pgjobs_csrf")
    assert cookie, "the dashboard gave no pgjobs_csrf cookie"
    scope = {"type": "http", "headers": [(b"cookie", f"pgjobs_csrf={cookie}".encode())]}
    return csrf_token(host_key(Request(scope), name))


@pytest.fixture
def ready_job(make_app: Callable[..., App]) -> int:
    return make_app().enqueue("emails.send", {"to": "a@example.com"}, queue="mail")


# -- roles --------------------------------------------------------------------------------------


def test_the_read_role_sees_pages_and_the_api_but_may_not_act(
    bob: TestClient, conn: psycopg.Connection[Any], ready_job: int
) -> None:
    for path in ("/", "/dead", "/jobs", f"/jobs/{ready_job}", "/queues/mail", "/schedules"):
        page = bob.get(PREFIX + path)
        assert page.status_code == 200, (path, page.text)
        assert "bob@example.com" in page.text and "read-only" in page.text
    assert bob.get(f"{PREFIX}/api/v1/jobs/{ready_job}").json()["id"] == ready_job
    assert bob.get(f"{PREFIX}/metrics").status_code == 200
    refused = bob.post(f"{PREFIX}/api/v1/jobs/{ready_job}/cancel")
    assert "read" in assert_error(refused, 403, "forbidden")
    enqueue = bob.post(f"{PREFIX}/api/v1/jobs", json={"task": "emails.send", "payload": {}})
    assert_error(enqueue, 403, "forbidden")
    # No action on the pages; a form posted anyway is refused, its CSRF token valid.
    page = bob.get(f"{PREFIX}/jobs/{ready_job}").text
    assert not re.search(r'<form method="post"', page), page
    csrf = _valid_csrf(bob, "bob@example.com")
    for path in (f"/jobs/{ready_job}/cancel", "/queues/mail/pause"):
        refused = bob.post(PREFIX + path, data={"csrf": csrf})
        assert refused.status_code == 403 and "Your role is read" in refused.text, path
    assert status_of(conn, ready_job) == "queued"
    assert conn.execute("SELECT count(*) FROM pgjobs_queues").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (1,)


def test_the_operate_role_acts_and_is_recorded_by_name(
    alice: TestClient, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    app = make_app()
    first, second = (app.enqueue("emails.send", {"n": n}, queue="mail") for n in (1, 2))
    cancelled = alice.post(f"{PREFIX}/api/v1/jobs/{first}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    page = alice.get(f"{PREFIX}/queues/mail")
    assert "Pause" in page.text
    csrf = csrf_of(page.text)
    paused = alice.post(
        f"{PREFIX}/queues/mail/pause",
        data={"csrf": csrf, "reason": "mail relay down"},
        follow_redirects=False,
    )
    assert paused.status_code == 303 and paused.headers["location"] == f"{PREFIX}/queues/mail"
    state = queues.queue(conn, "mail")
    assert (state.paused_by, state.pause_reason) == ("alice@example.com", "mail relay down")
    assert "alice@example.com" in alice.get(f"{PREFIX}/queues/mail").text
    done = alice.post(f"{PREFIX}/jobs/{second}/cancel", data={"csrf": csrf})
    assert done.status_code == 200 and f"Job {second} cancelled" in done.text
    assert (status_of(conn, first), status_of(conn, second)) == ("cancelled", "cancelled")


def test_nobody_signed_in_gets_401_from_the_api_and_the_sites_sign_in_from_the_dashboard(
    nobody: TestClient, make_hosted: Callable[..., FastAPI], ready_job: int
) -> None:
    for method, path in (
        ("GET", f"/api/v1/jobs/{ready_job}"),
        ("POST", f"/api/v1/jobs/{ready_job}/cancel"),
        ("POST", "/api/v1/jobs"),
        ("GET", "/metrics"),
    ):
        assert_error(nobody.request(method, PREFIX + path, json={}), 401, "unauthenticated")
    page = nobody.get(f"{PREFIX}/dead?task=a%20b", follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=%2Fjobs%2Fdead%3Ftask%3Da%2520b"
    assert nobody.get(page.headers["location"]).json() == {"page": "the site's own sign-in"}
    assert nobody.get(f"{PREFIX}/login", follow_redirects=False).status_code == 303
    posted = nobody.post(f"{PREFIX}/jobs/{ready_job}/cancel", data={"csrf": "x"})
    assert posted.status_code == 401
    # pgjobs' own tokens are no way in: neither the header nor the login form.
    header = nobody.get(f"{PREFIX}/api/v1/jobs/{ready_job}", headers={"Authorization": TOKEN})
    assert_error(header, 401, "unauthenticated")
    assert nobody.post(f"{PREFIX}/login", data={"token": TOKEN}).status_code == 404
    # Without a sign_in_url, a page says to sign in (401).
    with TestClient(make_hosted(sign_in_url=None)) as bare:
        refused = bare.get(f"{PREFIX}/", follow_redirects=False)
        assert refused.status_code == 401 and "Sign in to the application" in refused.text
    # The probes and the API's reference need nobody.
    assert nobody.get(f"{PREFIX}/healthz").status_code == 200
    assert nobody.get(f"{PREFIX}/api/v1/openapi.json").status_code == 200


def test_the_csrf_token_is_still_checked_under_the_sites_sign_in(
    alice: TestClient, site: FastAPI, conn: psycopg.Connection[Any], ready_job: int
) -> None:
    """The site's cookie goes with any site's form: the dashboard's token must come too, and
    be the one shown to this principal in this browser."""
    for fields in ({}, {"csrf": "0" * 64}):
        refused = alice.post(f"{PREFIX}/jobs/{ready_job}/cancel", data=fields)
        assert refused.status_code == 403 and "CSRF" in refused.text
    # Bob's token, in Bob's browser: not Alice's, even were it to leak to her page.
    with _as(site, "s-bob") as bob:
        assert bob.get(f"{PREFIX}/jobs/{ready_job}").status_code == 200
        bobs = _valid_csrf(bob, "bob@example.com")
    assert alice.post(f"{PREFIX}/jobs/{ready_job}/cancel", data={"csrf": bobs}).status_code == 403
    # Alice's token from another browser of hers (another pgjobs_csrf cookie): refused too.
    with _as(site, "s-alice") as elsewhere:
        other = csrf_of(elsewhere.get(f"{PREFIX}/jobs/{ready_job}").text)
    mine = csrf_of(alice.get(f"{PREFIX}/jobs/{ready_job}").text)
    assert other != mine
    assert alice.post(f"{PREFIX}/jobs/{ready_job}/cancel", data={"csrf": other}).status_code == 403
    assert status_of(conn, ready_job) == "queued"
    assert alice.post(f"{PREFIX}/jobs/{ready_job}/cancel", data={"csrf": mine}).status_code == 200
    assert status_of(conn, ready_job) == "cancelled"


# -- the prefix ---------------------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.gets: set[str] = set()
        self.posts: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("a", "link") and found.get("href"):
            self.gets.add(str(found["href"]))
        elif tag in ("script", "img") and found.get("src"):
            self.gets.add(str(found["src"]))
        elif tag == "form" and found.get("action"):
            method = (found.get("method") or "get").lower()
            (self.posts if method == "post" else self.gets).add(str(found["action"]))


def test_every_link_asset_and_form_carries_the_prefix_and_answers(
    alice: TestClient, make_app: Callable[..., App], conn: psycopg.Connection[Any]
) -> None:
    """Crawl the dashboard from its overview: every href, src and form action is under /jobs
    and every one a browser would GET answers 200."""
    app = make_app()
    app.enqueue("emails.send", {"n": 1}, queue="mail")
    bury(conn, 1, task="images.resize", error=lambda n: "disk full")
    seen: set[str] = set()
    posts: set[str] = set()
    todo = [f"{PREFIX}/"]
    while todo and len(seen) < 60:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        answer = alice.get(url)
        assert answer.status_code == 200, (url, answer.status_code)
        if not answer.headers["content-type"].startswith("text/html"):
            continue
        links = _Links()
        links.feed(answer.text)
        for link in links.gets | links.posts:
            if link.startswith("#"):
                continue
            assert link.startswith(f"{PREFIX}/"), (url, link)
        posts |= links.posts
        for link in links.gets:
            if not link.startswith("#"):
                todo.append(urlsplit(urljoin(url, link))._replace(fragment="").geturl())
    assert {f"{PREFIX}/dead", f"{PREFIX}/schedules", f"{PREFIX}/queues/mail"} <= seen
    assert any(s.startswith(f"{PREFIX}/static/") for s in seen), seen
    assert any(p.endswith("/cancel") or p.endswith("/redrive") for p in posts), posts
    # The CSRF cookie is the dashboard's, scoped to its path.
    cookie = alice.get(f"{PREFIX}/").headers.get("set-cookie", "")
    assert "pgjobs_csrf=" in cookie or "pgjobs_csrf" in alice.cookies
    fresh = TestClient(alice.app)
    fresh.cookies.set("site_session", "s-alice")
    set_cookie = fresh.get(f"{PREFIX}/").headers["set-cookie"].lower()
    assert "pgjobs_csrf=" in set_cookie and "path=/jobs/" in set_cookie


def test_the_api_reference_works_under_the_prefix(nobody: TestClient) -> None:
    docs = nobody.get(f"{PREFIX}/api/v1/docs")
    assert docs.status_code == 200
    urls = re.findall(r"(?:url|href|src)[=:] ?['\"]([^'\"]+)['\"]", docs.text)
    assert f"{PREFIX}/api/v1/openapi.json" in urls, urls
    for url in urls:
        if url.startswith(f"{PREFIX}/"):
            assert nobody.get(url).status_code == 200, url
    document = nobody.get(f"{PREFIX}/api/v1/openapi.json").json()
    assert document["servers"] == [{"url": PREFIX}]


# -- a broken sign-in, bad settings -------------------------------------------------------------


def _raises(request: Request) -> Principal | None:
    raise RuntimeError("the user database is down")


def _wrong(request: Request) -> Any:
    return "alice"


@pytest.mark.parametrize("auth", [_raises, _wrong])
def test_a_broken_sign_in_lets_nobody_in(
    make_hosted: Callable[..., FastAPI], auth: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with TestClient(make_hosted(auth=auth)) as client:
        client.cookies.set("site_session", "s-alice")
        for path in ("/api/v1/jobs/1/cancel", "/"):
            answer = client.post(PREFIX + path, json={})
            assert_error(answer, 500, "internal_error")
    assert "the auth callable" in caplog.text


async def _async_principal(request: Request) -> Principal | None:
    return Principal("carol", Role.OPERATE) if request.headers.get("x-carol") else None


def test_a_coroutine_function_is_awaited(
    make_hosted: Callable[..., FastAPI], ready_job: int
) -> None:
    with TestClient(make_hosted(auth=_async_principal)) as client:
        assert client.get(f"{PREFIX}/api/v1/jobs/{ready_job}").status_code == 401
        answer = client.post(f"{PREFIX}/api/v1/jobs/{ready_job}/cancel", headers={"x-carol": "1"})
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"auth": site_principal, "tokens": [TOKEN]}, "auth"),
        ({"auth": site_principal, "insecure_no_auth": True}, "auth"),
        ({"auth": "site_principal"}, "auth"),
        ({"auth": site_principal, "sign_in_url": "//evil.example/login"}, "sign_in_url"),
        ({"auth": site_principal, "sign_in_url": "login"}, "sign_in_url"),
        ({"tokens": [TOKEN], "sign_in_url": "/login"}, "sign_in_url"),
    ],
)
def test_settings_that_do_not_go_together_are_refused(
    dsn: Dsn, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        create_app(dsn=dsn, **options)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("name", "role"),
    [("", "read"), (" ", "read"), ("a\x00b", "read"), ("x" * 1001, "read"), ("a", "admin")],
)
def test_a_principal_is_a_name_and_a_known_role(name: str, role: str) -> None:
    with pytest.raises(ConfigurationError):
        Principal(name, role)  # type: ignore[arg-type]
    assert Principal("a", "read").role is Role.READ  # type: ignore[arg-type]


def test_the_environments_tokens_are_not_a_way_in_under_the_sites_sign_in(
    monkeypatch: pytest.MonkeyPatch, make_hosted: Callable[..., FastAPI], ready_job: int
) -> None:
    monkeypatch.setenv("PGJOBS_API_TOKENS", TOKEN)
    with TestClient(make_hosted()) as client:
        answer = client.get(
            f"{PREFIX}/api/v1/jobs/{ready_job}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert_error(answer, 401, "unauthenticated")
