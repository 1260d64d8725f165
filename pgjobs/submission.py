"""What a job submission is and the bounds it is checked against: the defaults, the limits at
the door and their ``check_*`` validators, and ``JobSpec``.

Every entry point (the API, the CLI, the HTTP API) checks values against these before anything
is written, so that a stored job can always be claimed, settled, dead-lettered and shown.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TypedDict

from pgjobs.errors import ConfigurationError

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds a claimed job is leased before another worker may run it again.
DEFAULT_LEASE = 300.0
#: PostgreSQL smallint bounds, the range of ``priority``.
PRIORITY_RANGE = (-32768, 32767)

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
#: The largest job id: the id columns are PostgreSQL bigints. An id outside 1..MAX_JOB_ID names
#: no job, and is refused as bad input rather than sent to the database.
MAX_JOB_ID = 2**63 - 1
#: Dead jobs moved (or deleted) per statement and transaction by a redrive or purge
#: (``pgjobs.admin``; here so that ``App.redrive``'s default needs no import of it).
DEFAULT_BATCH_SIZE = 1000
#: The most jobs a concurrency limit may allow in flight at once, and the most starts a rate may
#: allow per period: far above what one database serves, and within an int4.
MAX_LIMIT = 1_000_000


def check_queue(queue: str) -> str:
    """``check_name("queue", queue)``: the queue's name in NFC, or refused."""
    return check_name("queue", queue)


#: Characters a pause's reason and its "paused by" (of a queue or a schedule) may have: a
#: sentence, not a document.
MAX_NOTE_LENGTH = 1000


def check_note(option: str, value: str | None) -> None:
    """Refuse a pause's ``reason`` or ``by`` that is not text of at most ``MAX_NOTE_LENGTH``
    characters without NUL (None: none given).

    Example: ``check_note("reason", "warehouse migration")``
    """
    if value is None:
        return
    if not isinstance(value, str) or len(value) > MAX_NOTE_LENGTH or "\x00" in value:
        raise ConfigurationError(
            f"{option} must be text of at most {MAX_NOTE_LENGTH} characters without NUL",
            field=option,
        )


