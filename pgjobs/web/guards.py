"""The ASGI middleware in front of every route: the token of an API write checked before its
body is read, the body's size limit, read timeout and media type, and the last-resort 500 in
the one error shape."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgjobs.web import errors
from pgjobs.web.auth import READ_METHODS
from pgjobs.web.backend import ACCESS_STATE, API_PREFIX, Backend, authenticate
from pgjobs.web.paths import route_path
from pgjobs.web.throttle import client_address

logger = logging.getLogger("pgjobs.web")

#: Bytes a request body may have unless told otherwise: a batch of 1,000 jobs with small
#: payloads takes about 150 kB. Bigger payloads belong in object storage, referenced by the job;
#: raise it with ``max_body_bytes`` / ``--max-body-bytes`` (the payload limit is 16 MiB).
DEFAULT_MAX_BODY_BYTES = 1_048_576
_METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
#: Seconds a request's whole body may take to arrive unless told otherwise (408 after them): a
#: client that sends a byte now and then holds a connection and a request slot meanwhile.
DEFAULT_BODY_TIMEOUT = 30.0


class Guards:
    """ASGI middleware in front of the routes: refuses an API write without a valid token before
    reading its body (401, or 429 for an address that failed too often), reads no body of a
    dashboard form posted by nobody signed in (``signed_in``; the page refuses it), refuses a
    body larger than ``max_body_bytes`` (413; by its Content-Length before reading, else while
    reading, never buffering more than the limit), a body that does not arrive within
    ``body_timeout`` seconds (408), a body that is not JSON on a method that takes one (415),
    and turns an unexpected exception into a 500 in the one error shape, logged once."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        backend: Backend | None = None,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        signed_in: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.backend = backend
        self.body_timeout = body_timeout
        self.signed_in = signed_in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            refused = self._authenticate(scope)
            if refused is not None:
                await self._answer(send_tracked, *refused)
                return
            if self._anonymous_form(scope):
                await self.app(scope, _unread(receive), send_tracked)
                return
            try:
                async with asyncio.timeout(self.body_timeout):
                    refusal, replay = await self._read_body(scope, receive)
            except TimeoutError:
                refusal = (
                    408,
                    "request_timeout",
                    f"the request body did not arrive within {self.body_timeout:g} seconds",
                )
            if refusal is not None:
                await self._answer(send_tracked, *refusal)
                return
            await self.app(scope, replay, send_tracked)
        except Exception:
            # Nothing of the request but its method and path: headers may hold a token.
            logger.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            if not started:
                await self._answer(
                    send_tracked,
                    500,
                    "internal_error",
                    "unexpected server error; it was logged (see the server's log)",
                )

    def _authenticate(self, scope: Scope) -> tuple[int, str, str, dict[str, str]] | None:
        """An API write's token, checked before its body is read: the refusal, or None (what
        the token may do is left in the scope's state for the route's own check)."""
        if (
            self.backend is None
            or scope["method"] in READ_METHODS
            or not route_path(scope).startswith(API_PREFIX + "/")
        ):
            return None
        if self.backend.hosted and ACCESS_STATE in scope.get("state", {}):
            return None  # the host's principal (``HostSignIn``); nobody left it: 401 below
        headers = Headers(scope=scope)
        try:
            access = authenticate(
                self.backend, headers.get("authorization"), client_address(scope.get("client"))
            )
        except errors.ApiError as refused:
            return refused.status, refused.code, refused.message, dict(refused.headers or {})
        scope.setdefault("state", {})[ACCESS_STATE] = access
        return None

    def _anonymous_form(self, scope: Scope) -> bool:
        """A dashboard form (not the login's) posted without a bearer header or a live session:
        the page refuses it whatever it holds, so its body is not read."""
        path = route_path(scope)
        return (
            self.signed_in is not None
            and scope["method"] in _METHODS_WITH_BODY
            and not path.startswith(API_PREFIX + "/")
            and path != "/login"
            and not self.signed_in(scope)
        )

    async def _read_body(
        self, scope: Scope, receive: Receive
    ) -> tuple[tuple[int, str, str] | None, Receive]:
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        too_large = (
            413,
            "payload_too_large",
            f"the request body is larger than this server's limit of {self.max_body_bytes:,} "
            "bytes (send fewer jobs per batch, or store large data elsewhere)",
        )
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return too_large, receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None, _replay([message], receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return too_large, receive
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if (
            body
            and scope["method"] in _METHODS_WITH_BODY
            and not _is_json(headers)
            and not _is_dashboard_form(scope, headers)
        ):
            return (
                415,
                "unsupported_media_type",
                "the request body must be JSON: send Content-Type: application/json",
            ), receive
        return None, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)

    @staticmethod
    async def _answer(
        send: Send, status: int, code: str, message: str, extra: dict[str, str] | None = None
    ) -> None:
        body = errors.error_body(code, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        headers += [
            (name.lower().encode(), value.encode()) for name, value in (extra or {}).items()
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _is_json(headers: Headers) -> bool:
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _is_dashboard_form(scope: Scope, headers: Headers) -> bool:
    """An HTML form posted to the dashboard (outside /api/v1), which reads it itself."""
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/x-www-form-urlencoded" and not route_path(scope).startswith(
        API_PREFIX
    )


def _unread(receive: Receive) -> Receive:
    """A ``receive`` whose body is empty; the real one is read only for a disconnect."""
    sent = False

    async def unread() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message

    return unread


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then waits on the real one (for a
    disconnect)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
