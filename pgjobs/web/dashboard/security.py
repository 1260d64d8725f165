"""Who is looking at the dashboard, what they may do, and the checks on every form.

**Sessions.** The login form takes an API token (``pgjobs.web.auth``: the same tokens, full or
read-only) and starts a session (``sessions``): the ``pgjobs_session`` cookie holds its random
id, never the token. The cookie is HttpOnly (no script reads it), SameSite=Strict (no other
site's page sends it), Secure when the request came over HTTPS (directly, or through a proxy
whose ``X-Forwarded-Proto`` the server trusts), scoped to the dashboard's path. Pages also
accept the API's ``Authorization: Bearer`` header (scripts, tests). Mounted under the host
application's sign-in (``create_app(auth=...)``), none of these: the host's principal is the
viewer (``pgjobs.web.hosted``).

**CSRF.** Every form that changes something carries a token that only a page of this dashboard,
shown to this session, holds: an HMAC keyed by the session's own random key (for a bearer
header, by a digest of its token; with no token at all, by a random value kept in the HttpOnly,
SameSite=Strict ``pgjobs_csrf`` cookie; under the host's sign-in, by that cookie and the
principal's name together, as the host's session cookie goes with any site's form). Every
POST is checked in constant time before anything else is done; a missing or wrong token is
refused with 403 and changes nothing.

**Flash messages** (what an action did, shown once after its redirect) travel in a short-lived
cookie signed with a key of the process, so that nobody else can make the dashboard say that
something happened.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

from pgjobs.web.auth import Access, Tokens
from pgjobs.web.dashboard.sessions import LIFETIME_SECONDS, Sessions

R = TypeVar("R", bound=Response)

SESSION_COOKIE = "pgjobs_session"
CSRF_COOKIE = "pgjobs_csrf"
FLASH_COOKIE = "pgjobs_flash"
#: Seconds the ``pgjobs_csrf`` cookie of the login form lasts.
CSRF_COOKIE_SECONDS = LIFETIME_SECONDS
#: Name of the CSRF field of every form.
CSRF_FIELD = "csrf"
_CSRF_CONTEXT = b"pgjobs-dashboard-csrf"
_FLASH_CONTEXT = b"pgjobs-dashboard-flash"


class Via(enum.Enum):
    """How a request showed who it is."""

    COOKIE = "cookie"
    BEARER = "bearer"
    #: The server runs with insecure_no_auth: nobody is asked.
    NOBODY = "nobody"
    #: The application that mounts the dashboard signed it in (``create_app(auth=...)``).
    HOST = "host"


@dataclass(frozen=True, slots=True)
class Viewer:
    """An authenticated request: what it may do, the key its CSRF tokens derive from, and the
    credential it acts as (``owner``: a digest of its token, the same for every session and
    script that presents that token)."""

    access: Access
    via: Via
    csrf_key: bytes
    owner: bytes
    #: The host's principal's name (``Via.HOST``): the actor recorded for what it does.
    name: str | None = None

    @property
    def can_act(self) -> bool:
        return self.access is Access.FULL

    @property
    def csrf_token(self) -> str:
        return csrf_token(self.csrf_key)

    def csrf_ok(self, presented: str | None) -> bool:
        return csrf_matches(self.csrf_key, presented)


def csrf_token(key: bytes) -> str:
    """The CSRF token of the forms of a session whose key is ``key``."""
    return hmac.new(key, _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def csrf_matches(key: bytes, presented: str | None) -> bool:
    """Whether ``presented`` is the CSRF token of ``key`` (compared in constant time)."""
    return presented is not None and hmac.compare_digest(
        presented.encode(), csrf_token(key).encode()
    )


class Refusal(enum.Enum):
    """Why a request has no viewer."""

    #: No credentials at all: a browser goes to the login page.
    ANONYMOUS = "anonymous"
    #: A token that is not configured, or a session that ended or expired.
    BAD_TOKEN = "bad_token"
    #: Too many failed tokens from this address (the wait is in ``request.state.retry_after``).
    THROTTLED = "throttled"


def token_key(token: str) -> bytes:
    """The digest a token acts as (``Viewer.owner``)."""
    return hashlib.sha256(_CSRF_CONTEXT + b"\0" + token.encode()).digest()


def anonymous_key(request: Request) -> bytes:
    """The CSRF key of a request without a token (the login form, insecure_no_auth): from the
    ``pgjobs_csrf`` cookie, which a browser without one is given now (``take_new_cookie``)."""
    value = request.cookies.get(CSRF_COOKIE)
    if not value or not 32 <= len(value) <= 128:
        value = getattr(request.state, "new_csrf_cookie", None) or secrets.token_urlsafe(32)
        # Set on the answer: a page shown now carries forms that work. A POST that came without
        # the cookie (another site's form, which SameSite=Strict keeps it from) cannot know this
        # fresh value, so its check fails.
        request.state.new_csrf_cookie = value
    return hashlib.sha256(_CSRF_CONTEXT + b"\1" + value.encode()).digest()


def host_key(request: Request, name: str) -> bytes:
    """The CSRF key of a request the host signed in as ``name``: the host's session cookie
    goes with every request a browser sends, another site's form included, so the forms carry a
    token that needs the dashboard's own ``pgjobs_csrf`` cookie (HttpOnly, SameSite=Strict)
    too, bound to the principal: a token shown to one user is refused for another."""
    return hashlib.sha256(
        _CSRF_CONTEXT + b"\2" + anonymous_key(request) + b"\0" + name.encode()
    ).digest()


def take_new_cookie(request: Request, response: Response) -> None:
    """Give the browser the ``pgjobs_csrf`` cookie ``anonymous_key`` made for this request."""
    value = getattr(request.state, "new_csrf_cookie", None)
    if value:
        set_cookie(response, request, CSRF_COOKIE, value, CSRF_COOKIE_SECONDS)


def identify(
    request: Request, tokens: Tokens, sessions: Sessions, insecure_no_auth: bool
) -> Viewer | Refusal:
    """Who the request is: a bearer header first, then the session cookie, then nobody (allowed
    only with ``insecure_no_auth``)."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        access = tokens.access(token) if scheme.lower() == "bearer" and token else None
        if access is None:
            return Refusal.BAD_TOKEN
        key = token_key(token)
        return Viewer(access, Via.BEARER, key, key)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        session = sessions.get(cookie)
        if session is not None:
            return Viewer(session.access, Via.COOKIE, session.csrf_key, session.owner)
        if not insecure_no_auth:
            return Refusal.BAD_TOKEN
    if insecure_no_auth:
        key = anonymous_key(request)
        return Viewer(Access.FULL, Via.NOBODY, key, key)
    return Refusal.ANONYMOUS


