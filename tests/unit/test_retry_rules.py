"""RetryPolicy's rules per exception class: which errors retry, and how long a retry waits."""

from __future__ import annotations

import math

import pytest

from pgjobs.retry import MAX_RETRY_AFTER, RetryPolicy, check_rules


class Upstream(Exception):
    pass


class Slow(Upstream):
    pass


def with_retry_after(value: object) -> Exception:
    exc = Exception("x")
    exc.retry_after = value  # type: ignore[attr-defined]
    return exc


def test_every_error_retries_unless_the_rules_say_otherwise():
    assert RetryPolicy().retries(ValueError())
    only = RetryPolicy(retry_on=(Upstream,))
    assert only.retries(Slow()) and not only.retries(ValueError())
    never = RetryPolicy(retry_on=(Upstream,), never_retry_on=(Slow,))
    assert never.retries(Upstream()) and not never.retries(Slow())


def test_the_nearest_class_named_gives_the_delay_and_retry_after_comes_first():
    _, _, delays = check_rules(None, None, {Upstream: 30, Exception: 7})
    rules = RetryPolicy(delays=delays)
    assert rules.delay(1, Slow()) == 30  # Slow's nearest named base is Upstream
    assert rules.delay(1, KeyError()) == 7
    assert rules.delay(1, with_retry_after(2.5)) == 2.5
    assert 0.5 <= RetryPolicy().delay(1, KeyError()) <= 1.0  # no rule: the backoff


@pytest.mark.parametrize(
    "value", [True, -1, math.inf, math.nan, MAX_RETRY_AFTER + 1, "60", None, object()]
)
def test_a_retry_after_that_is_not_a_sane_number_of_seconds_is_ignored(value):
    policy = RetryPolicy(base=10, cap=10)
    assert 5 <= policy.delay(1, with_retry_after(value)) <= 10


def test_a_single_class_is_a_tuple_of_one():
    on, never, delays = check_rules(TimeoutError, [ValueError, KeyError], None)
    assert on == (TimeoutError,) and never == (ValueError, KeyError) and dict(delays) == {}


def test_a_task_with_retry_delays_stays_hashable():
    # Tasks are put in sets and dict keys; the mapping of delays is compared, not hashed.
    from pgjobs.tasks import make_task

    task = make_task(lambda: None, name="t.hashable", retry_delays={Upstream: 3})
    assert task in {task}
    assert RetryPolicy(delays={Upstream: 1}) != RetryPolicy()
