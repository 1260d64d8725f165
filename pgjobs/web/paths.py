"""The request's path and query string as text: ASGI middleware that refuses (400, the one error
shape) a request whose percent-decoded path or query string is not valid UTF-8; ``{x:text}``,
the route parameter for a name or key, which may hold any character ``/`` included; and
``route_path``, the path under the app, for the middleware that looks at it before any route.

The server decodes ``%FF`` into U+FFFD, the replacement character, before any route sees it, so
two keys (or queue, task names) that differ only in invalid bytes would reach pgjobs as one and
the second request would get the first one's job. What is not text is refused, never replaced.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote_to_bytes

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

from pgjobs.web import errors


class TextConvertor(Convertor[str]):
    """``{name:text}``: the rest of the path, any character included. Starlette's ``path``
    stops at a line break (``.`` in its pattern), so ``a%0A`` would match as ``a``: another key."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


#: Route parameters of names and keys (``/queues/{name:text}``); registered when this module is
#: imported, before the routes that use it are built.
TEXT = "text"
register_url_convertor(TEXT, TextConvertor())


def route_path(scope: Scope) -> str:
    """The request's path under the app (without the prefix it is mounted or proxied under)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return str(path)


def not_text(scope: Scope) -> tuple[str, str] | None:
    """(code, message) when the request's path or query string does not decode to UTF-8."""
    raw_path = scope.get("raw_path")
    if isinstance(raw_path, bytes):
        try:
            # Some clients' ASGI scopes carry the query string in raw_path too.
            unquote_to_bytes(raw_path.partition(b"?")[0]).decode("utf-8")
        except UnicodeDecodeError:
            return (
                "invalid_path",
                "the request path is not UTF-8 once percent-decoded: percent-encode names and "
                "keys as UTF-8",
            )
    query = scope.get("query_string", b"")
    if query:
        try:
            parse_qsl(query.decode("latin-1"), keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            return (
                "invalid_query",
                "the query string is not UTF-8 once percent-decoded: percent-encode values "
                "as UTF-8",
            )
    return None


class TextOnly:
    """ASGI middleware: a request whose path or query string is not UTF-8 is answered 400 in
    the one error shape (``invalid_path``, ``invalid_query``) before any route runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = not_text(scope) if scope["type"] == "http" else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        await errors.error_response(400, *refused)(scope, receive, send)
