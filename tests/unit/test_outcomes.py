"""completer.Outcomes: buffering, draining into JOB_SETTLE_MANY's parameters, restoring."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from pgjobs import queries
from pgjobs.completer import Outcomes, result_json
from pgjobs.models import Job

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def job(job_id: int, attempts: int = 1) -> Job:
    return Job(job_id, "default", "t", {}, 0, NOW, attempts, 5, "w", NOW, None, NOW, None, None)


def filled() -> Outcomes:
    outcomes = Outcomes("w")
    outcomes.succeed(job(1), '"ok"')
    outcomes.retry(job(2, 3), 1.5, "ValueError: x")
    outcomes.bury(job(3), "exhausted", "ValueError: y", "builtins.ValueError", "tb")
    outcomes.release(job(4, 2), refund=True)
    outcomes.bury(job(5), "unknown_task", "no task")
    return outcomes


def test_drain_returns_every_parameter_of_the_settle_statement():
    params, settled = filled().drain()
    placeholders = set(re.findall(r"%\((\w+)\)s", queries.JOB_SETTLE_MANY))
    assert set(params) == placeholders
    assert settled == [1, 2, 3, 5, 4]
    assert params["owner"] == "w"
    assert (
        params["ok_ids"] == [1]
        and params["ok_attempts"] == [1]
        and params["ok_results"] == ['"ok"']
    )
    assert params["retry_ids"] == [2] and params["retry_attempts"] == [3]
    assert params["retry_delays"] == [1.5] and params["retry_errors"] == ["ValueError: x"]
    assert params["dead_ids"] == [3, 5]
    assert params["dead_reasons"] == ["exhausted", "unknown_task"]
    assert params["dead_types"] == ["builtins.ValueError", None]
    assert params["dead_tracebacks"] == ["tb", None]
    assert params["release_ids"] == [4] and params["release_attempts"] == [2]
    assert params["release_refunds"] == [True]
    # Parallel arrays stay parallel.
    for prefix in ("ok", "retry", "dead", "release"):
        lengths = {len(v) for k, v in params.items() if k.startswith(prefix + "_")}
        assert len(lengths) == 1, prefix


def test_drain_empties_the_buffer_but_keeps_the_owner():
    outcomes = filled()
    assert len(outcomes) == 5
    outcomes.drain()
    assert len(outcomes) == 0
    assert outcomes.owner == "w"
    params, settled = outcomes.drain()
    assert settled == []
    assert all(v == [] for k, v in params.items() if k != "owner")


def test_restore_puts_a_failed_flush_back_in_front_of_newer_outcomes():
    outcomes = filled()
    params, _ = outcomes.drain()
    outcomes.succeed(job(9), None)
    outcomes.restore(params)
    assert len(outcomes) == 6
    again, settled = outcomes.drain()
    assert again["ok_ids"] == [1, 9]
    assert again["ok_results"] == ['"ok"', None]
    assert settled == [1, 9, 2, 3, 5, 4]
    assert again["owner"] == "w"


def test_result_json():
    assert result_json(None) is None
    assert json.loads(result_json({"a": [1, 2]}) or "") == {"a": [1, 2]}
    assert json.loads(result_json(NOW) or "") == str(NOW)
    assert json.loads(result_json(float("nan")) or "") == "nan"
    assert "\\u0000" not in (result_json("a\x00b") or "")
