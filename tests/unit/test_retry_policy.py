"""RetryPolicy: exponential backoff with equal jitter, capped."""

from __future__ import annotations

import random

import pytest

from pgjobs import ConfigurationError, RetryPolicy


@pytest.mark.parametrize(
    ("base", "cap", "attempt", "nominal"),
    [
        (1.0, 3600.0, 1, 1.0),
        (1.0, 3600.0, 2, 2.0),
        (1.0, 3600.0, 5, 16.0),
        (2.0, 60.0, 3, 8.0),
        (2.0, 60.0, 5, 32.0),
        (2.0, 60.0, 6, 60.0),  # 64 capped
        (2.0, 60.0, 50, 60.0),
        (0.5, 0.5, 10, 0.5),
    ],
)
def test_delay_is_between_half_and_all_of_the_capped_nominal_delay(base, cap, attempt, nominal):
    policy = RetryPolicy(base=base, cap=cap)
    assert policy.delay(attempt, rand=lambda: 0.0) == pytest.approx(nominal / 2)
    assert policy.delay(attempt, rand=lambda: 0.5) == pytest.approx(nominal * 0.75)
    assert policy.delay(attempt, rand=lambda: 1.0) == pytest.approx(nominal)
    rng = random.Random(attempt)
    for _ in range(200):
        assert nominal / 2 <= policy.delay(attempt, rand=rng.random) <= nominal


def test_default_random_stays_in_bounds_and_spreads():
    policy = RetryPolicy(base=10, cap=100)
    delays = [policy.delay(2) for _ in range(200)]
    assert all(10 <= d <= 20 for d in delays)
    assert len(set(delays)) > 1, "jitter must spread retries"


def test_huge_attempt_numbers_do_not_overflow():
    policy = RetryPolicy(base=1, cap=3600)
    assert 1800 <= policy.delay(10**9) <= 3600


def test_delays_never_shrink_as_attempts_grow():
    policy = RetryPolicy(base=0.5, cap=100)
    lows = [policy.delay(n, rand=lambda: 0.0) for n in range(1, 20)]
    assert lows == sorted(lows)
    assert lows[-1] == 50


@pytest.mark.parametrize(
    ("base", "cap", "words"),
    [(0, 10, "retry_base"), (-1, 10, "retry_base"), (10, 5, "retry_cap")],
)
def test_invalid_policy_is_refused(base, cap, words):
    with pytest.raises(ConfigurationError, match=words):
        RetryPolicy(base=base, cap=cap)
