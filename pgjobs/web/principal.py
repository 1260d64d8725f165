"""Who the application that mounts pgjobs says a request is: a ``Principal`` (a name and a
``Role``), as ``create_app(auth=...)``'s callable returns it (see ``pgjobs.web.hosted``)."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import Scope

from pgjobs.errors import ConfigurationError
from pgjobs.submission import MAX_NOTE_LENGTH
from pgjobs.web.auth import Access

#: Where ``pgjobs.web.hosted.HostSignIn`` leaves the request's principal (the scope's state): a
#: ``Principal``, or None for nobody signed in.
PRINCIPAL_STATE = "pgjobs_principal"


class Role(enum.Enum):
    """What the host lets a principal do."""

    #: Look: pages and the API's GET routes.
    READ = "read"
    #: Look and act: redrive, purge, cancel, replay, pause, resume; the API's writes.
    OPERATE = "operate"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who the host says a request is: ``name`` (recorded as the actor of what they do: text of
    at most 1,000 characters without NUL) and ``role`` (a ``Role``; its value, "read" or
    "operate", is taken too, as from a settings file). ``ConfigurationError`` for an empty
    name or another role.

    Example: ``Principal("alice@example.com", Role.OPERATE)``
    """

    name: str
    role: Role

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("a principal's name must be non-empty text", field="name")
        if len(self.name) > MAX_NOTE_LENGTH or "\x00" in self.name:
            raise ConfigurationError(
                f"a principal's name is text of at most {MAX_NOTE_LENGTH} characters without NUL",
                field="name",
            )
        if not isinstance(self.role, Role):
            try:
                object.__setattr__(self, "role", Role(self.role))
            except ValueError:
                raise ConfigurationError(
                    f"a principal's role must be 'read' or 'operate', got {self.role!r}",
                    field="role",
                ) from None

    @property
    def access(self) -> Access:
        """What the role may do, as a token's access."""
        return Access.FULL if self.role is Role.OPERATE else Access.READ_ONLY

    @property
    def key(self) -> bytes:
        """A digest of the name: the bulk actions a principal started are theirs to follow."""
        return hashlib.sha256(b"pgjobs-principal\0" + self.name.encode()).digest()


#: The host's sign-in: a request in, its principal (or None) out; a plain function or a
#: coroutine function.
HostAuth = Callable[[Request], "Principal | Awaitable[Principal | None] | None"]


def check_auth(auth: object) -> HostAuth:
    """``auth`` as given to ``create_app``; ``ConfigurationError`` unless it is callable."""
    if not callable(auth):
        raise ConfigurationError(
            f"auth must be a callable taking the request, got {type(auth).__name__}",
            field="auth",
        )
    return auth


def check_sign_in_url(url: object) -> str | None:
    """Where the dashboard sends a browser nobody signed in: a path of the host ("/login") or
    an http(s) URL; None: a 401 page instead."""
    if url is None:
        return None
    if (
        not isinstance(url, str)
        or not url.startswith(("/", "https://", "http://"))
        or url.startswith("//")
        or any(c.isspace() or not c.isprintable() for c in url)
    ):
        raise ConfigurationError(
            f"sign_in_url must be a path starting with / or an http(s) URL, got {url!r}",
            field="sign_in_url",
        )
    return url


def principal_of(scope: Scope) -> Principal | None:
    """The principal ``HostSignIn`` found for the request, or None."""
    found = scope.get("state", {}).get(PRINCIPAL_STATE)
    return found if isinstance(found, Principal) else None
