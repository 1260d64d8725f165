"""The CLI without a database: the one grammar of ages and times, how values print, and help
texts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from pgjobs import cli
from pgjobs.cli import parse, render
from pgjobs.errors import ConfigurationError

NOON = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("45s", timedelta(seconds=45)),
        ("90m", timedelta(minutes=90)),
        ("1.5h", timedelta(minutes=90)),
        ("30d", timedelta(days=30)),
        ("2w", timedelta(days=14)),
        (" 2W ", timedelta(days=14)),
    ],
)
def test_ages(value, expected):
    assert parse.age("--older-than", value) == expected
    assert parse.moment("--since", value, now=NOON) == NOON - expected


@pytest.mark.parametrize(
    "value", ["0d", "soon", "30", "-1h", "2y", "", "5218w", "99999999999w", "1e400d"]
)
def test_bad_ages_name_the_option_and_the_form(value):
    with pytest.raises(ConfigurationError, match=r"^--older-than .*positive age such as 90m"):
        parse.age("--older-than", value)


def test_the_longest_age_is_a_century():
    assert parse.age("--older-than", "36525d") == timedelta(days=36525)
    with pytest.raises(ConfigurationError, match="at most 100 years"):
        parse.moment("--since", "99999999999w", now=NOON)


def test_moments_are_iso_8601_times_or_ages():
    assert parse.moment("--until", "2026-11-21T15:00:00+01:00") == datetime(
        2026, 11, 21, 14, 0, tzinfo=UTC
    )
    with pytest.raises(ConfigurationError) as error:
        parse.moment("--since", "yesterday")
    message = str(error.value)
    assert message.startswith("--since 'yesterday': expected an ISO 8601 time")
    assert "or an age such as 90m, 12h, 30d or 2w" in message
    with pytest.raises(ConfigurationError, match="has no timezone"):
        parse.moment("--since", "2026-11-21T15:00:00")


def test_times_in_the_future_are_iso_8601_only():
    plus_one = timezone(timedelta(hours=1))
    assert parse.iso_time("--run-at", "2026-11-21T15:00:00+01:00") == datetime(
        2026, 11, 21, 15, 0, tzinfo=plus_one
    )
    with pytest.raises(ConfigurationError, match=r"^--run-at '2h': expected an ISO 8601 time"):
        parse.iso_time("--run-at", "2h")


def test_a_ratio_prints_as_a_percentage_whatever_its_size():
    assert [render.ratio(r) for r in (0.053, 2.0, 33.0, None)] == ["5.3%", "200.0%", "3,300%", "-"]


def test_times_print_in_utc_one_way():
    paris = timezone(timedelta(hours=1))
    assert render.when(datetime(2026, 11, 21, 16, 34, 54, 123, tzinfo=paris)) == (
        "2026-11-21 15:34:54 UTC"
    )
    assert render.when(None) == "-"
    assert render.when(None, none="never") == "never"


def test_dsn_help_shows_the_embedded_extra(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert cli.main(["stats", "--help"]) == 0
    out = capsys.readouterr().out
    assert "(pgjobs-queue[embedded])" in out, out
