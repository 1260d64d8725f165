"""Tasks: the registry of handlers, their retry policy, and what a job submission looks like."""

from __future__ import annotations

import contextlib
import inspect
import math
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from pgjobs.errors import ConfigurationError

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds a claimed job is leased before another worker may run it again.
DEFAULT_LEASE = 300.0
#: PostgreSQL smallint bounds, the range of ``priority``.
PRIORITY_RANGE = (-32768, 32767)

# Limits at the door: every entry point (the API, the CLI) checks values against these before
# anything is written, so that a stored job can always be claimed, settled, dead-lettered and shown.

#: Characters in a task or queue name. Names are btree keys (claim, dead-letter grouping) whose
#: rows PostgreSQL caps near 2,700 bytes; 200 characters (800 bytes at most) leave room for the
#: other columns of a composite index, and a longer name is a mistake, not a name.
MAX_NAME_LENGTH = 200
#: UTF-8 bytes in an idempotency key: it is a btree key of the three tables (same cap as above).
#: 512 bytes hold any hash, UUID or composite business key.
MAX_KEY_BYTES = 512
#: Seconds in a delay (run_in, expires_in), a lease and a retry delay: a century. Longer values are
#: typing errors, and far longer ones overflow PostgreSQL's interval and Python's datetime.
MAX_SECONDS = 100 * 365.25 * 86400
#: Attempts a job may be given: the attempts column is an int4, and a job that fails this often
#: has failed for good.
MAX_ATTEMPTS_LIMIT = 1_000_000
#: Years a run_at / expires_at may fall in, in UTC. PostgreSQL's timestamptz goes further (4713 BC
#: to 294276 AD) but Python's datetime cannot load a row outside 1..9999, and one such row would
#: break every claim or `job show` that reads it.
YEAR_RANGE = (1, 9999)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with equal jitter, in seconds.

    The n-th retry waits ``d/2 + uniform(0, d/2)`` where ``d = min(cap, base * 2**(n-1))``:
    never less than half the nominal delay, so retries of one outage spread out without
    collapsing onto each other.

    Example: ``RetryPolicy(base=2, cap=60).delay(3)`` is between 4 and 8 seconds.
    """

    base: float = 1.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        check_seconds("retry_base", self.base, positive=True)
        check_seconds("retry_cap", self.cap, positive=True)
        if self.cap < self.base:
            raise ConfigurationError(
                f"retry_cap ({self.cap}s) must be at least retry_base ({self.base}s)",
                field="retry_cap",
            )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before the retry that follows failed attempt number ``attempt``."""
        nominal = min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))
        half = nominal / 2.0
        return half + rand() * half


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


