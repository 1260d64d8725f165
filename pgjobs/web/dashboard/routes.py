"""The dashboard's pages and actions, as routes of a FastAPI router that ``create_app`` includes
beside the API.

Pages are server-rendered HTML (jinja2, autoescaped) that read the same functions as the API and
the CLI (``pgjobs.stats``, ``pgjobs.admin``, ``pgjobs.browse``); a page works with JavaScript off,
and the small script of ``static/`` adds the overview's refresh and confirmations. Every action is
a POST that checks the session's CSRF token first, then that the token may act (a read-only
token may not), does one thing, and redirects (303) to a page that says what happened. A bulk
redrive or purge of more than one batch is the exception that takes time: it runs in the
background (``actions``) and redirects to its progress page, ``/dead/actions/{id}``.

Handlers are plain functions: FastAPI runs them in its thread pool, each on one connection of
the server's pool for the length of the request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import jinja2
import psycopg
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from pgjobs import admin, browse, queues
from pgjobs.admin import DeadFilter, DeadSelection
from pgjobs.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    JobNotFound,
    JobStateConflict,
    LockTimeout,
    PgjobsError,
    SchemaMissing,
)
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import DeadReason, JobHistory, JobStatus
from pgjobs.submission import check_name
from pgjobs.web.auth import Tokens
from pgjobs.web.dashboard import actions, data, forms, text
from pgjobs.web.dashboard.security import (
    CSRF_FIELD,
    FLASH_COOKIE,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Flasher,
    Refusal,
    Via,
    Viewer,
    anonymous_key,
    clear_cookie,
    csrf_matches,
    csrf_token,
    flash,
    identify,
    security_headers,
    set_cookie,
    take_flash,
    take_new_cookie,
)

logger = logging.getLogger("pgjobs.web.dashboard")

#: Where a request gets a database connection for its length: the server's pool.
ConnectionSource = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]

#: Seconds between two refreshes of the overview (the script pauses while the tab is hidden).
REFRESH_SECONDS = 5
#: Jobs a listing shows per page.
PAGE_SIZE = 50
#: How far back a queue's page lists its jobs.
QUEUE_PAGE_WINDOW = timedelta(days=1)
#: Seconds a database that cannot serve asks a browser to wait (``Retry-After``).
RETRY_AFTER = 5
#: Dead jobs a bulk redrive or purge moves per transaction. A set of more than one batch runs
#: in the background (``actions``), followed by its progress page.
BATCH_SIZE = admin.DEFAULT_BATCH_SIZE
#: Seconds between two reads of a running action's progress by the page's script; without
#: the script, the page reloads itself every ``PROGRESS_RELOAD_SECONDS``.
PROGRESS_SECONDS = 1
PROGRESS_RELOAD_SECONDS = 2
#: Seconds a stopping server waits for running bulk actions to end their batch in flight.
SHUTDOWN_WAIT = 10.0

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
        printable=text.printable,
        pretty_json=text.pretty_json,
        when=text.when,
        iso=text.iso,
        age=text.age,
        number=text.number,
        rate=text.rate,
        queue_limits=text.queue_limits,
        estimate=text.estimate,
        urlpart=lambda value: quote(str(value), safe=""),
    )
    return env


@dataclass(frozen=True, slots=True)
class _BadForm:
    status: int
    message: str


async def _posted(request: Request) -> dict[str, str] | _BadForm:
    """A posted form's fields, read up to ``forms.MAX_FORM_BYTES``; an empty body is an empty
    form (whose CSRF check then fails)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > forms.MAX_FORM_BYTES:
            return _BadForm(413, f"a form may hold {forms.MAX_FORM_BYTES:,} bytes at most")
    if not body:
        return {}
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return _BadForm(415, "the dashboard takes HTML forms (application/x-www-form-urlencoded)")
    try:
        return forms.parse_form(bytes(body))
    except ConfigurationError as exc:
        return _BadForm(400, str(exc))


