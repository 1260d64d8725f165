"""Every refusal of enqueue input names the field at fault (``PgjobsError.field``), which the
HTTP API reports beside the message."""

from __future__ import annotations

from datetime import datetime

import pytest

from pgjobs.enqueue import prepare, prepare_many
from pgjobs.errors import PgjobsError
from pgjobs.submission import JobSpec

CASES = [
    (JobSpec("", {}), "task"),
    (JobSpec("t", [1]), "payload"),  # type: ignore[arg-type]
    (JobSpec("t", {"x": float("nan")}), "payload"),
    (JobSpec("t", {}, queue="\x00"), "queue"),
    (JobSpec("t", {}, priority=40_000), "priority"),
    (JobSpec("t", {}, run_at=datetime(2030, 1, 1)), "run_at"),
    (JobSpec("t", {}, run_in=-1), "run_in"),
    (JobSpec("t", {}, max_attempts=0), "max_attempts"),
    (JobSpec("t", {}, expires_in=float("inf")), "expires_in"),
    (JobSpec("t", {}, idempotency_key=""), "idempotency_key"),
]


@pytest.mark.parametrize(("spec", "field"), CASES)
def test_a_refused_job_names_its_field(spec, field):
    with pytest.raises(PgjobsError) as caught:
        prepare(spec, None)
    assert caught.value.field == field


def test_a_refused_job_of_a_batch_names_its_position_and_field():
    with pytest.raises(PgjobsError) as caught:
        prepare_many([JobSpec("t", {}), JobSpec("t", {}, priority=-40_000)], None)
    assert caught.value.field == "jobs[1].priority"
    assert str(caught.value).startswith("job #1: ")
