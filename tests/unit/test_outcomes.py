"""completer: the statements' parameter objects; Outcomes buffering, draining into
JOB_SETTLE_MANY's parameters, restoring; classifying a handler's outcome (the ``Outcome`` each
decision returns); the text PostgreSQL can store (``pgjobs.text``)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from pgjobs import queries
from pgjobs.completer import ClaimParams, Completer, Outcome
from pgjobs.completer.outcomes import TIMEOUT_ERROR_TYPE, Outcomes, timeout_error
from pgjobs.completer.params import ExtendParams
from pgjobs.errors import NonRetryableError
from pgjobs.models import DeadReason, Job
from pgjobs.tasks import make_task
from pgjobs.text import MAX_ERROR_LENGTH, clipped, error_text, result_json
from pgjobs.worker.metrics import WorkerMetrics

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def job(job_id: int, attempts: int = 1) -> Job:
    return Job(job_id, "default", "t", {}, 0, NOW, attempts, 5, "w", NOW, None, NOW, None, None)


def filled() -> Outcomes:
    outcomes = Outcomes("w")
    outcomes.succeed(job(1), '"ok"')
    outcomes.retry(job(2, 3), 1.5, "ValueError: x")
    outcomes.bury(job(3), DeadReason.EXHAUSTED, "ValueError: y", "builtins.ValueError", "tb")
    outcomes.release(job(4, 2), refund=True)
    outcomes.bury(job(5), DeadReason.UNKNOWN_TASK, "no task")
    return outcomes


def placeholders(statement: str) -> set[str]:
    return set(re.findall(r"%\((\w+)\)s", statement))


def test_each_parameter_object_binds_exactly_its_statements_placeholders():
    claim = ClaimParams("w", ["default"]).bind(4)
    assert set(claim) == placeholders(queries.JOB_CLAIM)
    assert set(ExtendParams("w", [1], [1], [5.0]).bind()) == placeholders(queries.JOB_EXTEND_LEASES)
    assert set(Outcomes("w").drain().bind()) == placeholders(queries.JOB_SETTLE_MANY)
    dead = {name for name in placeholders(queries.JOB_SETTLE_MANY) if name.startswith("dead_")}
    assert placeholders(queries.JOB_BURY_MANY) == {"owner", *dead}
    ok = {"ok_ids", "ok_attempts", "ok_results"}
    assert set(claim) | ok == placeholders(queries.JOB_SUCCEED_AND_CLAIM)


def test_drain_returns_every_outcome_as_parallel_arrays():
    settle = filled().drain()
    params = settle.bind()
    assert settle.ids == [1, 2, 3, 5, 4]
    assert not settle.only_successes
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
    settle = outcomes.drain()
    assert settle.ids == [] and settle.only_successes
    assert all(v == [] for k, v in settle.bind().items() if k != "owner")


def test_restore_puts_a_failed_flush_back_in_front_of_newer_outcomes():
    outcomes = filled()
    settle = outcomes.drain()
    outcomes.succeed(job(9), None)
    outcomes.restore(settle)
    assert len(outcomes) == 6
    again = outcomes.drain()
    assert again.ok_ids == [1, 9]
    assert again.ok_results == ['"ok"', None]
    assert again.ids == [1, 9, 2, 3, 5, 4]
    assert again.owner == "w"


class Flaky(Exception):
    pass


def test_the_completer_classifies_what_a_handler_did():
    task = make_task(
        lambda: None, name="t", queue="default", max_attempts=3, retry_base=1, retry_cap=5, lease=30
    )
    completer = Completer(ClaimParams("w", ["default"]))
    decided = [
        completer.finished(job(1), task, {"n": 1}, None),
        completer.finished(job(2, attempts=1), task, None, Flaky("again")),
        completer.finished(job(3, attempts=5), task, None, Flaky("last")),
        completer.finished(job(4, attempts=1), task, None, NonRetryableError("never")),
        completer.cancelled(job(5)),
        completer.interrupted(job(6), at_most_once=True),
        completer.unknown_task(job(7)),
        completer.invalid_payload(job(8), "missing argument 'x'"),
    ]
    assert decided == [
        Outcome.SUCCEEDED,
        Outcome.RETRIED,
        Outcome.DEAD,
        Outcome.DEAD,
        Outcome.RELEASED,
        Outcome.DEAD,
        Outcome.DEAD,
        Outcome.DEAD,
    ]

    settle = completer.outcomes.drain()
    assert settle.ok_ids == [1] and settle.ok_results == ['{"n": 1}']
    assert settle.retry_ids == [2] and settle.retry_errors == ["Flaky: again"]
    assert settle.retry_delays[0] > 0
    assert settle.dead_ids == [3, 4, 6, 7, 8]
    assert settle.dead_reasons == [
        DeadReason.EXHAUSTED,
        DeadReason.NON_RETRYABLE,
        DeadReason.INTERRUPTED,
        DeadReason.UNKNOWN_TASK,
        DeadReason.INVALID_PAYLOAD,
    ]
    assert settle.dead_types[:2] == [f"{__name__}.Flaky", "pgjobs.errors.NonRetryableError"]
    assert "Flaky: last" in (settle.dead_tracebacks[0] or "")
    assert settle.release_ids == [5] and settle.release_refunds == [False]


def test_the_outcome_decided_is_the_move_buffered():
    task = make_task(
        lambda: None, name="t", queue="default", max_attempts=3, retry_base=1, retry_cap=5, lease=30
    )
    once = make_task(
        lambda: None, name="o", queue="default", max_attempts=3, retry_base=1, retry_cap=5,
        lease=30, at_most_once=True,
    )  # fmt: skip
    completer = Completer(ClaimParams("w", ["default"]))
    assert completer.timed_out(job(1), task, 2.5) is Outcome.RETRIED
    assert completer.timed_out(job(2, attempts=5), task, 2.5) is Outcome.DEAD
    assert completer.timed_out(job(3), once, 2.5) is Outcome.DEAD
    assert completer.interrupted(job(4), at_most_once=False) is Outcome.RELEASED
    settle = completer.outcomes.drain()
    assert settle.retry_ids == [1] and settle.retry_errors == [timeout_error(2.5)]
    assert settle.dead_ids == [2, 3] and settle.dead_reasons == [DeadReason.TIMEOUT] * 2
    assert settle.dead_types == [TIMEOUT_ERROR_TYPE] * 2
    assert settle.release_ids == [4] and settle.release_refunds == [False]


def test_the_worker_metrics_count_the_outcomes_by_their_values():
    # The metrics count what the completer decided: one vocabulary, its values the label values
    # of pgjobs_worker_jobs_finished_total (DELIVERED is the worker's: an external job handed to
    # its downstream is not settled by the completer).
    metrics = WorkerMetrics("w", slots=1, tasks={"t"})
    for number, outcome in enumerate(Outcome, start=1):
        metrics.finished(job(number), outcome)
    text = metrics.render(busy=0, connected=True)
    for label in ("succeeded", "retried", "dead", "released", "delivered"):
        assert f'outcome="{label}"}} 1' in text


def test_error_text_is_one_line_without_nul_and_bounded():
    assert error_text(ValueError("a\n  b\x00")) == "ValueError: a b\\x00"
    long = error_text(ValueError("x" * 5000))
    assert len(long) == MAX_ERROR_LENGTH and long.endswith("…")


def test_result_json():
    assert result_json(None) is None
    assert json.loads(result_json({"a": [1, 2]}) or "") == {"a": [1, 2]}
    assert json.loads(result_json(NOW) or "") == str(NOW)
    assert json.loads(result_json(float("nan")) or "") == "nan"
    assert "\\u0000" not in (result_json("a\x00b") or "")


def test_singles_split_a_batch_into_one_outcome_each_in_the_statements_order():
    settle = filled().drain()
    singles = settle.singles()
    assert [part.ids for part in singles] == [[i] for i in settle.ids]
    assert all(len(part) == 1 and part.owner == "w" for part in singles)
    dead = singles[2]
    assert (dead.dead_reasons, dead.dead_types, dead.dead_tracebacks) == (
        [DeadReason.EXHAUSTED],
        ["builtins.ValueError"],
        ["tb"],
    )
    assert singles[0].ok_results == ['"ok"'] and singles[1].retry_delays == [1.5]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_error_text_survives_a_hostile_message():
    assert error_text(_Unprintable()) == (
        "_Unprintable: <the exception's message cannot be shown: its str() raised RuntimeError>"
    )
    text = error_text(ValueError("a \ud800 b"))
    assert text == "ValueError: a \\ud800 b"
    text.encode()  # storable as UTF-8


def test_a_result_json_cannot_encode_is_a_note_and_lone_surrogates_are_replaced():
    assert "result not stored" in (result_json({(1, 2): "x"}) or "")
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert "RecursionError" in (result_json(deep) or "")
    assert json.loads(result_json("a \ud800 b") or "") == "a \ufffd b"
    # A pair is kept, and so is an escaped backslash before text that looks like an escape.
    assert json.loads(result_json("\U0001f600") or "") == "\U0001f600"
    assert json.loads(result_json("\\ud800") or "") == "\\ud800"


def test_extend_lease_refuses_what_postgresql_cannot_add():
    from pgjobs.context import MAX_EXTENSION, JobContext
    from pgjobs.errors import ConfigurationError

    asked: list[float] = []
    context = JobContext(job(1), lambda _, seconds: asked.append(seconds))
    for bad in (float("inf"), float("nan"), MAX_EXTENSION * 2, 0, -1, "soon"):
        try:
            context.extend_lease(bad)  # type: ignore[arg-type]
        except ConfigurationError:
            continue
        raise AssertionError(f"accepted {bad!r}")
    context.extend_lease(30)
    assert asked == [30.0]


@given(st.text(max_size=300), st.integers(min_value=1024, max_value=4096))
def test_a_result_is_stored_whole_within_the_bound_and_as_a_note_beyond(text, limit):
    value = text * 20
    stored = result_json(value, limit)
    assert stored is not None and len(stored.encode()) <= limit
    whole = json.dumps(value)
    if len(whole) <= limit:
        assert json.loads(stored) == json.loads(result_json(value) or "")
    else:
        assert json.loads(stored).startswith("result not stored: its JSON is")


@given(st.text(max_size=400), st.integers(min_value=1, max_value=300))
def test_a_shown_value_is_a_prefix_within_the_bound_and_says_how_much_is_left(text, limit):
    shown = clipped(text, limit)
    size = len(text.encode(errors="surrogatepass"))
    if size <= limit:
        assert shown == text
        return
    head, _, note = shown.rpartition(" … (")
    assert text.startswith(head) and len(head.encode(errors="surrogatepass")) <= limit
    more = size - len(head.encode(errors="surrogatepass"))
    assert note.startswith(f"{more:,} bytes more")


class _Attempt:
    def __init__(self, job_id: int) -> None:
        self.id = job_id
        self.attempts = 1


def test_a_job_given_back_for_another_worker_does_not_wake_this_one() -> None:
    """A payload newer than this worker's code is held back for the others: were its hold this
    worker's wake-up, it would claim the job again the instant it falls due, before any other
    worker could (and give it back again, for ever)."""
    outcomes = Outcomes("w1")
    outcomes.release(_Attempt(1), refund=True, hold=5.0, for_others=True)
    assert outcomes.due_in() is None
    outcomes.release(_Attempt(2), refund=True, hold=7.0, snooze=True)
    assert outcomes.due_in() == 7.0
    restored = outcomes.drain()
    outcomes.release(_Attempt(3), refund=True, hold=3.0, for_others=True)
    outcomes.restore(restored)  # the flush failed: both come back, in order
    assert outcomes.due_in() == 7.0