@dataclass(frozen=True, slots=True)
class Task:
    """A registered handler. Calling the task calls the function directly (no queue)."""

    name: str
    fn: Callable[..., Any]
    queue: str = DEFAULT_QUEUE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Seconds; how long a claimed job of this task may run before it counts as lost.
    lease: float = DEFAULT_LEASE
    #: Never run twice: a job whose lease expired goes to dead_letter instead of running again.
    at_most_once: bool = False
    is_async: bool = False
    signature: inspect.Signature | None = None
    #: Set for an external task: its jobs are delivered over HTTP, not run by ``fn``.
    external: ExternalTarget | None = None
    # Verdicts of check_payload by the payload's key names (binding looks at nothing else).
    _fits: dict[tuple[str, ...], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def check_payload(self, payload: Any) -> str | None:
        """Why ``payload`` cannot be this handler's keyword arguments, or None when it can."""
        if not isinstance(payload, dict):
            return f"payload must be a JSON object, got {type(payload).__name__}"
        if self.signature is None:
            return None
        keys = tuple(payload)
        try:
            return self._fits[keys]
        except KeyError:
            pass
        try:
            self.signature.bind(**payload)
            verdict = None
        except TypeError as exc:
            verdict = f"payload does not fit {self.name}{self.signature}: {exc}"
        if len(self._fits) < 1024:  # payloads with ever-new key sets are not worth remembering
            self._fits[keys] = verdict
        return verdict


def make_task(
    fn: Callable[..., Any],
    *,
    name: str | None,
    queue: str,
    max_attempts: int,
    retry_base: float,
    retry_cap: float,
    lease: float,
    at_most_once: bool = False,
    external: ExternalTarget | None = None,
) -> Task:
    check_queue(queue)
    check_max_attempts(max_attempts)
    lease = check_seconds("lease", lease, positive=True)
    task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
    check_name("task", task_name)
    signature: inspect.Signature | None = None
    if external is not None:
        check_delivery_fits_lease(task_name, external.timeout, lease)
    else:
        with contextlib.suppress(TypeError, ValueError):  # builtins without a signature
            signature = inspect.signature(fn)
    return Task(
        name=task_name,
        fn=fn,
        queue=queue,
        max_attempts=max_attempts,
        retry=RetryPolicy(float(retry_base), float(retry_cap)),
        lease=float(lease),  # bound as float8[] by the claim: an int among floats cannot be
        at_most_once=at_most_once,
        is_async=external is None and inspect.iscoroutinefunction(fn),
        signature=signature,
        external=external,
    )


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


def check_queue(queue: str) -> None:
    """Refuse a queue name that is not 1..MAX_NAME_LENGTH printable characters."""
    check_name("queue", queue)


def check_name(kind: str, name: object) -> str:
    """Refuse a ``kind`` ("task", "queue") name that is empty, blank, longer than
    ``MAX_NAME_LENGTH`` characters, or holds control characters or lone surrogates (which are
    not text: they cannot be stored nor shown safely).

    Example: ``check_name("queue", "emails")`` returns ``"emails"``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a {kind} name must be a non-empty string", field=kind)
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{kind} name is {len(name):,} characters long; the limit is {MAX_NAME_LENGTH}",
            field=kind,
        )
    if not name.isprintable() and any(_is_control(c) for c in name):
        raise ConfigurationError(
            f"{kind} name {ascii(name)[:80]} holds control characters or lone surrogates; "
            "use printable text",
            field=kind,
        )
    return name


def _is_control(char: str) -> bool:
    # Cc: C0/C1 controls (NUL, ESC, newlines); Cs: surrogates, which are not valid UTF-8.
    return unicodedata.category(char) in ("Cc", "Cs")


def check_key(key: object) -> str:
    """Refuse an idempotency key that is not a non-empty string of valid UTF-8 without NUL, at
    most ``MAX_KEY_BYTES`` bytes long.

    Example: ``check_key("order-42")`` returns ``"order-42"``.
    """
    if not isinstance(key, str) or not key:
        raise ConfigurationError(
            "idempotency_key must be a non-empty string", field="idempotency_key"
        )
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise ConfigurationError(
            "idempotency_key holds a lone surrogate, which is not valid UTF-8; use text",
            field="idempotency_key",
        ) from None
    if size > MAX_KEY_BYTES:
        raise ConfigurationError(
            f"idempotency_key is {size:,} bytes long; the limit is {MAX_KEY_BYTES} (hash a longer key)",
            field="idempotency_key",
        )
    if "\x00" in key:
        raise ConfigurationError(
            "idempotency_key holds a NUL character, which PostgreSQL refuses",
            field="idempotency_key",
        )
    return key


def check_max_attempts(max_attempts: int) -> None:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise ConfigurationError(
            f"max_attempts must be a whole number in 1..{MAX_ATTEMPTS_LIMIT:,}, got {max_attempts!r}",
            field="max_attempts",
        )


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A number of seconds (a number or a timedelta), finite, at most ``MAX_SECONDS``, and > 0
    when ``positive`` else >= 0; anything else is refused naming ``name``.

    Example: ``check_seconds("lease", 30)`` returns ``30.0``.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}", field=name)
    low = "> 0" if positive else ">= 0"
    if (
        not math.isfinite(seconds)
        or seconds < 0
        or (positive and seconds == 0)
        or seconds > MAX_SECONDS
    ):
        raise ConfigurationError(
            f"{name} must be a finite number of seconds {low} and at most {MAX_SECONDS:.0f} "
            f"(a century), got {value!r}",
            field=name,
        )
    return float(seconds)


def check_moment(name: str, value: object) -> datetime:
    """A timezone-aware datetime whose UTC time lies in years ``YEAR_RANGE`` (what both
    PostgreSQL and Python represent), returned in UTC; anything else is refused naming ``name``.

    Example: ``check_moment("run_at", datetime(2030, 1, 1, tzinfo=UTC))``
    """
    if not isinstance(value, datetime):
        raise ConfigurationError(
            f"{name} must be a datetime, got {type(value).__name__}", field=name
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigurationError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value}",
            field=name,
        )
    try:
        # In UTC: PostgreSQL reads offsets to the second, Python's may hold microseconds.
        return value.astimezone(UTC)
    except OverflowError:
        raise ConfigurationError(
            f"{name} {value.isoformat()} is outside years {YEAR_RANGE[0]}..{YEAR_RANGE[1]} in UTC",
            field=name,
        ) from None


class JobSpec(NamedTuple):
    """One job to enqueue; ``None`` options take the task's (or pgjobs') defaults.

    ``run_at`` and ``run_in`` (seconds or a timedelta) are alternatives, as are ``expires_at``
    and ``expires_in``. Datetimes must be timezone-aware. Immutable; a named tuple rather than
    a frozen dataclass because building one is several times cheaper, which shows in a bulk
    enqueue.

    Example: ``JobSpec("send_email", {"to": "a@example.com"}, run_in=60, idempotency_key="w-1")``
    """

    task: str
    payload: dict[str, Any] | None = None
    queue: str | None = None
    priority: int = 0
    run_at: datetime | None = None
    run_in: float | timedelta | None = None
    max_attempts: int | None = None
    expires_at: datetime | None = None
    expires_in: float | timedelta | None = None
    idempotency_key: str | None = None
