"""The frame every dashboard page and action shares: who is looking (sessions, tokens), the
layout and its templates, the static assets, the connection of a request, and how a page or an
action turns pgjobs' errors into a page that says what happened.

Pages are server-rendered HTML (jinja2, autoescaped) that read the same functions as the API and
the CLI (``pgjobs.stats``, ``pgjobs.admin``, ``pgjobs.browse``); a page works with JavaScript off,
and the small script of ``static/`` adds the overview's refresh and confirmations. Every action is
a POST that checks the session's CSRF token first, then that the token may act (a read-only
token may not), does one thing, and redirects (303) to a page that says what happened.

Handlers are plain functions: FastAPI runs them in its thread pool, each on one connection of
the server's pool for the length of the request.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote, urlencode

import psycopg
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from pgjobs import db
from pgjobs.errors import (
    BatchNotFound,
    ConfigurationError,
    DatabaseUnavailable,
    JobNotFound,
    JobStateConflict,
    LockTimeout,
    PgjobsError,
    SchemaMissing,
)
from pgjobs.tasks import Task
from pgjobs.text import printable
from pgjobs.web.auth import Tokens
from pgjobs.web.dashboard import forms, text
from pgjobs.web.dashboard.security import (
    CSRF_FIELD,
    FLASH_COOKIE,
    SESSION_COOKIE,
    Flasher,
    Refusal,
    Via,
    Viewer,
    clear_cookie,
    flash,
    host_key,
    identify,
    security_headers,
    take_flash,
    take_new_cookie,
)
from pgjobs.web.dashboard.sessions import Sessions
from pgjobs.web.principal import principal_of
from pgjobs.web.throttle import SignInThrottle, client_address, too_many_message

if TYPE_CHECKING:
    import jinja2

logger = logging.getLogger("pgjobs.web.dashboard")

#: Where a request gets a database connection for its length: the server's pool.
ConnectionSource = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]

#: Seconds between two refreshes of the overview (the script pauses while the tab is hidden).
REFRESH_SECONDS = 5
#: Jobs a listing shows per page.
PAGE_SIZE = 50
#: Seconds a database that cannot serve asks a browser to wait (``Retry-After``).
RETRY_AFTER = 5

#: A route of a page group: its path, its handler and its HTTP methods.
Route = tuple[str, Callable[..., Any], list[str]]
GET = ["GET", "HEAD"]
POST = ["POST"]

_STATIC_TYPES = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _load_static() -> dict[str, tuple[bytes, str]]:
    files = resources.files("pgjobs.web.dashboard") / "static"
    loaded = {}
    for name in _STATIC_TYPES:
        body = (files / name).read_bytes()
        loaded[name] = (body, hashlib.sha256(body).hexdigest()[:12])
    return loaded


def _environment() -> jinja2.Environment:
    import jinja2  # ~2 MiB resident: a server that only serves the API never loads it

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgjobs.web.dashboard", "templates"),
        # Every value is escaped unless a template says otherwise (none does): job data may
        # hold HTML.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        printable=printable,
        pretty_json=text.pretty_json,
        shown=text.shown,
        expired=text.expired,
        when=text.when,
        progress_time=text.progress_time,
        iso=text.iso,
        age=text.age,
        number=text.number,
        rate=text.rate,
        queue_limits=text.queue_limits,
        urlpart=lambda value: quote(str(value), safe=""),
    )
    return env


@dataclass(frozen=True, slots=True)
class BadForm:
    status: int
    message: str


async def _posted(request: Request) -> dict[str, str] | BadForm:
    """A posted form's fields, read up to ``forms.MAX_FORM_BYTES``; an empty body is an empty
    form (whose CSRF check then fails)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > forms.MAX_FORM_BYTES:
            return BadForm(413, f"a form may hold {forms.MAX_FORM_BYTES:,} bytes at most")
    if not body:
        return {}
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return BadForm(415, "the dashboard takes HTML forms (application/x-www-form-urlencoded)")
    try:
        return forms.parse_form(bytes(body))
    except ConfigurationError as exc:
        return BadForm(400, str(exc))


