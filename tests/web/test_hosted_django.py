"""pgjobs mounted in a Django ASGI site under Django's own sessions: the site's sign-in view
writes the user into ``request.session`` (signed-cookie sessions: no table needed), and the
``auth`` given to pgjobs reads that session back from the request's cookie. The site routes
``/jobs/...`` to pgjobs with the prefix as the scope's ``root_path``, as Starlette's ``Mount``
does, and everything else to Django: docs/snippets/django_asgi.py, as the dashboard's page
shows it. Settings are made here, no project folder."""

from __future__ import annotations

import runpy
import types
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from pgjobs import App, queues
from pgjobs.db.dsn import Dsn
from pgjobs.web import Principal, create_app
from tests.support.helpers import REPO, database_name
from tests.web.conftest import TestClient, assert_error
from tests.web.dashboard.conftest import csrf_of, status_of

django = pytest.importorskip("django")

PREFIX = "/jobs"
SECRET_KEY = "test-secret-key-of-the-django-site-0123456789"


def _configure(dsn: Dsn) -> None:
    """Django's settings for this process, once: the same database settings the Django example
    of tests/integration/docs makes (so either may come first); what this test needs beyond
    them is overridden per test."""
    from django.conf import settings

    if settings.configured:
        # Signed sessions need a key; Django reads it again when an override ends, so it is
        # set for the process (the example of tests/integration/docs uses none).
        if not getattr(settings._wrapped, "SECRET_KEY", ""):
            settings.SECRET_KEY = SECRET_KEY
        return
    url = urlsplit(dsn.url)
    query = parse_qs(url.query)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": database_name(dsn.url),
                "USER": url.username or "",
                "PASSWORD": url.password or "",
                "HOST": url.hostname or query.get("host", [""])[0],
                "PORT": str(url.port or ""),
            }
        },
        USE_TZ=True,
        SECRET_KEY=SECRET_KEY,
    )
    django.setup()


def django_principal(request: Request) -> Principal | None:
    """The ``auth`` a Django site gives pgjobs: the user its session holds, read with Django's
    own session store from Django's session cookie."""
    from django.conf import settings
    from django.contrib.sessions.backends.signed_cookies import SessionStore

    key = request.cookies.get(settings.SESSION_COOKIE_NAME)
    if not key:
        return None
    user = SessionStore(session_key=key).load().get("user")
    return None if user is None else Principal(user["name"], user["role"])


def _sign_in(request: Any, name: str, role: str) -> Any:
    """The site's sign-in view (here: whoever the URL names)."""
    from django.http import HttpResponse

    request.session["user"] = {"name": name, "role": role}
    return HttpResponse("signed in")


@pytest.fixture
def django_site(dsn: Dsn) -> Iterator[Callable[[Scope, Receive, Send], Any]]:
    _configure(dsn)
    from django.core.handlers.asgi import ASGIHandler
    from django.test.utils import override_settings
    from django.urls import path

    urls = types.ModuleType("site_urls")  # the site's URLconf
    urls.urlpatterns = [path("signin/<name>/<role>", _sign_in)]  # type: ignore[attr-defined]
    jobs = create_app(dsn=dsn, pool_size=2, auth=django_principal, sign_in_url="/accounts/login/")
    with override_settings(
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF=urls,
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware"],
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
    ):
        yield _snippet()["mounted"](PREFIX, jobs, ASGIHandler())
    jobs.state.pgjobs.close()


def _snippet() -> dict[str, Any]:
    """docs/snippets/django_asgi.py, which the dashboard's page shows."""
    return runpy.run_path(str(REPO / "docs" / "snippets" / "django_asgi.py"))


def _signed_in(site: Any, name: str, role: str) -> TestClient:
    client = TestClient(site)
    assert client.get(f"/signin/{name}/{role}").status_code == 200
    return client


def test_django_sessions_decide_who_may_look_and_who_may_act(
    django_site: Any, conn: psycopg.Connection[Any], make_app: Callable[..., App]
) -> None:
    job = make_app().enqueue("emails.send", {"to": "a@example.com"}, queue="mail")
    nobody = TestClient(django_site)
    assert_error(nobody.get(f"{PREFIX}/api/v1/jobs/{job}"), 401, "unauthenticated")
    page = nobody.get(f"{PREFIX}/queues/mail", follow_redirects=False)
    assert page.headers["location"] == "/accounts/login/?next=%2Fjobs%2Fqueues%2Fmail"

    reader = _signed_in(django_site, "bob", "read")
    assert reader.get(f"{PREFIX}/api/v1/jobs/{job}").json()["id"] == job
    shown = reader.get(f"{PREFIX}/queues/mail")
    assert shown.status_code == 200 and "bob" in shown.text
    assert_error(reader.post(f"{PREFIX}/api/v1/jobs/{job}/cancel"), 403, "forbidden")

    operator = _signed_in(django_site, "alice", "operate")
    page = operator.get(f"{PREFIX}/queues/mail")
    assert f'action="{PREFIX}/queues/mail/pause"' in page.text
    assert f"{PREFIX}/static/dashboard.css" in page.text
    refused = operator.post(f"{PREFIX}/queues/mail/pause", data={"reason": "no token"})
    assert refused.status_code == 403 and not queues.queue(conn, "mail").paused
    paused = operator.post(
        f"{PREFIX}/queues/mail/pause",
        data={"csrf": csrf_of(page.text)},
        follow_redirects=False,
    )
    assert paused.headers["location"] == f"{PREFIX}/queues/mail"
    assert queues.queue(conn, "mail").paused_by == "alice"
    assert operator.post(f"{PREFIX}/api/v1/jobs/{job}/cancel").status_code == 200
    assert status_of(conn, job) == "cancelled"
    # The server's start and stop go to pgjobs (Django's handler refuses a lifespan).
    with TestClient(django_site) as served:
        assert served.get(f"{PREFIX}/healthz").status_code == 200
