"""Occurrences of periodic schedules (no database): cron in a timezone across both DST changes of
Europe/Berlin, fixed intervals, the catch-up rules, and the validation of a declaration."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgjobs.errors import ConfigurationError
from pgjobs.periodic import LATE_GRACE, Periodic

BERLIN = ZoneInfo("Europe/Berlin")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def berlin(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    """A wall-clock time in Berlin (its first passage when it happens twice), in UTC: aware
    datetimes in a fold never compare equal to another zone's (PEP 495)."""
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN).astimezone(UTC)


def following(schedule: Periodic, start: datetime, n: int) -> list[datetime]:
    found, moment = [], start
    for _ in range(n):
        moment = schedule.after(moment)
        found.append(moment)
    return found


def test_daily_cron_in_the_spring_gap_runs_once_at_the_end_of_the_gap():
    # 2026-03-29: Berlin's clocks jump from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    daily = Periodic("d", "t", cron="30 2 * * *", timezone="Europe/Berlin")
    assert following(daily, utc(2026, 3, 27, 12), 3) == [
        berlin(2026, 3, 28, 2, 30),
        berlin(2026, 3, 29, 3, 0),  # the first instant after the gap
        berlin(2026, 3, 30, 2, 30),
    ]


def test_daily_cron_in_the_autumn_overlap_runs_once_at_the_first_passage():
    # 2026-10-25: clocks fall back from 03:00 CEST to 02:00 CET; 02:30 happens twice.
    daily = Periodic("d", "t", cron="30 2 * * *", timezone="Europe/Berlin")
    runs = following(daily, utc(2026, 10, 23, 12), 3)
    assert runs == [
        berlin(2026, 10, 24, 2, 30),
        berlin(2026, 10, 25, 2, 30),
        berlin(2026, 10, 26, 2, 30),
    ]
    assert runs[1] == utc(2026, 10, 25, 0, 30)  # CEST: the first of the two 02:30s
    # From just after the first passage, the second one is not an occurrence.
    assert daily.after(utc(2026, 10, 25, 0, 30)) == berlin(2026, 10, 26, 2, 30)


def test_half_hourly_cron_across_both_changes():
    every_half_hour = Periodic("h", "t", cron="*/30 * * * *", timezone="Europe/Berlin")
    # Spring: 01:30 CET, then 02:00 and 02:30 do not exist and run once, at 03:00 CEST.
    assert following(every_half_hour, berlin(2026, 3, 29, 1, 15), 3) == [
        berlin(2026, 3, 29, 1, 30),
        berlin(2026, 3, 29, 3, 0),
        berlin(2026, 3, 29, 3, 30),
    ]
    # Autumn: 02:00 and 02:30 run at their first passage (CEST) only, then 03:00 CET.
    assert following(every_half_hour, berlin(2026, 10, 25, 1, 45), 4) == [
        berlin(2026, 10, 25, 2, 0),
        berlin(2026, 10, 25, 2, 30),
        berlin(2026, 10, 25, 3, 0),
        berlin(2026, 10, 25, 3, 30),
    ]
    assert berlin(2026, 10, 25, 3, 0) - berlin(2026, 10, 25, 2, 30) == timedelta(
        hours=1, minutes=30
    )


def test_backwards_walk_matches_the_forward_one_across_dst():
    every_half_hour = Periodic("h", "t", cron="*/30 * * * *", timezone="Europe/Berlin")
    for start, end in (
        (utc(2026, 3, 28, 22), utc(2026, 3, 29, 4)),
        (utc(2026, 10, 24, 22), utc(2026, 10, 25, 4)),
    ):
        forward, moment = [], start
        while (moment := every_half_hour.after(moment)) <= end:
            forward.append(moment)
        backward = []
        for instant in every_half_hour.backwards(end):
            if instant <= start:
                break
            backward.append(instant)
        assert backward[::-1] == forward


def test_six_fields_are_seconds_first():
    ticking = Periodic("s", "t", cron="*/15 * * * * *")
    assert following(ticking, utc(2026, 1, 1, 0, 0, 1), 3) == [
        utc(2026, 1, 1, 0, 0, 15),
        utc(2026, 1, 1, 0, 0, 30),
        utc(2026, 1, 1, 0, 0, 45),
    ]
    assert ticking.after(utc(2026, 1, 1, 0, 0, 15)) == utc(2026, 1, 1, 0, 0, 30)  # strictly after