def check_name(kind: str, name: object) -> str:
    """A ``kind`` ("task", "queue", "schedule") name in Unicode's composed form (NFC), so that
    names that look alike are one name; refused when it is empty, longer than
    ``MAX_NAME_LENGTH`` characters, holds a character that cannot be seen (``check_visible``)
    or begins or ends with a space.

    Example: ``check_name("queue", "emails")`` returns ``"emails"``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a {kind} name must be a non-empty string", field=kind)
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{kind} name is {len(name):,} characters long; the limit is {MAX_NAME_LENGTH}",
            field=kind,
        )
    if name.isascii():  # the usual name: NFC already, and visible unless it holds a control
        if not name.isprintable():
            check_visible(f"{kind} name", name, field=kind)
    else:
        check_visible(f"{kind} name", name, field=kind)
        name = unicodedata.normalize("NFC", name)
        if len(name) > MAX_NAME_LENGTH:  # a few characters decompose even in NFC
            raise ConfigurationError(
                f"{kind} name is {len(name):,} characters long in NFC; the limit is "
                f"{MAX_NAME_LENGTH}",
                field=kind,
            )
    if name[0] == " " or name[-1] == " ":
        raise ConfigurationError(
            f"{kind} name {name!r} begins or ends with a space, which cannot be seen; remove it",
            field=kind,
        )
    return name


def in_nfc(name: str | None) -> str | None:
    """``name`` in NFC, as names are stored: what a filter on names compares with.

    Example: ``in_nfc("cafe\u0301") == "caf\u00e9"``
    """
    return None if name is None else unicodedata.normalize("NFC", name)


#: Code points that render as nothing although Python counts them printable: the rest of
#: Unicode's Default_Ignorable_Code_Point (combining grapheme joiner, Mongolian and other
#: variation selectors, Hangul fillers, Khmer inherent vowels), which ``unicodedata`` lacks.
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)


def check_visible(what: str, text: str, *, field: str) -> None:
    """Refuse ``text`` if one of its characters cannot be seen: controls (NUL, ESC, newlines),
    format characters (zero-width spaces and joiners, the BOM, direction marks), line and
    paragraph separators, spaces other than U+0020, private-use, unassigned and surrogate code
    points (Python's non-printable characters), and the ignorables above. The error names the
    first one and its position.

    Example: ``check_visible("queue name", "emails\u200b", field="queue")`` raises.
    """
    for position, char in enumerate(text):
        if not char.isprintable() or _IGNORABLE.match(char):
            raise ConfigurationError(
                f"{what} {ascii(text)[:80]} holds {_describe(char)} at position {position}, "
                "which cannot be seen; use visible text",
                field=field,
            )


_KINDS = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Cs": "a lone surrogate (not valid UTF-8)",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Zs": "a space other than U+0020",
}


def _describe(char: str) -> str:
    """``a format character U+200B (ZERO WIDTH SPACE)``."""
    kind = _KINDS.get(unicodedata.category(char), "a character that renders as nothing")
    name = unicodedata.name(char, "")  # surrogates and unassigned code points have none
    return f"{kind} U+{ord(char):04X}" + (f" ({name})" if name else "")


def check_key(key: object, field: str = "idempotency_key") -> str:
    """Refuse a key (``field``: an idempotency key, a group, a unique key) that is not a
    non-empty string of valid UTF-8, at most ``MAX_KEY_BYTES`` bytes long, of visible characters
    (``check_visible``) without a space at either end, in Unicode's composed form (NFC).

    A key is the caller's value: it is stored and compared exactly as given, never rewritten
    (the caller may hold it and look the job up by it). So a key that is not in NFC is refused
    rather than normalised: two keys that look the same can never name two jobs.

    Example: ``check_key("order-42")`` returns ``"order-42"``.
    """
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"{field} must be a non-empty string", field=field)
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{field} holds a lone surrogate, which is not valid UTF-8; use text",
            field=field,
        ) from None
    if size > MAX_KEY_BYTES:
        raise ConfigurationError(
            f"{field} is {size:,} bytes long; the limit is {MAX_KEY_BYTES} (hash a longer key)",
            field=field,
        )
    if "\x00" in key:
        raise ConfigurationError(
            f"{field} holds a NUL character, which PostgreSQL refuses", field=field
        )
    if not key.isascii() or not key.isprintable():
        check_visible(field, key, field=field)
    if key[0] == " " or key[-1] == " ":
        raise ConfigurationError(
            f"{field} {key!r} begins or ends with a space, which cannot be seen; remove it",
            field=field,
        )
    if not key.isascii() and not unicodedata.is_normalized("NFC", key):
        raise ConfigurationError(
            f"{field} {ascii(key)[:80]} is not in Unicode's composed form (NFC): a key "
            "that looks the same in NFC would be another key; normalise it "
            "(unicodedata.normalize('NFC', key)) or hash it",
            field=field,
        )
    return key


#: What a second enqueue with a unique key does to the job not started yet that holds the key.
ON_CONFLICT = ("keep", "replace", "debounce")


def check_on_conflict(on_conflict: object) -> str:
    """Refuse an ``on_conflict`` that is not one of ``ON_CONFLICT``.

    Example: ``check_on_conflict("replace")`` returns ``"replace"``.
    """
    if on_conflict not in ON_CONFLICT:
        raise ConfigurationError(
            f"on_conflict must be one of {', '.join(ON_CONFLICT)}, not {on_conflict!r}",
            field="on_conflict",
        )
    return str(on_conflict)


def check_unique_options(
    unique_key: object, on_conflict: object, debounce: object
) -> tuple[str | None, str | None, float | None]:
    """Check a job's ``unique_key``, ``on_conflict`` and ``debounce`` together: the last two
    mean something only with a unique key, and ``debounce`` only with
    ``on_conflict="debounce"``. Returns them checked (None where not given).

    Example: ``check_unique_options("cart-7", "debounce", 30)`` returns
    ``("cart-7", "debounce", 30.0)``.
    """
    key = None if unique_key is None else check_key(unique_key, "unique_key")
    conflict = None if on_conflict is None else check_on_conflict(on_conflict)
    seconds = None if debounce is None else check_seconds("debounce", debounce)
    for name, value in (("on_conflict", conflict), ("debounce", seconds)):
        if value is not None and key is None:
            raise ConfigurationError(
                f"{name} applies to a job with a unique_key: give one, or leave {name} out",
                field=name,
            )
    if seconds is not None and conflict != "debounce":
        raise ConfigurationError(
            "debounce is the delay of on_conflict='debounce'; "
            f"with on_conflict={conflict or 'keep'!r} it would do nothing",
            field="debounce",
        )
    return key, conflict, seconds


def check_max_attempts(max_attempts: int) -> None:
    """Refuse ``max_attempts`` that is not a whole number in 1..``MAX_ATTEMPTS_LIMIT``."""
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise ConfigurationError(
            f"max_attempts must be a whole number in 1..{MAX_ATTEMPTS_LIMIT:,}, "
            f"got {max_attempts!r}",
            field="max_attempts",
        )


def check_priority(priority: object) -> int:
    """Refuse a ``priority`` that is not a whole number in ``PRIORITY_RANGE``.

    Example: ``check_priority(10)`` returns ``10``.
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigurationError(
            f"priority must be a whole number, got {priority!r}", field="priority"
        )
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise ConfigurationError(
            f"priority {priority} is out of range {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}",
            field="priority",
        )
    return priority


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A number of seconds (a number or a timedelta), finite, at most ``MAX_SECONDS``, and > 0
    when ``positive`` else >= 0; anything else is refused naming ``name``.

    Example: ``check_seconds("lease", 30)`` returns ``30.0``.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}", field=name)
    low = "> 0" if positive else ">= 0"
    # The bounds first: an int past a float's range (10**400) makes math.isfinite raise.
    if (
        seconds < 0
        or seconds > MAX_SECONDS
        or not math.isfinite(seconds)
        or (positive and seconds == 0)
    ):
        raise ConfigurationError(
            f"{name} must be a finite number of seconds {low} and at most {MAX_SECONDS:.0f} "
            f"(a century), got {value!r}",
            field=name,
        )
    return float(seconds)