Posted = dict[str, str] | BadForm
#: A handler's parameter that receives the posted form.
PostedForm = Annotated[Posted, Depends(_posted)]


def _status_of(exc: PgjobsError) -> int:
    if isinstance(exc, ConfigurationError):
        return 422
    if isinstance(exc, JobNotFound | BatchNotFound):
        return 404
    if isinstance(exc, JobStateConflict):
        return 409
    if isinstance(exc, DatabaseUnavailable | LockTimeout | SchemaMissing):
        return 503
    return 500


class Frame:
    """The dashboard of one server as its pages see it: where it reads, who may look, and its
    templates. Each page group holds the frame and answers through it."""

    def __init__(
        self,
        connection: ConnectionSource,
        *,
        reading: ConnectionSource | None = None,
        tokens: Tokens,
        insecure_no_auth: bool = False,
        sessions: Sessions | None = None,
        throttle: SignInThrottle | None = None,
        group_limits: Mapping[str, int] | None = None,
        ordered_tasks: Mapping[str, bool | str] | None = None,
        hosted: bool = False,
        sign_in_url: str | None = None,
        tasks: Mapping[str, Task] | None = None,
    ) -> None:
        if not tokens.configured and not insecure_no_auth and not hosted:
            raise ConfigurationError(
                "the dashboard needs API tokens to log in with, or insecure_no_auth=True"
            )
        self._connection = connection
        #: Where the pages read (a standby), when not ``connection``: each page then says how
        #: far behind it is.
        self._reading = reading
        self.tokens = tokens
        self.insecure = insecure_no_auth
        #: Whether the host application signs browsers in (``create_app(auth=...)``): pgjobs'
        #: tokens, sessions and login form are then unused.
        self.hosted = hosted
        #: Where a browser the host did not sign in is sent (None: a 401 page).
        self.sign_in_url = sign_in_url
        #: The signed-in browsers (their cookies hold a session id, never a token).
        self.sessions = sessions if sessions is not None else Sessions()
        #: Failed tokens per client address (the API's, when the server shares one).
        self.throttle = throttle if throttle is not None else SignInThrottle()
        #: The app's tasks' own group limits (``groups.task_limits``): which groups are at
        #: their limit, beside their queue's group_concurrency.
        self.group_limits = dict(group_limits or {})
        #: The app's ordered tasks (``groups.ordered_tasks``): what holds their groups.
        self.ordered_tasks = dict(ordered_tasks or {})
        #: The app's tasks, when the server has the app: an edited payload is checked by them.
        self.tasks = tasks
        #: The templates' environment, made by the first page shown (``render``).
        self._env: jinja2.Environment | None = None
        self._static = _load_static()
        self._flasher = Flasher()

    def identify(self, request: Request) -> Viewer | Refusal:
        """The request's viewer, by its session or bearer token, or why it has none. A bearer
        token that fails counts against the client's address (``throttled``). Under the host's
        sign-in, the principal it found (``pgjobs.web.hosted``), and nothing else."""
        if self.hosted:
            principal = principal_of(request.scope)
            if principal is None:
                return Refusal.ANONYMOUS
            return Viewer(
                principal.access,
                Via.HOST,
                host_key(request, principal.name),
                principal.key,
                principal.name,
            )
        bearer = request.headers.get("authorization") is not None and self.tokens.configured
        if bearer and self.throttled(request, self.throttle.wait(self.client(request))):
            return Refusal.THROTTLED
        found = identify(request, self.tokens, self.sessions, self.insecure)
        if bearer and found is Refusal.BAD_TOKEN:
            if self.throttled(request, self.throttle.failed(self.client(request))):
                return Refusal.THROTTLED
        elif bearer and isinstance(found, Viewer):
            self.throttle.succeeded(self.client(request))
        return found

    @staticmethod
    def client(request: Request) -> str:
        return client_address(request.scope.get("client"))

    @staticmethod
    def throttled(request: Request, wait: int | None) -> bool:
        """Whether the client must wait; the seconds go to the answer's ``Retry-After``."""
        if wait is None:
            return False
        request.state.retry_after = wait
        return True

    def too_many(self, request: Request, viewer: Viewer | None = None) -> HTMLResponse:
        """429: the client failed too often; the page and ``Retry-After`` say how long to wait."""
        wait = int(getattr(request.state, "retry_after", 1))
        return self.error(request, viewer, 429, "Too many attempts", too_many_message(wait))

    # -- answering --------------------------------------------------------------------------------

    @contextmanager
    def db(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the server's pool, for one request or one batch of a bulk action."""
        with self._connection() as conn:
            yield conn

    @staticmethod
    def base(request: Request) -> str:
        """Where the dashboard is mounted ("" at the root): every link starts with it."""
        return str(request.scope.get("root_path") or "").rstrip("/")

    def render(
        self,
        request: Request,
        viewer: Viewer | None,
        template: str,
        *,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        """``template`` in the layout, for ``viewer``, with the flash message to show once."""
        base = self.base(request)
        context.setdefault("page", "")
        shown_flash = take_flash(request, self._flasher)
        if self._env is None:
            self._env = _environment()
        page = self._env.get_template(template).render(
            base=base,
            viewer=viewer,
            can_act=viewer is not None and viewer.can_act,
            csrf=viewer.csrf_token if viewer is not None else "",
            csrf_field=CSRF_FIELD,
            insecure=self.insecure,
            via_cookie=viewer is not None and viewer.via is Via.COOKIE,
            flash=shown_flash,
            static={name: f"{base}/static/{name}?v={v}" for name, (_, v) in self._static.items()},
            refresh_seconds=REFRESH_SECONDS,
            replica=getattr(request.state, "replica", None),
            **context,
        )
        response = HTMLResponse(page, status_code=status)
        if shown_flash is not None:
            clear_cookie(response, request, FLASH_COOKIE)
        if status == 503:
            response.headers["Retry-After"] = str(RETRY_AFTER)
        elif status == 429:
            response.headers["Retry-After"] = str(getattr(request.state, "retry_after", 1))
        take_new_cookie(request, response)
        return security_headers(response)

    def redirect(self, request: Request, path: str) -> RedirectResponse:
        """See other (303): ``path`` under the dashboard's base."""
        response = RedirectResponse(self.base(request) + path, status_code=303)
        take_new_cookie(request, response)
        security_headers(response)
        return response

    def error(
        self, request: Request, viewer: Viewer | None, status: int, title: str, message: str
    ) -> HTMLResponse:
        """A page that says what went wrong, with ``status``."""
        return self.render(
            request, viewer, "error.html", status=status, title=title, message=message
        )

    def viewer(self, request: Request) -> Viewer | Response:
        """The request's viewer, or the answer for one that has none: the login page for a
        browser, 401 for a bad bearer token."""
        found = self.identify(request)
        if isinstance(found, Viewer):
            return found
        if self.hosted:
            return self.not_signed_in(request)
        if found is Refusal.THROTTLED:
            return self.too_many(request)
        if found is Refusal.BAD_TOKEN and request.headers.get("authorization") is not None:
            refused = self.error(
                request, None, 401, "Not signed in", "The token of this request is not valid."
            )
            refused.headers["WWW-Authenticate"] = "Bearer"
            return refused
        target = request.url.path[len(self.base(request)) :] or "/"
        if request.url.query:
            target += "?" + request.url.query
        response = self.redirect(request, "/login?" + urlencode({"next": target}))
        if found is Refusal.BAD_TOKEN:  # a session that ended or expired
            clear_cookie(response, request, SESSION_COOKIE)
        return response

    def not_signed_in(self, request: Request) -> Response:
        """A browser the host did not sign in: to the host's ``sign_in_url`` with ``next`` (the
        page it asked for, prefix included), else a 401 page."""
        if self.sign_in_url is None:
            return self.error(
                request, None, 401, "Not signed in", "Sign in to the application first."
            )
        wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        joiner = "&" if "?" in self.sign_in_url else "?"
        response = RedirectResponse(
            self.sign_in_url + joiner + urlencode({"next": wanted}), status_code=303
        )
        return security_headers(response)

    def page(
        self, request: Request, build: Callable[[Viewer, psycopg.Connection[Any]], Response]
    ) -> Response:
        """A page: the viewer, a connection, and every pgjobs error as a page that says it."""
        viewer = self.viewer(request)
        if isinstance(viewer, Response):
            return viewer
        try:
            if self._reading is None:
                with self.db() as conn:
                    return build(viewer, conn)
            with self._reading() as conn:
                request.state.replica = db.replica_status(conn)
                return build(viewer, conn)
        except PgjobsError as exc:
            status = _status_of(exc)
            title = {404: "Not found", 422: "Bad filter", 503: "Database unavailable"}
            return self.error(
                request, viewer, status, title.get(status, "Refused"), printable(str(exc))
            )
        except Exception:
            logger.exception("dashboard page %s failed", request.url.path)
            return self.error(
                request, viewer, 500, "Internal error", "The page failed; the server logged why."
            )

    def act(
        self,
        request: Request,
        posted: Posted,
        back: str,
        act: Callable[[Viewer, dict[str, str], psycopg.Connection[Any]], tuple[str, str]],
    ) -> Response:
        """An action: refused (403, nothing done) without a valid CSRF token or with a read-only
        token; else ``act`` runs and the browser is sent to the page it names (or ``back``) with
        a message saying what happened, or what refused it."""
        found = self.identify(request)
        if found is Refusal.THROTTLED:
            return self.too_many(request)
        if not isinstance(found, Viewer):
            status = 401 if self.hosted else 403
            return self.error(
                request, None, status, "Refused", "Sign in first; nothing was changed."
            )
        viewer = found
        if isinstance(posted, BadForm):
            return self.error(request, viewer, posted.status, "Refused", posted.message)
        if not viewer.csrf_ok(posted.get(CSRF_FIELD)):
            return self.error(
                request,
                viewer,
                403,
                "Refused",
                "This form is stale or did not come from this dashboard (its CSRF token does not "
                "match your session); nothing was changed. Reload the page and try again.",
            )
        if not viewer.can_act:
            return self.error(
                request,
                viewer,
                403,
                "Refused",
                "Your role is read: it may look, not act; nothing was changed."
                if self.hosted
                else "A read-only token may look, not act; nothing was changed.",
            )
        try:
            with self.db() as conn:
                target, message = act(viewer, posted, conn)
            kind = "ok"
            if viewer.name is not None:
                logger.info("%s (by %s)", message, viewer.name)
        except PgjobsError as exc:
            if _status_of(exc) == 503:
                return self.error(request, viewer, 503, "Database unavailable", printable(str(exc)))
            target, kind, message = back, "error", str(exc)
        except Exception:
            logger.exception("dashboard action %s failed", request.url.path)
            return self.error(
                request, viewer, 500, "Internal error", "The action failed; the server logged why."
            )
        response = self.redirect(request, target)
        flash(response, request, self._flasher, kind, message)
        return response

    # -- static files ----------------------------------------------------------------------------

    def static(self, name: str) -> Response:
        """The dashboard's stylesheet, script and icon (no CDN: it works offline)."""
        found = self._static.get(name)
        if found is None:
            return Response("not found", status_code=404, media_type="text/plain")
        body, _ = found
        response = Response(body, media_type=_STATIC_TYPES[name])
        # Their URLs carry a hash of their content, so they may be kept.
        response.headers["Cache-Control"] = "public, max-age=86400, immutable"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response
