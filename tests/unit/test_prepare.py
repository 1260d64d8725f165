"""enqueue.prepare: validation and defaults of a job submission, no database."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest

from pgjobs import App, ConfigurationError, InvalidPayload, JobSpec, UnknownTask, enqueue
from pgjobs.enqueue import checks


@pytest.fixture
def tasks():
    app = App("postgresql://nobody@127.0.0.1:1/never-connected")

    @app.task(name="mail.send", queue="mail", max_attempts=7)
    def send(to: str) -> None: ...

    @app.task(name="plain")
    def plain() -> None: ...

    return dict(app.tasks)


def test_defaults_without_a_registry():
    job = enqueue.prepare(JobSpec("t"), None)
    assert job == enqueue.PreparedJob("default", "t", "{}", 0, None, 0.0, 5, None, None, None)


def test_task_defaults_then_spec_overrides(tasks):
    job = enqueue.prepare(JobSpec("mail.send", {"to": "a"}), tasks)
    assert (job.queue, job.max_attempts) == ("mail", 7)
    assert json.loads(job.payload) == {"to": "a"}
    job = enqueue.prepare(JobSpec("mail.send", queue="urgent", max_attempts=1), tasks)
    assert (job.queue, job.max_attempts) == ("urgent", 1)


def test_times_are_normalised():
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert enqueue.prepare(JobSpec("t", run_at=at), None).run_at == at
    assert enqueue.prepare(JobSpec("t", run_in=timedelta(minutes=2)), None).run_in == 120.0
    assert enqueue.prepare(JobSpec("t", run_in=3), None).run_in == 3.0
    # A delay stays a delay: the database adds it to its own now() (never the producer's clock).
    expiring = enqueue.prepare(JobSpec("t", expires_in=timedelta(minutes=1)), None)
    assert (expiring.expires_in, expiring.expires_at) == (60.0, None)


def test_unknown_task_only_when_a_registry_is_given(tasks):
    with pytest.raises(UnknownTask, match=r"mail\.send, plain"):
        enqueue.prepare(JobSpec("mail.sned"), tasks)
    assert enqueue.prepare(JobSpec("mail.sned"), None).task == "mail.sned"
    assert enqueue.prepare(JobSpec("mail.sned"), {}).task == "mail.sned"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (JobSpec("t", {"x": object()}), InvalidPayload),
        (JobSpec("t", {"x": math.inf}), InvalidPayload),
        (JobSpec("t", [1]), InvalidPayload),  # type: ignore[arg-type]
        (JobSpec("t", {"x": "nul\x00"}), InvalidPayload),
        (JobSpec("t", {"nul\x00key": 1}), InvalidPayload),
        (JobSpec(""), ConfigurationError),
        (JobSpec("t", run_at=datetime(2030, 1, 1)), ConfigurationError),
        (JobSpec("t", run_at="2030-01-01T00:00:00+00:00"), ConfigurationError),  # type: ignore[arg-type]
        (JobSpec("t", run_in=-0.001), ConfigurationError),
        (JobSpec("t", run_in=math.nan), ConfigurationError),
        (JobSpec("t", run_in=True), ConfigurationError),
        (JobSpec("t", run_in=1, run_at=datetime.now(UTC)), ConfigurationError),
        (JobSpec("t", max_attempts=0), ConfigurationError),
        (JobSpec("t", max_attempts=True), ConfigurationError),
        (JobSpec("t", priority=2**15), ConfigurationError),
        (JobSpec("t", queue="   "), ConfigurationError),
        (JobSpec("t", idempotency_key=""), ConfigurationError),
    ],
)
def test_invalid_specs_are_refused(spec, error):
    with pytest.raises(error) as raised:
        enqueue.prepare(spec, None)
    assert str(raised.value)
    assert "\n" not in str(raised.value)


def test_text_that_merely_looks_like_a_nul_escape_is_accepted():
    job = enqueue.prepare(JobSpec("t", {"path": "C:\\u0000dir", "x": "\\\\u0000"}), None)
    assert json.loads(job.payload) == {"path": "C:\\u0000dir", "x": "\\\\u0000"}


def test_priority_bounds_are_inclusive():
    assert enqueue.prepare(JobSpec("t", priority=32767), None).priority == 32767
    assert enqueue.prepare(JobSpec("t", priority=-32768), None).priority == -32768


def test_payload_size_limit(monkeypatch):
    monkeypatch.setattr(checks, "MAX_PAYLOAD_BYTES", 20)
    enqueue.prepare(JobSpec("t", {"x": "a" * 12}), None)  # {"x":"aaaaaaaaaaaa"} is 20 bytes
    with pytest.raises(InvalidPayload, match="21 bytes; the limit is 20"):
        enqueue.prepare(JobSpec("t", {"x": "a" * 13}), None)


def test_prepare_many_names_the_position_of_the_bad_job():
    specs = [JobSpec("t"), JobSpec("t"), JobSpec("t", max_attempts=0)]
    with pytest.raises(ConfigurationError, match=r"^job #2: max_attempts"):
        enqueue.prepare_many(specs, None)
    assert len(enqueue.prepare_many(specs[:2], None)) == 2


def test_prepare_many_gives_each_plain_job_what_prepare_gives_it(tasks):
    # Jobs that give only a task and a payload take their task's defaults once per call: each
    # comes out as prepare makes it, and a bad payload after the first is still named.
    specs = [
        JobSpec("mail.send", {"to": "a"}),
        JobSpec("plain"),
        JobSpec("mail.send", {"to": "b"}),
        JobSpec("mail.send", {"to": "c"}, priority=3),
        JobSpec("plain", {}),
    ]
    assert enqueue.prepare_many(specs, tasks) == [enqueue.prepare(s, tasks) for s in specs]
    bad = [*specs, JobSpec("mail.send", {"to": 7})]
    with pytest.raises(InvalidPayload, match=r"^job #5: ") as refused:
        enqueue.prepare_many(bad, tasks)
    assert refused.value.field == "jobs[5].payload.to"
    unknown = [JobSpec("nope"), JobSpec("nope")]
    with pytest.raises(UnknownTask, match=r"^job #0: "):
        enqueue.prepare_many(unknown, tasks)


def _deep(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


PLUS_14 = timezone(timedelta(hours=14))


@pytest.mark.parametrize(
    ("spec", "error", "words"),
    [
        (JobSpec("t" * 201), ConfigurationError, "200"),
        (JobSpec("t\x1b[0m"), ConfigurationError, "control"),
        (JobSpec("t", queue="q\ud800"), ConfigurationError, "surrogate"),
        (JobSpec("t", idempotency_key="k" * 513), ConfigurationError, "512"),
        (JobSpec("t", run_at=datetime(1, 1, 1, tzinfo=PLUS_14)), ConfigurationError, "1..9999"),
        (JobSpec("t", expires_in=1e300), ConfigurationError, "century"),
        (JobSpec("t", run_in=timedelta.max), ConfigurationError, "century"),
        (JobSpec("t", max_attempts=2**31), ConfigurationError, "1,000,000"),
        (JobSpec("t", {"s": "\udc80"}), InvalidPayload, "surrogate"),
        (JobSpec("t", {"a": _deep(100)}), InvalidPayload, "100 levels"),
    ],
)
def test_limits_are_named_in_the_refusal(spec, error, words):
    with pytest.raises(error, match=words):
        enqueue.prepare(spec, None)


def test_times_are_bound_in_utc_and_pairs_of_surrogates_are_one_character():
    at = datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=5, microseconds=1)))
    run_at = enqueue.prepare(JobSpec("t", run_at=at), None).run_at
    assert run_at == at and run_at is not None and run_at.utcoffset() == timedelta(0)
    job = enqueue.prepare(JobSpec("t", {"s": "\ud83d\ude00", "t": "\\ud800"}), None)
    assert json.loads(job.payload) == {"s": "\U0001f600", "t": "\\ud800"}