def is_https(request: Request) -> bool:
    """Whether the browser reached the server over HTTPS. Behind a proxy that terminates TLS,
    uvicorn sets the scheme from ``X-Forwarded-Proto`` when the proxy's address is in
    ``--forwarded-allow-ips`` (``FORWARDED_ALLOW_IPS``)."""
    return request.url.scheme in ("https", "wss")


def cookie_path(request: Request) -> str:
    """The dashboard's path: its cookies go to its pages only."""
    return (request.scope.get("root_path") or "").rstrip("/") + "/"


def set_cookie(
    response: Response, request: Request, name: str, value: str, max_age: int | None
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=cookie_path(request),
        secure=is_https(request),
        httponly=True,
        samesite="strict",
    )


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(
        name, path=cookie_path(request), secure=is_https(request), httponly=True, samesite="strict"
    )


# -- flash messages -----------------------------------------------------------------------------


class Flasher:
    """Signs and reads the one-time messages that follow an action's redirect."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _sign(self, body: bytes) -> str:
        return hmac.new(self._key, _FLASH_CONTEXT + body, hashlib.sha256).hexdigest()[:32]

    def pack(self, kind: str, message: str) -> str:
        body = base64.urlsafe_b64encode(json.dumps([kind, message]).encode()).decode()
        return f"{body}.{self._sign(body.encode())}"

    def unpack(self, value: str | None) -> tuple[str, str] | None:
        if not value or "." not in value:
            return None
        body, _, signature = value.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(body.encode())):
            return None
        try:
            kind, message = json.loads(base64.urlsafe_b64decode(body.encode()))
        except (ValueError, TypeError):
            return None
        if not isinstance(kind, str) or not isinstance(message, str):
            return None
        return kind, message


def flash(response: Response, request: Request, flasher: Flasher, kind: str, message: str) -> None:
    """Have the next page show ``message`` (``kind``: "ok" or "error")."""
    set_cookie(response, request, FLASH_COOKIE, flasher.pack(kind, message[:1000]), 60)


def take_flash(request: Request, flasher: Flasher) -> tuple[str, str] | None:
    return flasher.unpack(request.cookies.get(FLASH_COOKIE))


def security_headers(response: R) -> R:
    """Every dashboard answer: nothing but the dashboard's own files may run or style it, it is
    never framed (clickjacking), and pages are not cached (they show live data and tokens)."""
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers.setdefault("Cache-Control", "no-store")
    return response
