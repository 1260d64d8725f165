"""How job data, moments and numbers read on the dashboard's pages.

Job data (task and queue names, errors, tracebacks, payloads) is whatever producers and handlers
wrote: it may hold HTML, which jinja2's autoescaping turns into text, and control characters,
which ``pgjobs.text.printable`` writes as visible escapes, as `pgjobs` does on a terminal. A long
value is shown up to ``pgjobs.text.SHOWN_BYTES`` (the API has the whole); a time Python cannot
hold (a row pgjobs did not write) as PostgreSQL writes it.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from pgjobs.models import QueueState, Unloadable
from pgjobs.rates import limits_text
from pgjobs.text import clipped, printable
from pgjobs.text import progress_time as progress_time_by


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON, non-ASCII kept, control characters escaped by JSON itself
    (``ensure_ascii`` off keeps the separators and overrides, which ``printable`` then escapes);
    clipped to ``SHOWN_BYTES``.

    Example: ``pretty_json({"a": 1}) == '{\\n  "a": 1\\n}'``
    """
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return printable(clipped(text), multiline=True)


def shown(value: str | None) -> str:
    """Multi-line job text (an error, a traceback) as a page shows it: clipped to
    ``SHOWN_BYTES``, control characters escaped; "" for None."""
    return "" if value is None else printable(clipped(value), multiline=True)


def when(value: datetime | Unloadable | None) -> str:
    """A moment in UTC to the second: ``"2026-11-21 15:34:54Z"``; "-" for None; one Python
    cannot hold as PostgreSQL writes it (``"infinity"``)."""
    if value is None:
        return "-"
    if isinstance(value, Unloadable):
        return printable(value.raw)
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"


def progress_time(at: object) -> str:
    """When a job's progress was reported (its ``"at"``), as every other moment reads."""
    return progress_time_by(at, when)


def iso(value: datetime | Unloadable | None) -> str:
    """A moment as ISO 8601 (for ``<time datetime>`` and form fields); "" for None, and for one
    Python cannot hold."""
    if value is None or isinstance(value, Unloadable):
        return ""
    return value.astimezone(UTC).isoformat()


def expired(value: datetime | Unloadable | None, now: datetime) -> bool:
    """Whether the moment ``value`` is before ``now`` (never for None or ``infinity``)."""
    if isinstance(value, Unloadable):
        return value.raw.startswith("-")
    return value is not None and value < now


def age(seconds: float | None) -> str:
    """A duration in a human unit: ``age(75) == "1m 15s"``, ``age(0.4) == "0.4s"``; "-" for None."""
    if seconds is None or math.isnan(seconds):
        return "-"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 10:
        return f"{sign}{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d {whole % 86400 // 3600:02d}h"


def since(value: datetime | Unloadable | None, now: datetime) -> str:
    """How long before ``now`` a moment was: ``"3m 02s ago"``; "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, Unloadable):
        return printable(value.raw)
    seconds = (now - value).total_seconds()
    if seconds < 0:
        return f"in {age(-seconds)}"
    return f"{age(seconds)} ago"


def number(value: int | float | None) -> str:
    """``number(12345) == "12,345"``; "-" for None."""
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def rate(value: float | None) -> str:
    """A share 0..1 as a percentage: ``rate(0.125) == "12.5%"``; "-" for None."""
    return "-" if value is None else f"{value * 100:.1f}%"


def queue_limits(state: QueueState) -> str:
    """A queue's limits in words: "at most 10 running, 100/s starts", or "" without any."""
    return limits_text(
        state.concurrency,
        state.rate_jobs,
        state.rate_seconds,
        state.group_concurrency,
        state.group_rate_jobs,
        state.group_rate_seconds,
    )
