"""Where an external task's jobs are delivered: ``ExternalTarget`` and the checks of its URL,
headers and delivery timeout."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_seconds

#: Seconds an external task's delivery waits for the downstream's answer unless told otherwise.
DEFAULT_EXTERNAL_TIMEOUT = 10.0
#: Characters in a downstream URL: a longer one is a mistake (and would not fit a request line
#: most servers accept).
MAX_URL_LENGTH = 2000
# An HTTP header name is a "token" (RFC 9110 5.1); a value is visible ASCII, spaces and tabs (no CR
# or LF: a header value must never be able to start another header).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
#: Headers pgjobs writes itself on every delivery: a task may not set them. (It writes
#: User-Agent and Accept too, unless the task sets its own.)
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "connection",
        "transfer-encoding",
        "pgjobs-job-id",
        "pgjobs-attempt",
    }
)


def check_url(name: str, url: object) -> str:
    """Refuse a downstream URL that is not ``http://`` or ``https://`` with a host, that holds
    a user or password (credentials belong in a header, which is never logged), or spaces or
    control characters.

    Example: ``check_url("url", "https://billing.internal/jobs")`` returns the URL.
    """
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"{name} must be a non-empty http:// or https:// URL", field=name)
    if len(url) > MAX_URL_LENGTH or not url.isascii() or not url.isprintable() or " " in url:
        raise ConfigurationError(
            f"{name} {url[:80]!r} must be a URL of at most {MAX_URL_LENGTH} printable ASCII "
            "characters without spaces (percent-encode the rest)",
            field=name,
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"{name} {url!r} is not a valid URL: {exc}", field=name) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{name} {url!r} must be an http:// or https:// URL with a host", field=name
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            f"{name} must not hold a user or password; send credentials in a header "
            "(headers={'Authorization': ...})",
            field=name,
        )
    if port == 0:
        raise ConfigurationError(f"{name} {url!r}: port 0 cannot be connected to", field=name)
    if parts.fragment:
        raise ConfigurationError(f"{name} {url!r} must not hold a #fragment", field=name)
    return url


def check_headers(
    name: str, headers: Mapping[str, str] | Iterable[tuple[str, str]] | None
) -> tuple[tuple[str, str], ...]:
    """Refuse HTTP headers whose name is not a token or whose value holds control characters or
    non-ASCII text, and the headers pgjobs writes itself (``RESERVED_HEADERS``). Returns them as
    (name, value) pairs. Messages name the header, never its value (it may be a secret).

    Example: ``check_headers("headers", {"Authorization": "Bearer s3cret"})``
    """
    if headers is None:
        return ()
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    seen: set[str] = set()
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ConfigurationError(f"{name} must map header names to values", field=name)
        key, value = pair
        if not isinstance(key, str) or not _HEADER_NAME.fullmatch(key):
            raise ConfigurationError(
                f"{name}: {str(key)[:80]!r} is not an HTTP header name (letters, digits, -)",
                field=name,
            )
        if key.lower() in RESERVED_HEADERS:
            raise ConfigurationError(f"{name}: pgjobs sets the {key} header itself", field=name)
        if key.lower() in seen:
            raise ConfigurationError(f"{name}: the {key} header is given twice", field=name)
        seen.add(key.lower())
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise ConfigurationError(
                f"{name}: the value of the {key} header must be printable ASCII text "
                "(no line breaks)",
                field=name,
            )
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class ExternalTarget:
    """Where the jobs of an external task are delivered: an HTTP endpoint that receives each job
    as a JSON POST and reports its outcome later (``POST /api/v1/jobs/{id}/outcome``).

    On a task, what it leaves None (or empty) comes from the worker's defaults
    (``WorkerConfig.external``, `pgjobs work --external-url/--external-timeout/--external-header`).
    ``timeout`` (seconds) bounds one delivery: connecting, sending, and the answer's head.
    Header values are secrets: ``repr`` never shows them.

    Example: ``ExternalTarget("https://billing.internal/jobs", timeout=5,
    headers=(("Authorization", "Bearer s3cret"),))``
    """

    url: str | None = None
    timeout: float | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.url is not None:
            check_url("url", self.url)
        if self.timeout is not None:
            object.__setattr__(
                self, "timeout", check_seconds("timeout", self.timeout, positive=True)
            )
        object.__setattr__(self, "headers", check_headers("headers", self.headers))

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self.headers)
        return f"ExternalTarget(url={self.url!r}, timeout={self.timeout!r}, headers=[{names}])"


def check_delivery_fits_lease(task: str, timeout: float | None, lease: float) -> None:
    """Refuse a delivery ``timeout`` that is not shorter than the task's ``lease``: the lease
    is the downstream's whole deadline, delivery included, so a delivery that may outlast it
    would leave the downstream no time at all."""
    if timeout is not None and timeout >= lease:
        raise ConfigurationError(
            f"task {task!r}: the delivery timeout ({timeout:g}s) must be shorter than the "
            f"lease ({lease:g}s), which is the downstream's deadline to report",
            field="timeout",
        )
