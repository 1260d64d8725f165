"""Signing in through the application that mounts pgjobs: ``create_app(auth=...)``.

The host decides who a request is and what they may do: ``auth`` takes the request (a Starlette
``Request`` over the ASGI scope; it must not read the body) and returns a ``Principal`` (a name
and a role) or None for nobody signed in. pgjobs' own tokens and its login form are then off.

* role ``read``: every page and every GET of the API; an action or an API write is refused
  with 403 (the one JSON error shape for the API, a page that says so on the dashboard);
* role ``operate``: everything the full token may do;
* None: the API answers 401, the dashboard sends the browser to the host's ``sign_in_url``
  (with ``?next=`` the page it wanted) or, without one, answers a 401 page.

``HostSignIn`` calls ``auth`` once per request, before the guards read any body, and leaves the
principal in the scope's state. A plain function runs in the thread pool (it may use a
synchronous ORM, Django's included); a coroutine function is awaited. The principal's name is
the actor pgjobs records (who paused a queue or a schedule) and the dashboard's log names.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from pgjobs.web import errors
from pgjobs.web.backend import ACCESS_STATE
from pgjobs.web.paths import route_path
from pgjobs.web.principal import PRINCIPAL_STATE, HostAuth, Principal

logger = logging.getLogger("pgjobs.web")

#: Paths that need nobody (``auth`` is not called for them): probes and the pages' assets.
_OPEN = ("/healthz", "/readyz", "/static/", "/api/v1/docs/assets/")


class HostSignIn:
    """ASGI middleware: asks the host's ``auth`` who the request is, once, and leaves the
    answer in the scope's state (``PRINCIPAL_STATE``, and what it may do as ``ACCESS_STATE``).
    An ``auth`` that raises or returns something else than a ``Principal`` or None is logged
    and answered 500 in the one error shape: nobody is let in by a broken sign-in."""

    def __init__(self, app: ASGIApp, auth: HostAuth) -> None:
        self.app = app
        self.auth = auth
        self._async = inspect.iscoroutinefunction(auth) or inspect.iscoroutinefunction(
            getattr(auth, "__call__", None)  # noqa: B004 (an object with an async __call__)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope).startswith(_OPEN):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        # Nothing upstream may have decided for pgjobs: only this call does.
        state.pop(ACCESS_STATE, None)
        state[PRINCIPAL_STATE] = None
        try:
            found = await self._ask(Request(scope))
        except Exception:
            logger.exception("the auth callable failed on %s %s", scope["method"], scope["path"])
            await _refuse(send)
            return
        if found is not None and not isinstance(found, Principal):
            logger.error(
                "the auth callable returned %s, not a pgjobs.web.Principal or None",
                type(found).__name__,
            )
            await _refuse(send)
            return
        if found is not None:
            state[PRINCIPAL_STATE] = found
            state[ACCESS_STATE] = found.access
        await self.app(scope, receive, send)

    async def _ask(self, request: Request) -> Any:
        if self._async:
            return await self.auth(request)  # type: ignore[misc]
        found = await run_in_threadpool(self.auth, request)
        if inspect.isawaitable(found):
            found = await found
        return found


async def _refuse(send: Send) -> None:
    body = errors.error_body(
        "internal_error", "the application's sign-in failed; it was logged (see the server's log)"
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body})
