"""The one grammar of times on the command line.

An *age* is a positive number and a unit: ``45s``, ``90m``, ``12h``, ``30d``, ``2w`` (decimals
allowed: ``1.5h``). A *moment* is an ISO 8601 time with a timezone
(``2026-11-21T15:00:00+00:00``) or an age, meaning that long before now. ``--older-than`` takes
an age; ``--since`` and ``--until`` take a moment; ``--run-at`` and ``--expires-at``, which lie in
the future, take an ISO 8601 time. An *interval* (`pgjobs producer --every`) is an age that may
also be given in milliseconds: ``250ms``, ``2s``, ``1.5m``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from pgjobs.errors import ConfigurationError
from pgjobs.rates import Rate, parse_named
from pgjobs.submission import YEAR_RANGE, check_limit
from pgjobs.text import MAX_AGE as _MAX_AGE
from pgjobs.text import age_of as _age

_MILLISECONDS = re.compile(r"(\d+(?:\.\d+)?)\s*ms")
# What removes a limit or a rate (`pgjobs queue limit emails none --rate none`).
_NONE = "none"
_AGE_EXAMPLES = "90m, 12h, 30d or 2w"
_ISO_FORM = "an ISO 8601 time with a timezone (e.g. 2026-11-21T15:00:00+00:00)"


def age(option: str, value: str) -> timedelta:
    """A positive age.

    Example: ``age("--older-than", "2w") == timedelta(days=14)``
    """
    found = _age(value)
    if found is None:
        raise ConfigurationError(
            f"{option} {value!r}: expected a positive age such as {_AGE_EXAMPLES} "
            "(at most 100 years)"
        )
    return found


def interval(option: str, value: str) -> timedelta:
    """A positive interval: an age, or milliseconds (``250ms``), at least 1 ms.

    Example: ``interval("--every", "250ms") == timedelta(milliseconds=250)``
    """
    found = _MILLISECONDS.fullmatch(value.strip().lower())
    if found is not None:
        milliseconds = float(found.group(1))
        if 1 <= milliseconds <= _MAX_AGE.total_seconds() * 1000:
            return timedelta(milliseconds=milliseconds)
    elif (as_age := _age(value)) is not None and as_age >= timedelta(milliseconds=1):
        return as_age
    raise ConfigurationError(
        f"{option} {value!r}: expected a positive interval such as 250ms, 2s, 5m or 1h "
        "(from 1ms to 100 years)"
    )


def moment(option: str, value: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 time with a timezone, or an age: that long before ``now`` (default: now).

    Example: ``moment("--since", "2h", now=noon) == noon - timedelta(hours=2)``
    """
    ago = _age(value)
    if ago is not None:
        return (now or datetime.now(UTC)) - ago
    parsed = _iso(value)
    if parsed is None:
        raise ConfigurationError(
            f"{option} {value!r}: expected {_ISO_FORM} or an age such as {_AGE_EXAMPLES} "
            "(that long ago, at most 100 years)"
        )
    return _aware(option, value, parsed)


def iso_time(option: str, value: str) -> datetime:
    """An ISO 8601 time with a timezone.

    Example: ``iso_time("--run-at", "2026-11-21T15:00:00+01:00").hour == 15``
    """
    parsed = _iso(value)
    if parsed is None:
        raise ConfigurationError(f"{option} {value!r}: expected {_ISO_FORM}")
    return _aware(option, value, parsed)


def _iso(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        return None


def _aware(option: str, value: str, parsed: datetime) -> datetime:
    if parsed.tzinfo is None:
        raise ConfigurationError(f"{option} {value!r} has no timezone: add one, e.g. {value}+00:00")
    try:
        parsed.astimezone(UTC)  # Python and PostgreSQL both hold years 1..9999 in UTC, no further
    except OverflowError:
        raise ConfigurationError(
            f"{option} {value!r} is outside years {YEAR_RANGE[0]}..{YEAR_RANGE[1]} in UTC"
        ) from None
    return parsed


def limit(value: str, name: str = "concurrency") -> int | None:
    """A concurrency limit (``name``) on the command line: a whole number, or ``none`` (no
    limit).

    Example: ``limit("10") == 10``; ``limit("none") is None``
    """
    text = value.strip().lower()
    if text == _NONE:
        return None
    if not text.isdigit():
        raise ConfigurationError(
            f"{name} {value!r}: expected a whole number such as 10, or none", field=name
        )
    return check_limit(name, int(text))


def rate(value: str, name: str = "rate") -> Rate | None:
    """A rate (option ``name``) on the command line: ``100/s``, ``10/m``, ``5/10s``..., or
    ``none`` (no rate).

    Example: ``rate("100/s") == Rate(100, 1.0)``; ``rate("none") is None``
    """
    if value.strip().lower() == _NONE:
        return None
    return Rate.parse(value) if name == "rate" else parse_named(name, value)