Posted = dict[str, str] | _BadForm
#: A handler's parameter that receives the posted form.
PostedForm = Annotated[Posted, Depends(_posted)]


def _status_of(exc: PgjobsError) -> int:
    if isinstance(exc, ConfigurationError):
        return 422
    if isinstance(exc, JobNotFound):
        return 404
    if isinstance(exc, JobStateConflict):
        return 409
    if isinstance(exc, DatabaseUnavailable | LockTimeout | SchemaMissing):
        return 503
    return 500


class Dashboard:
    """The dashboard of one server: where it reads, who may look, and its templates."""

    def __init__(
        self, connection: ConnectionSource, *, tokens: Tokens, insecure_no_auth: bool = False
    ) -> None:
        if not tokens.configured and not insecure_no_auth:
            raise ConfigurationError(
                "the dashboard needs API tokens to log in with, or insecure_no_auth=True"
            )
        self._connection = connection
        self._tokens = tokens
        self._insecure = insecure_no_auth
        self._env = _environment()
        self._static = _load_static()
        self._flasher = Flasher()
        self._actions = actions.Actions()

    # -- the router ------------------------------------------------------------------------------

    def router(self) -> APIRouter:
        """The dashboard's routes; every one is left out of the API's OpenAPI document."""
        router = APIRouter(include_in_schema=False, lifespan=self._lifespan)
        get, post = ["GET", "HEAD"], ["POST"]
        routes: list[tuple[str, Callable[..., Any], list[str]]] = [
            ("/", self.overview, get),
            ("/partials/overview", self.overview_partial, get),
            ("/dead", self.dead, get),
            ("/dead/confirm", self.dead_confirm, get),
            ("/dead/bulk", self.dead_bulk, post),
            ("/dead/actions/{action_id}", self.dead_action, get),
            ("/partials/actions/{action_id}", self.dead_action_partial, get),
            ("/jobs", self.jobs, get),
            ("/jobs/{job_id}", self.job, get),
            ("/jobs/{job_id}/{action}", self.job_action, post),
            ("/queues/{name}", self.queue, get),
            ("/queues/{name}/{action}", self.queue_action, post),
            ("/login", self.login_page, get),
            ("/login", self.login, post),
            ("/logout", self.logout, post),
            ("/static/{name}", self.static, get),
        ]
        for path, endpoint, methods in routes:
            router.add_api_route(path, endpoint, methods=methods, response_class=HTMLResponse)
        return router

    @asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Bulk actions run while the server serves; a stopping server starts no more batches
        and gives the batches in flight ``SHUTDOWN_WAIT`` seconds to commit (each batch is one
        transaction: one that does not end in time is rolled back when the process exits)."""
        self._actions.resume()
        try:
            yield
        finally:
            await asyncio.to_thread(self._actions.stop, SHUTDOWN_WAIT)

    # -- plumbing --------------------------------------------------------------------------------

    @contextmanager
    def _db(self) -> Iterator[psycopg.Connection[Any]]:
        with self._connection() as conn:
            yield conn

    @staticmethod
    def _base(request: Request) -> str:
        return str(request.scope.get("root_path") or "").rstrip("/")

    def _render(
        self,
        request: Request,
        viewer: Viewer | None,
        template: str,
        *,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        base = self._base(request)
        context.setdefault("page", "")
        shown_flash = take_flash(request, self._flasher)
        page = self._env.get_template(template).render(
            base=base,
            viewer=viewer,
            can_act=viewer is not None and viewer.can_act,
            csrf=viewer.csrf_token if viewer is not None else "",
            csrf_field=CSRF_FIELD,
            insecure=self._insecure,
            via_cookie=viewer is not None and viewer.via is Via.COOKIE,
            flash=shown_flash,
            static={name: f"{base}/static/{name}?v={v}" for name, (_, v) in self._static.items()},
            refresh_seconds=REFRESH_SECONDS,
            **context,
        )
        response = HTMLResponse(page, status_code=status)
        if shown_flash is not None:
            clear_cookie(response, request, FLASH_COOKIE)
        if status == 503:
            response.headers["Retry-After"] = str(RETRY_AFTER)
        take_new_cookie(request, response)
        return security_headers(response)

    def _redirect(self, request: Request, path: str) -> RedirectResponse:
        response = RedirectResponse(self._base(request) + path, status_code=303)
        take_new_cookie(request, response)
        security_headers(response)
        return response

    def _error(
        self, request: Request, viewer: Viewer | None, status: int, title: str, message: str
    ) -> HTMLResponse:
        return self._render(
            request, viewer, "error.html", status=status, title=title, message=message
        )

    def _viewer(self, request: Request) -> Viewer | Response:
        """The request's viewer, or the answer for one that has none: the login page for a
        browser, 401 for a bad bearer token."""
        found = identify(request, self._tokens, self._insecure)
        if isinstance(found, Viewer):
            return found
        if found is Refusal.BAD_TOKEN and request.headers.get("authorization") is not None:
            refused = self._error(
                request, None, 401, "Not signed in", "The token of this request is not valid."
            )
            refused.headers["WWW-Authenticate"] = "Bearer"
            return refused
        target = request.url.path[len(self._base(request)) :] or "/"
        if request.url.query:
            target += "?" + request.url.query
        response = self._redirect(request, "/login?" + urlencode({"next": target}))
        if found is Refusal.BAD_TOKEN:  # a session whose token is no longer configured
            clear_cookie(response, request, SESSION_COOKIE)
        return response

    def _page(
        self, request: Request, build: Callable[[Viewer, psycopg.Connection[Any]], Response]
    ) -> Response:
        """A page: the viewer, a connection, and every pgjobs error as a page that says it."""
        viewer = self._viewer(request)
        if isinstance(viewer, Response):
            return viewer
        try:
            with self._db() as conn:
                return build(viewer, conn)
        except PgjobsError as exc:
            status = _status_of(exc)
            title = {404: "Not found", 422: "Bad filter", 503: "Database unavailable"}
            return self._error(
                request, viewer, status, title.get(status, "Refused"), text.printable(str(exc))
            )
        except Exception:
            logger.exception("dashboard page %s failed", request.url.path)
            return self._error(
                request, viewer, 500, "Internal error", "The page failed; the server logged why."
            )

    def _act(
        self,
        request: Request,
        posted: Posted,
        back: str,
        act: Callable[[Viewer, dict[str, str], psycopg.Connection[Any]], tuple[str, str]],
    ) -> Response:
        """An action: refused (403, nothing done) without a valid CSRF token or with a read-only
        token; else ``act`` runs and the browser is sent to the page it names (or ``back``) with
        a message saying what happened, or what refused it."""
        found = identify(request, self._tokens, self._insecure)
        if not isinstance(found, Viewer):
            return self._error(request, None, 403, "Refused", "Sign in first; nothing was changed.")
        viewer = found
        if isinstance(posted, _BadForm):
            return self._error(request, viewer, posted.status, "Refused", posted.message)
        if not viewer.csrf_ok(posted.get(CSRF_FIELD)):
            return self._error(
                request,
                viewer,
                403,
                "Refused",
                "This form is stale or did not come from this dashboard (its CSRF token does not "
                "match your session); nothing was changed. Reload the page and try again.",
            )
        if not viewer.can_act:
            return self._error(
                request,
                viewer,
                403,
                "Refused",
                "A read-only token may look, not act; nothing was changed.",
            )
        try:
            with self._db() as conn:
                target, message = act(viewer, posted, conn)
            kind = "ok"
        except PgjobsError as exc:
            if _status_of(exc) == 503:
                return self._error(
                    request, viewer, 503, "Database unavailable", text.printable(str(exc))
                )
            target, kind, message = back, "error", str(exc)
        except Exception:
            logger.exception("dashboard action %s failed", request.url.path)
            return self._error(
                request, viewer, 500, "Internal error", "The action failed; the server logged why."
            )
        response = self._redirect(request, target)
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

    # -- login ------------------------------------------------------------------------------------

    def login_page(self, request: Request) -> Response:
        nxt = forms.local_path(request.query_params.get("next"))
        if isinstance(identify(request, self._tokens, self._insecure), Viewer):
            return self._redirect(request, nxt)
        token = csrf_token(anonymous_key(request))
        return self._render(request, None, "login.html", login_csrf=token, next=nxt)

    def login(self, request: Request, posted: PostedForm) -> Response:
        if isinstance(posted, _BadForm):
            return self._error(request, None, posted.status, "Refused", posted.message)
        nxt = forms.local_path(posted.get("next"))
        key = anonymous_key(request)
        if not csrf_matches(key, posted.get(CSRF_FIELD)):
            return self._render(
                request,
                None,
                "login.html",
                status=403,
                login_csrf=csrf_token(key),
                next=nxt,
                error="The form was stale (or your browser refuses cookies); try again.",
            )
        token = posted.get("token", "").strip()
        if not token or self._tokens.access(token) is None:
            return self._render(
                request,
                None,
                "login.html",
                status=401,
                login_csrf=csrf_token(key),
                next=nxt,
                error="That token is not one this server accepts.",
            )
        response = self._redirect(request, nxt)
        set_cookie(response, request, SESSION_COOKIE, token, SESSION_SECONDS)
        return response

    def logout(self, request: Request, posted: PostedForm) -> Response:
        found = identify(request, self._tokens, self._insecure)
        if (
            isinstance(found, Viewer)
            and not isinstance(posted, _BadForm)
            and not found.csrf_ok(posted.get(CSRF_FIELD))
        ):
            return self._error(request, found, 403, "Refused", "Stale form; still signed in.")
        response = self._redirect(request, "/login")
        clear_cookie(response, request, SESSION_COOKIE)
        return response

    # -- overview --------------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            view = data.overview(conn)
            return self._render(request, viewer, "overview.html", page="overview", **_live(view))

        return self._page(request, build)

    def overview_partial(self, request: Request) -> Response:
        """The overview's live part alone, which the page's script swaps in."""
        found = identify(request, self._tokens, self._insecure)
        if not isinstance(found, Viewer):
            return security_headers(Response("signed out", status_code=401))

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            view = data.overview(conn)
            return self._render(request, viewer, "_overview_live.html", **_live(view))

        return self._page(request, build)

    # -- dead letters ----------------------------------------------------------------------------

    def dead(self, request: Request) -> Response:
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            try:
                query = forms.dead_query(params)
                before = _dead_cursor(params.get("before"))
            except ConfigurationError as exc:
                return self._render(
                    request,
                    viewer,
                    "dead.html",
                    status=422,
                    page="dead",
                    query=None,
                    raw={k: params.get(k, "") for k in forms.DEAD_FIELDS},
                    filter_error=str(exc),
                    filter_field=exc.field,
                    view=None,
                    reasons=list(DeadReason),
                )
            view = data.dead_view(
                conn,
                query.where,
                query.reason,
                before=before,
                all_groups=params.get("groups") == "all",
            )
            return self._render(
                request,
                viewer,
                "dead.html",
                page="dead",
                query=query,
                raw={k: query.raw.get(k, "") for k in forms.DEAD_FIELDS},
                filter_error=None,
                filter_field=None,
                view=view,
                reasons=list(DeadReason),
                count_cap=data.COUNT_CAP,
                cursor=browse.encode_cursor(*view.next_cursor) if view.next_cursor else "",
                group_sample=data.GROUP_SAMPLE,
                all_groups=params.get("groups") == "all",
            )

        return self._page(request, build)

    def dead_confirm(self, request: Request) -> Response:
        """What a bulk redrive or purge of the filtered set would move, counted exactly (the
        set is selected now and pinned: the action moves these jobs, not ones that fail
        later), and the form that does it."""
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            action = params.get("action")
            if action not in ("redrive", "purge"):
                raise ConfigurationError("action must be redrive or purge", field="action")
            query = forms.dead_query(params)
            selection = _select(conn, query.where, query.reason)
            # The form carries the moments as they are now, not "2h": the POST means this set.
            hidden = dict(query.raw)
            for name in ("since", "until"):
                if getattr(query.where, name) is not None:
                    hidden[name] = text.iso(getattr(query.where, name))
            return self._render(
                request,
                viewer,
                "dead_confirm.html",
                page="dead",
                action=action,
                query=query,
                count=selection.count if selection else 0,
                pinned=text.iso(selection.filter.until) if selection else "",
                sample=list(selection.ids[:20]) if selection else [],
                hidden=hidden,
                batch_size=BATCH_SIZE,
            )

        return self._page(request, build)

    def dead_bulk(self, request: Request, posted: PostedForm) -> Response:
        """Redrive or purge the dead jobs matching the posted filters. A purge, and any action
        that names ``expected``, runs only when the set pinned at confirmation still holds
        exactly ``expected`` jobs (else nothing moves and the page says so). A set of one batch
        is moved now; a larger one in the background, and the browser is sent to its progress
        page."""
        fields = posted if isinstance(posted, dict) else {}
        back = "/dead?" + urlencode(
            {k: fields[k] for k in forms.DEAD_FIELDS if fields.get(k, "").strip()}
        )

        def act(
            viewer: Viewer, form: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            def start(action: str, selection: DeadSelection, query: forms.DeadQuery) -> str:
                return self._start_bulk(viewer, action, selection, query)

            return _bulk(form, conn, start)

        return self._act(request, posted, back, act)

    def _start_bulk(
        self, viewer: Viewer, action: str, selection: DeadSelection, query: forms.DeadQuery
    ) -> str:
        """Start a bulk action in the background; its id."""
        run = admin.redrive_batches if action == "redrive" else admin.purge_batches

        def one_batch(batch: DeadSelection) -> int:
            # A pooled connection for this batch only: requests are not kept waiting for one
            # while a long action runs.
            with self._db() as conn:
                return sum(len(ids) for ids in run(conn, batch, batch_size=len(batch.ids)))

        return self._actions.start(
            viewer.csrf_key, action, selection, BATCH_SIZE, one_batch, query.raw
        )

    def dead_action(self, request: Request, action_id: str) -> Response:
        """The progress of a bulk action this session started: batches and jobs done of the
        pinned total, time elapsed, and how it ended. It reads no table (the action reports its
        own progress), so it answers while every pooled connection is busy."""
        viewer = self._viewer(request)
        if isinstance(viewer, Response):
            return viewer
        progress = self._actions.get(action_id, viewer.csrf_key)
        if progress is None:
            return self._error(request, viewer, 404, "Unknown action", _UNKNOWN_ACTION)
        return self._render(
            request,
            viewer,
            "dead_action.html",
            page="dead",
            **_progress_context(request, self._base(request), progress),
        )

    def dead_action_partial(self, request: Request, action_id: str) -> Response:
        """The progress page's live part alone, which its script swaps in."""
        found = identify(request, self._tokens, self._insecure)
        if not isinstance(found, Viewer):
            return security_headers(Response("signed out", status_code=401))
        progress = self._actions.get(action_id, found.csrf_key)
        if progress is None:
            return security_headers(Response(_UNKNOWN_ACTION, status_code=404))
        return self._render(
            request,
            found,
            "_action_live.html",
            **_progress_context(request, self._base(request), progress),
        )

    # -- jobs -------------------------------------------------------------------------------------

    def jobs(self, request: Request) -> Response:
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            find = (params.get("find") or "").strip()
            if find:
                found = _find(conn, find)
                if len(found) == 1:
                    return self._redirect(request, f"/jobs/{found[0]}")
                return self._render(
                    request,
                    viewer,
                    "jobs.html",
                    page="jobs",
                    find=find,
                    jobs=browse.jobs_by_id(conn, found),
                    query=None,
                    raw=dict.fromkeys(forms.JOB_FIELDS, ""),
                    next_cursor=None,
                    states=list(JobStatus),
                    filter_error=None,
                )
            try:
                query = forms.job_query(params)
                page = browse.jobs(
                    conn,
                    states=query.states,
                    queue=query.queue,
                    task=query.task,
                    since=query.since,
                    until=query.until,
                    limit=PAGE_SIZE,
                    cursor=params.get("cursor") or None,
                )
            except ConfigurationError as exc:
                return self._render(
                    request,
                    viewer,
                    "jobs.html",
                    status=422,
                    page="jobs",
                    find="",
                    jobs=[],
                    query=None,
                    raw={k: params.get(k, "") for k in forms.JOB_FIELDS},
                    next_cursor=None,
                    states=list(JobStatus),
                    filter_error=str(exc),
                )
            return self._render(
                request,
                viewer,
                "jobs.html",
                page="jobs",
                find="",
                jobs=page.jobs,
                query=query,
                raw={k: query.raw.get(k, "") for k in forms.JOB_FIELDS},
                next_cursor=page.next_cursor,
                states=list(JobStatus),
                filter_error=None,
            )

        return self._page(request, build)

    def job(self, request: Request, job_id: str) -> Response:
        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            number = forms.job_id(job_id)
            if number is None:
                raise JobNotFound(f"{job_id!r} is not a job id")
            found = admin.job(conn, number)
            return self._render(
                request,
                viewer,
                "job.html",
                page="jobs",
                job=found,
                now=data.now(conn),
                stale_after=STALE_AFTER,
            )

        return self._page(request, build)

    def job_action(
        self, request: Request, job_id: str, action: str, posted: PostedForm
    ) -> Response:
        number = forms.job_id(job_id)
        back = f"/jobs/{number}" if number is not None else "/jobs"

        def act(
            viewer: Viewer, fields: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            if number is None:
                raise JobNotFound(f"{job_id!r} is not a job id")
            return _job_action(conn, number, action, fields)

        return self._act(request, posted, back, act)

    # -- queues -----------------------------------------------------------------------------------

    def queue(self, request: Request, name: str) -> Response:
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            check_name("queue", name)
            state = params.get("state") or None
            states = [JobStatus(state)] if state in set(JobStatus) else None
            view = data.queue_view(conn, name)
            jobs, more = _queue_jobs(conn, name, states)
            return self._render(
                request,
                viewer,
                "queue.html",
                page="queues",
                name=name,
                view=view,
                jobs=jobs,
                state=states[0].value if states else "",
                states=list(JobStatus),
                more=more,
            )

        return self._page(request, build)

    def queue_action(
        self, request: Request, name: str, action: str, posted: PostedForm
    ) -> Response:
        """Pause or resume a queue (``pgjobs queue pause/resume``)."""
        back = f"/queues/{quote(name, safe='')}"
        client = request.client.host if request.client else "unknown"

        def act(
            viewer: Viewer, fields: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            if action == "pause":
                reason = fields.get("reason", "").strip() or None
                change = queues.pause(conn, name, reason=reason, by=f"dashboard ({client})")
                done = "paused" if change.changed else "was already paused"
                return back, f"Queue {name} {done}: its jobs stay ready, no worker claims them."
            if action == "resume":
                change = queues.resume(conn, name)
                done = "resumed" if change.changed else "was not paused"
                return back, f"Queue {name} {done}."
            raise JobNotFound(f"no action {action!r} on queues: use pause or resume")

        return self._act(request, posted, back, act)


# -- what the pages and actions do -------------------------------------------------------------


def _live(view: data.Overview) -> dict[str, Any]:
    """The overview's live part: queues, chart, workers, orphaned leases, table estimates."""
    peak = max([max(p.finished, p.failed) for p in view.chart] + [1])
    return {
        "view": view,
        "queues": view.snapshot.queues,
        "workers": view.snapshot.workers,
        "orphaned": view.snapshot.orphaned,
        "chart": view.chart,
        "peak": peak,
        "totals": {
            "finished": sum(p.finished for p in view.chart),
            "failed": sum(p.failed for p in view.chart),
        },
        "estimates": view.estimates,
        "now": view.now,
    }


_HOT = (JobStatus.READY, JobStatus.SCHEDULED, JobStatus.RUNNING)


def _queue_jobs(
    conn: psycopg.Connection[Any], queue: str, states: list[JobStatus] | None
) -> tuple[list[JobHistory], bool]:
    """A queue's newest jobs in ``states`` (all when None), and whether there are more: every
    queued job, but the archived and dead ones of the last day only. The archive and the dead
    letters have no index by queue, so a queue without recent jobs would have them read whole;
    /jobs?queue= pages on through them."""
    wanted = list(states or JobStatus)
    hot = [s for s in wanted if s in _HOT]
    done = [s for s in wanted if s not in _HOT]
    found: list[JobHistory] = []
    more = False
    if hot:
        page = browse.jobs(conn, states=hot, queue=queue, limit=PAGE_SIZE)
        found += page.jobs
        more |= page.next_cursor is not None
    if done:
        since = data.now(conn) - QUEUE_PAGE_WINDOW
        page = browse.jobs(conn, states=done, queue=queue, since=since, limit=PAGE_SIZE)
        found += page.jobs
        more |= page.next_cursor is not None
    found.sort(key=lambda j: (j.finished_at or j.redriven_at or j.created_at, j.id), reverse=True)
    return found[:PAGE_SIZE], more or len(found) > PAGE_SIZE


def _dead_cursor(value: str | None) -> tuple[datetime, int] | None:
    if not value:
        return None
    return browse.decode_cursor(value)


def _select(
    conn: psycopg.Connection[Any], where: DeadFilter, reason: DeadReason | None
) -> DeadSelection | None:
    """The pinned selection of the dead jobs matching; None when none does. With a reason (which
    ``DeadFilter`` has not), the matching ids are selected first and pinned by id."""
    if reason is not None:
        ids = data.dead_ids(conn, where, reason)
        if not ids:
            return None
        selection = admin.select_dead(conn, replace(where, ids=tuple(sorted(ids))))
    else:
        selection = admin.select_dead(conn, where)
    return selection if selection.count else None


_UNKNOWN_ACTION = (
    "Unknown action: no bulk action with this id is known to this server. Its page lasts an "
    "hour after it ends, lives in the server's memory (a restart forgets it), and is shown only "
    "to the session that started it."
)


def _progress_context(request: Request, base: str, progress: actions.Progress) -> dict[str, Any]:
    return {
        "progress": progress,
        "committed": actions.committed(progress),
        "back": "/dead?" + urlencode(progress.filters),
        "partial_url": f"{base}/partials/actions/{quote(progress.id, safe='')}",
        "progress_seconds": PROGRESS_SECONDS,
        "reload_seconds": PROGRESS_RELOAD_SECONDS,
    }


def _bulk(
    fields: dict[str, str],
    conn: psycopg.Connection[Any],
    start: Callable[[str, DeadSelection, forms.DeadQuery], str],
) -> tuple[str, str]:
    action = fields.get("action")
    if action not in ("redrive", "purge"):
        raise ConfigurationError("action must be redrive or purge", field="action")
    query = forms.dead_query(fields)
    pinned = forms.moment("pinned", fields.get("pinned") or None)
    where = query.where if pinned is None else replace(query.where, until=_earlier(query, pinned))
    expected_text = fields.get("expected", "").strip()
    if action == "purge" and not expected_text:
        # A purge is confirmed on the page that counts what it deletes.
        return "/dead/confirm?" + query.query_string(action="purge"), "Confirm the purge first."
    selection = _select(conn, where, query.reason)
    count = selection.count if selection else 0
    back = "/dead?" + query.query_string()
    if expected_text and (not expected_text.isdigit() or int(expected_text) != count):
        raise JobStateConflict(
            f"the set changed since it was counted: {count:,} dead jobs match now, not "
            f"{expected_text}; nothing was {action}d. Review and confirm again."
        )
    if selection is None:
        return back, f"No dead job matches: nothing to {action}."
    size = BATCH_SIZE
    if count > size:
        action_id = start(action, selection, query)
        batches = -(-count // size)
        doing = "Redriving" if action == "redrive" else "Purging"
        return f"/dead/actions/{action_id}", (
            f"{doing} {count:,} dead jobs in {batches} batches of up to {size:,}, in the "
            "background: this page follows it (leaving it does not stop it)."
        )
    run = admin.redrive_batches if action == "redrive" else admin.purge_batches
    moved = batches = 0
    for ids in run(conn, selection, batch_size=size):
        moved += len(ids)
        batches += 1
    verb = "Redrove" if action == "redrive" else "Purged"
    message = (
        f"{verb} {moved:,} of {count:,} dead jobs in {batches} batch{'es' if batches != 1 else ''}"
        f" of up to {size:,}"
    )
    if moved < count:
        message += f"; {count - moved:,} had already left dead_letter (another redrive or purge)"
    return back, message + "."


def _earlier(query: forms.DeadQuery, pinned: datetime) -> datetime:
    until = query.where.until
    return pinned if until is None else min(until, pinned)


def _job_action(
    conn: psycopg.Connection[Any], job_id: int, action: str, fields: dict[str, str]
) -> tuple[str, str]:
    if action == "cancel":
        force = fields.get("force") == "1"
        admin.cancel(conn, job_id, force=force)
        if force:
            return f"/jobs/{job_id}", (
                f"Job {job_id} force-cancelled: archived as cancelled; its handler may still run "
                "to its end, but its outcome is discarded."
            )
        return f"/jobs/{job_id}", f"Job {job_id} cancelled (archived as cancelled, never run)."
    if action == "replay":
        new_id = admin.replay(conn, job_id)
        return f"/jobs/{new_id}", f"Job {job_id} replayed as job {new_id}."
    if action == "redrive":
        moved = admin.redrive(conn, DeadFilter(ids=(job_id,)))
        return f"/jobs/{job_id}", f"Job {job_id} redriven ({moved} moved back to the queue)."
    raise JobNotFound(f"no action {action!r} on jobs: use cancel, replay or redrive")


def _find(conn: psycopg.Connection[Any], find: str) -> list[int]:
    """Jobs a search box names: an id (when such a job exists), else an idempotency key."""
    number = forms.job_id(find)
    if number is not None and browse.jobs_by_id(conn, [number]):
        return [number]
    return data.jobs_by_key(conn, find)


def dashboard_router(
    connection: ConnectionSource, *, tokens: Tokens, insecure_no_auth: bool = False
) -> APIRouter:
    """The dashboard's routes for ``create_app`` to include: pages at ``/``, ``/dead``,
    ``/dead/actions/{id}`` (a bulk action's progress), ``/jobs``, ``/queues/{name}``,
    ``/login``, assets under ``/static``. Its lifespan (merged into the app's by
    ``include_router``) stops the running bulk actions when the server stops.

    Example::

        api.include_router(dashboard_router(lambda: db.pooled(pool, dsn), tokens=tokens))
    """
    return Dashboard(connection, tokens=tokens, insecure_no_auth=insecure_no_auth).router()
