"""The options the App's methods take are stated once, as TypedDicts: they cannot drift from the
records they fill, and an option that is not one is refused as Python refuses an unknown keyword
argument."""

from __future__ import annotations

import dataclasses

import pytest

from pgjobs import App, JobSpec
from pgjobs.periodic import Periodic, ScheduleOptions
from pgjobs.submission import JobOptions
from pgjobs.tasks import HandlerOptions, TaskOptions


def test_job_options_are_the_fields_of_a_job_spec_after_its_task_and_payload():
    assert list(JobOptions.__annotations__) == list(JobSpec._fields[2:])
    assert JobOptions.__optional_keys__ == set(JobSpec._fields[2:])


def test_schedule_options_are_the_fields_of_a_periodic_besides_its_task_and_cron():
    fields = {f.name for f in dataclasses.fields(Periodic) if f.init}
    assert ScheduleOptions.__optional_keys__ == fields - {"task", "cron"}


def test_a_handler_takes_every_task_option():
    assert TaskOptions.__optional_keys__ < HandlerOptions.__optional_keys__


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda app: app.task(queu="q"), "App.task() got an unexpected keyword argument 'queu'"),
        (
            lambda app: app.external_task("x", version=2),
            "App.external_task() got an unexpected keyword argument 'version'",
        ),
        (
            lambda app: app.periodic("* * * * *", task="t", timezon="UTC"),
            "App.periodic() got an unexpected keyword argument 'timezon'",
        ),
        (
            lambda app: app.enqueue("t", {}, priorty=1),
            "App.enqueue() got an unexpected keyword argument 'priorty'",
        ),
    ],
)
def test_an_unknown_option_is_refused_by_name(call, message):
    app = App("postgresql://postgres@127.0.0.1/never-connected")
    with pytest.raises(TypeError) as refused:
        call(app)
    assert str(refused.value) == message