def test_every_counts_from_the_epoch_whatever_the_timezone():
    ninety = Periodic("e", "t", every=timedelta(seconds=90), timezone="Europe/Berlin")
    assert ninety.after(utc(2026, 1, 1)) == utc(2026, 1, 1, 0, 1, 30)
    assert ninety.after(utc(2026, 1, 1, 0, 1, 30)) == utc(2026, 1, 1, 0, 3)
    assert next(ninety.backwards(utc(2026, 1, 1, 0, 1, 30))) == utc(2026, 1, 1, 0, 1, 30)
    # Across the autumn change an hourly interval stays an hour of elapsed time.
    hourly = Periodic("e", "t", every=timedelta(hours=1), timezone="Europe/Berlin")
    runs = following(hourly, utc(2026, 10, 24, 23, 30), 4)
    assert [b - a for a, b in itertools.pairwise(runs)] == [timedelta(hours=1)] * 3
    assert ninety.schedule == "every 90s" and hourly.schedule == "every 1h"


def test_catch_up_last_runs_the_latest_missed_occurrence_only():
    hourly = Periodic("r", "t", cron="0 * * * *")
    now = utc(2026, 5, 1, 10, 20)
    due = hourly.due(utc(2026, 5, 1, 6), now)
    assert due.run == [utc(2026, 5, 1, 10)]
    assert due.skipped == 4  # 06:00 to 09:00
    assert due.next_run_at == utc(2026, 5, 1, 11)


def test_catch_up_skip_and_a_number():
    hourly = Periodic("r", "t", cron="0 * * * *", catch_up="skip")
    now = utc(2026, 5, 1, 10, 20)
    assert hourly.due(utc(2026, 5, 1, 6), now).run == []
    three = Periodic("r", "t", cron="0 * * * *", catch_up=3)
    due = three.due(utc(2026, 5, 1, 6), now)
    assert due.run == [utc(2026, 5, 1, 8), utc(2026, 5, 1, 9), utc(2026, 5, 1, 10)]
    assert due.skipped == 2


def test_occurrences_within_the_grace_are_all_on_time():
    # A round a few seconds late finds several occurrences of a seconds-level schedule: all run,
    # whatever the catch-up rule.
    ticking = Periodic("s", "t", cron="* * * * * *", catch_up="skip")
    now = utc(2026, 5, 1, 10, 0, 3) + timedelta(milliseconds=500)
    due = ticking.due(utc(2026, 5, 1, 10, 0, 1), now)
    assert due.run == [
        utc(2026, 5, 1, 10, 0, 1),
        utc(2026, 5, 1, 10, 0, 2),
        utc(2026, 5, 1, 10, 0, 3),
    ]
    assert due.next_run_at == utc(2026, 5, 1, 10, 0, 4)
    assert timedelta(seconds=3) <= LATE_GRACE


def test_nothing_due_before_next_run_at():
    hourly = Periodic("r", "t", cron="0 * * * *")
    due = hourly.due(utc(2026, 5, 1, 11), utc(2026, 5, 1, 10, 59, 59))
    assert (due.run, due.skipped, due.next_run_at) == ([], 0, utc(2026, 5, 1, 11))


def test_a_long_outage_is_bounded():
    ticking = Periodic("s", "t", cron="* * * * * *")
    due = ticking.due(utc(2025, 1, 1), utc(2026, 1, 1))
    # The occurrences of the last LATE_GRACE seconds are on time; of the year of missed ones,
    # "last" would run the latest, but an on-time one supersedes it.
    assert due.run == [utc(2025, 12, 31, 23, 59, 51) + timedelta(seconds=n) for n in range(10)]
    assert due.skipped == 1000  # counting stops there


def test_idempotency_key_names_the_schedule_and_the_instant():
    hourly = Periodic("reports.hourly", "t", cron="0 * * * *")
    assert (
        hourly.idempotency_key(berlin(2026, 5, 1, 9))
        == "periodic:reports.hourly:2026-05-01T07:00:00+00:00"
    )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": ""}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),  # never happens
        ({}, "cron"),
        ({"cron": "* * * * *", "every": timedelta(minutes=1)}, "cron"),
        ({"every": timedelta(milliseconds=500)}, "every"),
        ({"every": timedelta(seconds=1.5)}, "every"),
        ({"every": 60}, "every"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "* * * * *", "timezone": ""}, "timezone"),
        ({"cron": "* * * * *", "catch_up": "all"}, "catch_up"),
        ({"cron": "* * * * *", "catch_up": -1}, "catch_up"),
        ({"cron": "* * * * *", "catch_up": 1001}, "catch_up"),
        ({"cron": "* * * * *", "catch_up": True}, "catch_up"),
        ({"cron": "* * * * *", "payload": ["not", "a", "dict"]}, "payload"),
    ],
)
def test_bad_declarations_are_refused(options, field):
    with pytest.raises(ConfigurationError) as raised:
        Periodic("s", "t", **options)
    assert raised.value.field == field


@pytest.mark.parametrize("name", ["", " ", "a\x00b", "x" * 201, "\U0001f600" * 200])
def test_bad_names_are_refused(name):
    # The last one fits a name but not the idempotency key of its occurrences (512 bytes).
    with pytest.raises(ConfigurationError):
        Periodic(name, "t", cron="* * * * *")
