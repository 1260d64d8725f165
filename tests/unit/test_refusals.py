"""The worker's backoff from a database that refuses its round trips: bounded, jittered, one log
line for a new refusal and then one per interval with a count, a fresh start once accepted."""

from __future__ import annotations

import logging

import pytest

from pgjobs.worker.refusals import FIRST_DELAY, MAX_DELAY, REPORT_EVERY, Refusals


def test_waits_double_with_jitter_up_to_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    refusals = Refusals()
    waits = [refusals.refused("claim refused", float(n)) for n in range(40)]
    for n, wait in enumerate(waits):
        bound = min(MAX_DELAY, FIRST_DELAY * 2**n)
        assert bound / 2 <= wait <= bound
    assert max(waits) <= MAX_DELAY


def test_one_line_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    refusals = Refusals()
    with caplog.at_level(logging.INFO, logger="pgjobs.worker"):
        for n in range(1000):  # 1000 refusals over 10 report intervals
            refusals.refused("claim refused: read-only", n * REPORT_EVERY / 100)
        lines = [r.getMessage() for r in caplog.records]
        assert 5 <= len(lines) <= 11
        assert "(100 times in 30s)" in lines[1]
        refusals.accepted()
        refusals.accepted()  # said once
        assert caplog.records[-1].levelno == logging.WARNING
        assert "again (after 1000 refusal(s))" in caplog.records[-1].getMessage()
        assert refusals.refused("claim refused: read-only", 0.0) <= FIRST_DELAY
    assert len(caplog.records) == len(lines) + 2  # a refusal after a recovery is said anew


def test_a_different_refusal_is_said_at_once(caplog: pytest.LogCaptureFixture) -> None:
    refusals = Refusals()
    with caplog.at_level(logging.ERROR, logger="pgjobs.worker"):
        refusals.refused("claim refused: read-only", 0.0)
        refusals.refused("claim refused: permission denied", 0.1)
    assert len(caplog.records) == 2