def check_limit(name: str, value: object) -> int:
    """A concurrency limit or a rate's number of jobs: a whole number in 1..``MAX_LIMIT``;
    anything else is refused naming ``name``.

    Example: ``check_limit("concurrency", 5)`` returns ``5``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ConfigurationError(
            f"{name} must be a whole number in 1..{MAX_LIMIT:,}, got {value!r}", field=name
        )
    return value


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


def check_timeout_fits_lease(task: str, timeout: object, lease: float) -> float:
    """A handler's ``timeout`` in seconds: > 0, at most ``MAX_SECONDS``, and shorter than the
    task's ``lease``. The worker that stops the handler at its timeout must still hold the job
    to record why it failed; with a timeout at or past the lease, the lease would run out first
    and the job be rescued as lost (reason ``lease_expired``), not timed out. A handler that
    extends its lease (``current_job().extend_lease``) is still stopped at its timeout.

    Example: ``check_timeout_fits_lease("reports.build", 30, 300.0)`` returns ``30.0``.
    """
    seconds = check_seconds("timeout", timeout, positive=True)
    if seconds >= lease:
        raise ConfigurationError(
            f"task {task!r}: the timeout ({seconds:g}s) must be shorter than the lease "
            f"({lease:g}s): the worker records the timeout while it still holds the job; "
            "raise the lease too",
            field="timeout",
        )
    return seconds


#: Jobs one job may be enqueued ``after``.
MAX_DEPENDENCIES = 1_000


@dataclass(frozen=True, slots=True)
class Ref:
    """A job of the same ``enqueue_many`` call, by its position in the list (0 is the first),
    for ``JobSpec.after``: only a job listed before may be named, so a graph has no cycle.

    Example: ``app.enqueue_many([JobSpec("fetch"), JobSpec("parse", after=[Ref(0)])])``
    """

    position: int


def check_after(after: object) -> tuple[int | Ref, ...]:
    """The jobs a job waits for (``after``): ids (whole numbers in 1..``MAX_JOB_ID``) and
    ``Ref``s, at most ``MAX_DEPENDENCIES``, in the order given, a repeated one kept once. A
    mapping names each one (``{"charge": 41, "stock": Ref(0)}``, see ``after_names``): its
    values are the jobs, each named once.

    Example: ``check_after([7, 7, Ref(0)])`` returns ``(7, Ref(0))``.
    """
    if isinstance(after, Mapping):
        return tuple(target for _, target in after_names(after) or ())
    if isinstance(after, str | bytes) or not isinstance(after, list | tuple | set | frozenset):
        raise ConfigurationError(
            "after must be a list of job ids, or a mapping of names to job ids, got "
            f"{type(after).__name__}",
            field="after",
        )
    _check_count(len(after))
    for item in after:
        _check_target(item)
    return tuple(dict.fromkeys(after))


def after_names(after: object) -> tuple[tuple[str, int | Ref], ...] | None:
    """The names ``after`` gives the jobs it waits for, as (name, job) pairs in the order given
    (None for a list: jobs named by id only). A name is a task's kind of name (1 to 200
    visible characters, in NFC); two names for one job are refused, as is a mapping that is
    not ``{name: id or Ref}``.

    Example: ``after_names({"charge": 41})`` returns ``(("charge", 41),)``.
    """
    if not isinstance(after, Mapping):
        return None
    _check_count(len(after))
    pairs: list[tuple[str, int | Ref]] = []
    named: dict[int | Ref, str] = {}
    for name, target in after.items():
        try:
            checked = check_name("dependency", name)
        except ConfigurationError as exc:
            raise ConfigurationError(f"after: {exc}", field="after") from None
        _check_target(target)
        if target in named:
            raise ConfigurationError(
                f"after names {target!r} twice ({named[target]!r} and {checked!r}): give each "
                "job one name",
                field="after",
            )
        named[target] = checked
        pairs.append((checked, target))
    return tuple(pairs)


def _check_count(count: int) -> None:
    if count > MAX_DEPENDENCIES:
        raise ConfigurationError(
            f"after lists {count:,} jobs; the limit is {MAX_DEPENDENCIES:,}", field="after"
        )


def _check_target(item: object) -> None:
    if isinstance(item, Ref):
        if (
            isinstance(item.position, bool)
            or not isinstance(item.position, int)
            or item.position < 0
        ):
            raise ConfigurationError(
                f"Ref takes the position of a job of the call (0 or more), got {item.position!r}",
                field="after",
            )
    elif isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= MAX_JOB_ID:
        raise ConfigurationError(
            f"after holds {item!r}: a job id is a whole number in 1..{MAX_JOB_ID}",
            field="after",
        )


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
    #: The group it belongs to (a tenant, a customer): see the task's ``group_concurrency``.
    group: str | None = None
    #: While a job of the task with this key has not started, a second enqueue with it does
    #: what ``on_conflict`` says instead of adding a job.
    unique_key: str | None = None
    #: ``"keep"`` (the default), ``"replace"`` or ``"debounce"``; only with ``unique_key``.
    on_conflict: str | None = None
    #: Seconds a debounced job waits after the latest enqueue (default: the task's ``debounce``).
    debounce: float | None = None
    #: Labels to search and triage by, e.g. ``["customer:42"]`` (``pgjobs.tags``); a list.
    tags: list[str] | tuple[str, ...] | None = None
    #: The jobs it waits for: it runs once every one of them has succeeded (ids, or ``Ref`` to a
    #: job listed before it in the same ``enqueue_many``), a list or a mapping of names to them
    #: (``{"charge": 41}``: the job reads their results by those names).
    after: Sequence[int | Ref] | Mapping[str, int | Ref] | None = None


class JobOptions(TypedDict, total=False):
    """The options of one job as ``App.enqueue`` and ``App.enqueue_async`` take them: the fields
    of ``JobSpec`` after its task and payload, with the same meaning and defaults."""

    queue: str | None
    priority: int
    run_at: datetime | None
    run_in: float | timedelta | None
    max_attempts: int | None
    expires_at: datetime | None
    expires_in: float | timedelta | None
    idempotency_key: str | None
    group: str | None
    unique_key: str | None
    on_conflict: str | None
    debounce: float | None
    tags: list[str] | tuple[str, ...] | None
    after: Sequence[int | Ref] | Mapping[str, int | Ref] | None
