"""The rules the worker applies to what a handler hands it, one per value, at their edges: a
traceback's bound, an exception class that names no module, a Snooze changed after it was
built, a retry_after that is no number of seconds, a result whose encoding exits. The
acceptance zoo (tests/acceptance/test_handler_zoo.py) runs each in a real worker's trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgjobs.errors import Snooze, snoozed_for
from pgjobs.retry import RetryPolicy
from pgjobs.text import MAX_TRACEBACK_LENGTH, error_type, result_json, traceback_text


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_long_traceback_keeps_its_beginning_and_its_end() -> None:
    text = traceback_text(_raised(ValueError("a" * 300_000 + "THE END")))
    assert text is not None and len(text) <= MAX_TRACEBACK_LENGTH
    assert text.startswith("Traceback (most recent call last):")
    assert text.rstrip().endswith("THE END")
    assert "characters cut) …" in text


def test_a_short_traceback_is_whole() -> None:
    text = traceback_text(_raised(ValueError("short")))
    assert text is not None and "cut" not in text and text.rstrip().endswith("ValueError: short")


class _Unshowable:
    def __str__(self) -> str:
        raise RuntimeError("no")


class _Odd(Exception):
    pass


_Odd.__module__ = _Unshowable()  # type: ignore[assignment]


def test_error_type_names_the_class_whatever_its_module_says() -> None:
    assert error_type(ValueError()) == "builtins.ValueError"
    assert error_type(_Odd()) == "<unknown>._Odd"


class _NoSeconds(Snooze):
    def __init__(self) -> None:
        Exception.__init__(self, "later")


def _altered(seconds: Any) -> Snooze:
    snooze = Snooze(1)
    snooze.seconds = seconds
    return snooze


@pytest.mark.parametrize(
    ("snooze", "words"),
    [
        (_altered(float("nan")), "got nan"),
        (_altered(-1), "got -1"),
        (_altered(10**400), "got 1000000000"),
        (_altered("soon"), "got 'soon'"),
        (_NoSeconds(), "reading its seconds raised AttributeError"),
    ],
)
def test_a_snooze_is_checked_again_where_the_worker_takes_it(snooze: Snooze, words: str) -> None:
    with pytest.raises(ValueError, match="Snooze takes seconds from 0 to") as raised:
        snoozed_for(snooze)
    assert words in str(raised.value) and len(str(raised.value)) < 200
    assert raised.value.__cause__ is snooze
    assert snoozed_for(Snooze(30)) == 30.0


class _RetryAfterRaises(Exception):
    @property
    def retry_after(self) -> float:
        raise SystemExit(1)


class _SlyInt(int):
    def __float__(self) -> float:
        raise KeyboardInterrupt


def _later(value: Any) -> Exception:
    exc = Exception("later")
    exc.retry_after = value  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    "exc",
    [
        _later(10**400),
        _later(float("inf")),
        _later(float("nan")),
        _later(-5),
        _later(86_401),
        _later(_SlyInt(5)),
        _RetryAfterRaises(),
    ],
    ids=["huge", "infinite", "nan", "negative", "over-a-day", "sly-int", "raising-property"],
)
def test_a_retry_after_that_is_no_seconds_leaves_the_backoff(exc: BaseException) -> None:
    delay = RetryPolicy(base=2, cap=60).delay(3, exc, rand=lambda: 0.5)
    assert delay == 6.0  # half of 8 seconds, plus half of the other half


class _ExitingStr:
    def __str__(self) -> str:
        raise SystemExit(6)


def test_a_result_whose_encoding_exits_is_a_note() -> None:
    text = result_json(_ExitingStr())
    assert text is not None
    assert json.loads(text).startswith("result not stored: json cannot encode it (SystemExit")
