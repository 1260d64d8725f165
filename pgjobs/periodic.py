"""Periodic schedules: what ``@app.periodic`` declares, and when its occurrences fall.

A schedule is a cron expression (5 fields, or 6 with seconds first) read in an IANA timezone,
or a fixed interval (``every``). This module only computes instants; the scheduler service
(``pgjobs.maintenance.scheduler``) enqueues them, once each, whatever the number of workers.

Cron expressions are read on the wall clock of ``timezone``, with one rule at its two edges:

* a local time that does not exist (clocks jump forward: 02:30 on the last Sunday of March in
  Europe/Berlin) runs once, at the first instant after the gap (03:00 local);
* a local time that happens twice (clocks fall back: 02:30 on the last Sunday of October) runs
  once, at its first passage.

So ``"*/15 * * * *"`` in Europe/Berlin runs 4 times fewer in the repeated hour of October and
once for the skipped hour of March. A fixed cadence in elapsed time is ``every``: its
occurrences are the multiples of the interval since the Unix epoch (UTC), whatever the timezone,
so every worker computes the same instants.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgjobs.errors import ConfigurationError
from pgjobs.submission import MAX_SECONDS, check_key, check_name

#: What a schedule does with occurrences it missed (workers down, maintenance off): "last" runs
#: the latest one only, "skip" none, a whole number N the latest N.
CatchUp = str | int
DEFAULT_CATCH_UP: CatchUp = "last"
#: The timezone a cron expression is read in unless told otherwise.
DEFAULT_TIMEZONE = "UTC"
#: The most missed occurrences ``catch_up=N`` may run at once.
MAX_CATCH_UP = 1000
#: An occurrence found due less than this long ago is on time, never "missed": the scheduler
#: runs every second or so, and a round late by a few seconds must lose nothing.
LATE_GRACE = timedelta(seconds=10)
#: Shortest ``every``: the scheduler works to the second.
MIN_EVERY = timedelta(seconds=1)
#: Missed occurrences counted (for the log) before counting stops.
_MAX_COUNTED = 1000
#: Cron steps tried to find one occurrence before the expression is declared to never match.
_MAX_STEPS = 100_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Due:
    """What a schedule has to do at ``now``: the occurrences to enqueue (oldest first), how many
    missed ones its catch-up rule skips (counted up to 1,000), and its next occurrence after
    ``now``."""

    run: list[datetime]
    skipped: int
    next_run_at: datetime


class ScheduleOptions(TypedDict, total=False):
    """The options of ``App.periodic`` besides the cron expression and the task: the fields of
    ``Periodic``, with the same meaning and defaults (``name`` defaults to the task's name)."""

    every: timedelta | None
    name: str | None
    payload: dict[str, Any] | None
    queue: str | None
    timezone: str
    catch_up: CatchUp
    priority: int
    max_attempts: int | None


@dataclass(frozen=True, slots=True)
class Periodic:
    """A periodic schedule: enqueue ``task`` with ``payload`` at each occurrence.

    Exactly one of ``cron`` and ``every`` is given. Each occurrence's job has the scheduled
    instant as its ``run_at`` and the idempotency key ``periodic:<name>:<instant in UTC, ISO
    8601>``. ``queue`` None takes the task's queue when the job is enqueued.

    Example: ``Periodic("reports.hourly", "reports.build", cron="0 * * * *",
    timezone="Europe/Berlin").after(now)``
    """

    name: str
    task: str
    payload: dict[str, Any] = field(default_factory=dict)
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = DEFAULT_TIMEZONE
    catch_up: CatchUp = DEFAULT_CATCH_UP
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", check_name("schedule", self.name))  # NFC
        object.__setattr__(self, "task", check_name("task", self.task))
        # The key of an occurrence must be storable: name plus an ISO instant.
        check_key(self.idempotency_key(_EPOCH))
        if not isinstance(self.payload, dict):
            raise ConfigurationError(
                f"payload must be a JSON object (a dict), got {type(self.payload).__name__}",
                field="payload",
            )
        object.__setattr__(self, "_zone", _zone(self.timezone))
        _check_catch_up(self.catch_up)
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(
                f"schedule {self.name!r}: give a cron expression or every=timedelta(...), "
                "exactly one of them",
                field="cron",
            )
        if self.every is not None:
            _check_every(self.every)
        else:
            _check_cron(self.name, self.cron)
            self.after(datetime.now(UTC))  # an expression that never matches fails here

    @property
    def schedule(self) -> str:
        """The schedule as listings show it: the cron expression, or ``every 90s``."""
        if self.every is not None:
            return f"every {_seconds_text(self.every)}"
        return " ".join(str(self.cron).split())

    @property
    def catch_up_text(self) -> str:
        return str(self.catch_up)

    def payload_json(self) -> str:
        """The payload as the job stores it (compact JSON)."""
        return json.dumps(self.payload, separators=(",", ":"), allow_nan=False)

    def idempotency_key(self, instant: datetime) -> str:
        """The key of the job of the occurrence at ``instant``.

        Example: ``periodic:reports.hourly:2026-11-23T07:00:00+00:00``
        """
        return f"periodic:{self.name}:{instant.astimezone(UTC).isoformat()}"

    def after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment`` (an aware datetime), in UTC."""
        if self.every is not None:
            period = self.every // _US
            return _EPOCH + ((moment - _EPOCH) // _US // period + 1) * period * _US
        from cronsim import CronSim  # only where a cron schedule is declared or due

        local = moment.astimezone(self._zone).replace(tzinfo=None)
        for steps, naive in enumerate(CronSim(str(self.cron), local)):
            instant = _resolve(naive, self._zone)
            if instant > moment:
                return instant
            if steps > _MAX_STEPS:
                break
        raise ConfigurationError(
            f"schedule {self.name!r}: {self.cron!r} has no occurrence after {moment.isoformat()}",
            field="cron",
        )

    def backwards(self, moment: datetime) -> Iterator[datetime]:
        """Occurrences at or before ``moment``, newest first, in UTC."""
        if self.every is not None:
            period = self.every // _US
            k = (moment - _EPOCH) // _US // period
            while True:
                yield _EPOCH + k * period * _US
                k -= 1
        from cronsim import CronSim

        # CronSim steps back from a whole second, starting one second before it: start one second
        # after ``moment``'s so that an occurrence at ``moment`` itself is found.
        local = moment.astimezone(self._zone).replace(tzinfo=None, microsecond=0)
        previous: datetime | None = None
        try:
            for naive in CronSim(str(self.cron), local + timedelta(seconds=1), reverse=True):
                instant = _resolve(naive, self._zone)
                # The local times of a gap all resolve to the same instant: yield it once.
                if instant <= moment and (previous is None or instant < previous):
                    previous = instant
                    yield instant
        except StopIteration:  # nothing in the 50 years before
            return

    def due(self, next_run_at: datetime, now: datetime) -> Due:
        """What to enqueue at ``now`` when ``next_run_at`` is the first occurrence not enqueued
        yet. Occurrences due within ``LATE_GRACE`` of ``now`` all run; older ones are missed and
        run per ``catch_up``: "last" runs the latest due occurrence (a missed one only when no
        occurrence is on time), "skip" none, N the latest N.

        Example: after 3 hours down, an hourly schedule with ``catch_up="last"`` runs once.
        """
        if next_run_at > now:
            return Due([], 0, next_run_at)
        cutoff = now - LATE_GRACE
        on_time: list[datetime] = []
        missed: list[datetime] = []
        skipped = 0
        keep = _missed_to_keep(self.catch_up)
        for instant in self.backwards(now):
            if instant < next_run_at:
                break
            if instant > cutoff:
                on_time.append(instant)
            elif len(missed) < keep and not (self.catch_up == "last" and on_time):
                missed.append(instant)
            else:
                skipped += 1
                if skipped >= _MAX_COUNTED:
                    break
        run = sorted(on_time + missed)
        return Due(run, skipped, self.after(now))


def _missed_to_keep(catch_up: CatchUp) -> int:
    if catch_up == "last":
        return 1
    if catch_up == "skip":
        return 0
    return int(catch_up)


def _check_catch_up(catch_up: object) -> None:
    if catch_up in ("last", "skip"):
        return
    if (
        isinstance(catch_up, int)
        and not isinstance(catch_up, bool)
        and 0 <= catch_up <= MAX_CATCH_UP
    ):
        return
    raise ConfigurationError(
        f"catch_up {catch_up!r}: expected 'last', 'skip' or a whole number of missed occurrences "
        f"from 0 to {MAX_CATCH_UP}",
        field="catch_up",
    )


def _check_every(every: object) -> None:
    if not isinstance(every, timedelta):
        raise ConfigurationError(
            f"every must be a datetime.timedelta, got {type(every).__name__}", field="every"
        )
    if not MIN_EVERY <= every <= timedelta(seconds=MAX_SECONDS):
        raise ConfigurationError(
            f"every={every!r}: expected from 1 second to 100 years", field="every"
        )
    if every % timedelta(seconds=1):
        raise ConfigurationError(
            f"every={every!r}: expected whole seconds (the scheduler works to the second)",
            field="every",
        )


def _check_cron(name: str, cron: object) -> None:
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigurationError(
            f"schedule {name!r}: the cron expression must be a non-empty string", field="cron"
        )
    if len(cron.split()) not in (5, 6):
        raise ConfigurationError(
            f"schedule {name!r}: cron expression {cron!r} has {len(cron.split())} fields; "
            "expected 5 (minute hour day month weekday) or 6 (seconds first)",
            field="cron",
        )
    from cronsim import CronSim, CronSimError  # only where a cron schedule is declared

    try:
        CronSim(cron, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ConfigurationError(
            f"schedule {name!r}: cron expression {cron!r} is invalid: {exc}", field="cron"
        ) from None


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            "timezone must be an IANA name such as 'Europe/Berlin' or 'UTC'", field="timezone"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"timezone {name!r} is unknown; expected an IANA name such as 'Europe/Berlin' or 'UTC'",
            field="timezone",
        ) from None


def _resolve(naive: datetime, zone: ZoneInfo) -> datetime:
    """The instant (UTC) of wall-clock time ``naive`` in ``zone``: its first passage when it
    happens twice, the end of the gap when it does not exist."""
    first = naive.replace(tzinfo=zone, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == naive:
        return instant
    # In a gap, fold=0 reads the time with the offset before the jump (an instant after the
    # jump) and fold=1 with the offset after it (an instant before): the jump lies between.
    low = int(naive.replace(tzinfo=zone, fold=1).astimezone(UTC).timestamp())
    high = int(instant.timestamp())
    after = instant.astimezone(zone).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _seconds_text(every: timedelta) -> str:
    seconds = every.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{math.floor(seconds / size)}{unit}"
    return f"{seconds:g}s"
