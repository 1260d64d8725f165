"""``pgjobs.testing.drain`` runs jobs with a group, as a burst worker does: alone, beside plain
jobs, under a group's limit, ordered, and released after a dependency."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pgjobs import App, JobSpec
from pgjobs.testing import drain


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()

    @app.task(name="grouped.plain", queue="g")
    def plain(**payload: Any) -> None:
        return None

    @app.task(name="grouped.limited", queue="g", group_concurrency=1)
    def limited(**payload: Any) -> None:
        return None

    @app.task(name="grouped.ordered", queue="g", ordered=True)
    def ordered(**payload: Any) -> None:
        return None

    return app


@pytest.mark.parametrize("task", ["grouped.plain", "grouped.limited", "grouped.ordered"])
def test_drain_runs_jobs_with_a_group(app, task):
    one = app.enqueue(task, group="a")
    others = app.enqueue_many([JobSpec(task, group="b"), JobSpec(task, group="a"), JobSpec(task)])
    first = app.enqueue(task)
    after = app.enqueue(task, group="a", after=[first])
    result = drain(app)
    assert sorted(result.succeeded) == sorted([one, *others, first, after])


@pytest.mark.parametrize("task", ["grouped.plain", "grouped.limited", "grouped.ordered"])
def test_drain_runs_a_lone_job_with_a_group(app, task):
    job = app.enqueue(task, group="g")
    assert drain(app).succeeded == [job]
