"""Rates of job starts: ``Rate`` ("100/s") and how a queue's or task's limits are written."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_limit

#: The shortest and longest period of a rate, in seconds: a millisecond is finer than a claim
#: can act on; a rate over more than a day is a schedule, not a rate.
RATE_PERIOD_RANGE = (0.001, 86400.0)
_RATE_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``jobs`` job starts per ``seconds``, across every worker: a token bucket that
    holds up to ``jobs`` tokens and refills at ``jobs / seconds`` per second. After a quiet
    spell a burst of ``jobs`` may start at once; sustained, starts follow the rate. Written
    ``"100/s"``, ``"10/m"``, ``"5/10s"``, ``"1000/h"`` (units ms, s, m or min, h, d).

    Example: ``Rate.parse("100/s") == Rate(100, 1.0)``
    """

    jobs: int
    seconds: float

    def __post_init__(self) -> None:
        check_limit("rate", self.jobs)
        low, high = RATE_PERIOD_RANGE
        if (
            isinstance(self.seconds, bool)
            or not isinstance(self.seconds, int | float)
            or not low <= self.seconds <= high
        ):
            raise ConfigurationError(
                f"a rate's period must be {low:g}s to {high:g}s (a day), got {self.seconds!r}",
                field="rate",
            )

    @classmethod
    def parse(cls, text: object) -> Rate:
        """``text`` ("100/s", "10/m", "5/10s") as a Rate; anything else is refused with the
        forms it takes (``field="rate"``)."""
        if isinstance(text, Rate):
            return text
        match = _RATE.fullmatch(text.lower()) if isinstance(text, str) else None
        unit = _RATE_UNITS.get(match.group(3)) if match else None
        if match is None or unit is None:
            raise ConfigurationError(
                f"rate must be JOBS/PERIOD such as 100/s, 10/m, 5/10s or 1000/h, got {text!r}",
                field="rate",
            )
        count = float(match.group(2)) if match.group(2) else 1.0
        return cls(int(match.group(1)), count * unit)

    def __str__(self) -> str:
        for name in ("d", "h", "m", "s", "ms"):
            if self.seconds == _RATE_UNITS[name]:
                return f"{self.jobs}/{name}"
        return f"{self.jobs}/{self.seconds:g}s"


def parse_named(name: str, value: object) -> Rate:
    """``value`` ("10/m", a ``Rate``) as a Rate, refused in one line naming option ``name``
    (``group_rate``...) rather than ``rate``.

    Example: ``parse_named("group_rate", "10/m") == Rate(10, 60.0)``
    """
    try:
        return Rate.parse(value)
    except ConfigurationError as exc:
        message = str(exc)
        if message.startswith("rate"):
            message = name + message[len("rate") :]
        elif message.startswith("a rate's"):
            message = f"{name}'s" + message[len("a rate's") :]
        raise ConfigurationError(message, field=name) from None


def rate_text(jobs: int | None, seconds: float | None) -> str | None:
    """A stored rate (``rate_jobs``, ``rate_seconds``) as it is written ("100/s", "5/10s"), or
    None without one."""
    return None if jobs is None or seconds is None else str(Rate(jobs, seconds))


def limits_text(
    concurrency: int | None,
    rate_jobs: int | None,
    rate_seconds: float | None,
    group_concurrency: int | None = None,
    group_rate_jobs: int | None = None,
    group_rate_seconds: float | None = None,
) -> str:
    """A concurrency limit, a rate, a group concurrency and a group rate in words, as the CLI
    and the dashboard show a queue's: "at most 10 running, 100/s starts, at most 2 running per
    group, 10/m starts per group"; "" without any."""
    parts = [] if concurrency is None else [f"at most {concurrency} running"]
    rate = rate_text(rate_jobs, rate_seconds)
    if rate is not None:
        parts.append(f"{rate} starts")
    if group_concurrency is not None:
        parts.append(f"at most {group_concurrency} running per group")
    group_rate = rate_text(group_rate_jobs, group_rate_seconds)
    if group_rate is not None:
        parts.append(f"{group_rate} starts per group")
    return ", ".join(parts)
