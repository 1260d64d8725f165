"""The API's response models show the domain's rows (``pgjobs.models``) field for field: a column
added to a row, or a field added to a response, fails here until the other side has it too (or
the difference is listed below, with its reason)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from pgjobs import dependencies, editing, flow, workflow_entries
from pgjobs import models as domain
from pgjobs.batches import BatchStatus
from pgjobs.web import models as api
from pgjobs.web import queue_models, results, stats_models

#: (response model, domain row, fields only the response has, fields only the row has).
PAIRS: list[tuple[type[BaseModel], type[Any], set[str], set[str]]] = [
    # Its place in a graph: the fields of pgjobs.dependencies.Dependencies (see below).
    # Its place in a graph (see below) and its recorded edits (pgjobs.editing.JobEdit).
    (api.Job, domain.JobHistory, {"after", "dependents", "waiting_on", "edits", "workflow"}, set()),
    (api.WorkflowEntry, workflow_entries.WorkflowEntry, set(), set()),
    (api.JobEdit, editing.JobEdit, set(), set()),
    (api.JobEdge, dependencies.Edge, set(), set()),
    # In `after`, the dependency's result (read by pgjobs.flow), or that it was left out.
    (api.AfterEdge, dependencies.Edge, {"result", "result_omitted"}, set()),
    (results.JobResult, flow.JobResult, set(), set()),
    # A listing leaves out what makes a row big, as `pgjobs job show` does not.
    (api.JobSummary, domain.JobHistory, set(), {"result", "traceback", "replays"}),
    (api.DeadJob, domain.DeadJob, set(), set()),
    (api.DeadGroup, domain.DeadGroup, set(), set()),
    (stats_models.Worker, domain.WorkerInfo, set(), set()),
    (stats_models.Replica, domain.ReplicaStatus, set(), set()),
    (stats_models.GroupHold, domain.GroupHold, set(), set()),
    (stats_models.GroupLoad, domain.GroupLoad, set(), set()),
    (stats_models.QueueGroups, domain.QueueGroups, set(), set()),
    (api.Batch, BatchStatus, set(), set()),
    # The row's two properties, written out by `pgjobs stats --json`.
    (stats_models.QueueStats, domain.QueueStats, {"throughput_per_second", "retry_rate"}, set()),
    # The row's property and its rate as written, as `pgjobs queue list --json` prints them.
    (queue_models.Queue, domain.QueueState, {"paused", "rate", "group_rate"}, set()),
    (queue_models.Schedule, domain.ScheduleInfo, set(), set()),
]


def _nullable(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return type(None) in typing.get_args(annotation)
    return False


@pytest.mark.parametrize(
    ("response", "row", "response_only", "row_only"),
    PAIRS,
    ids=[response.__name__ for response, *_ in PAIRS],
)
def test_a_response_has_the_fields_of_its_row(
    response: type[BaseModel], row: type[Any], response_only: set[str], row_only: set[str]
) -> None:
    row_fields = {field.name for field in dataclasses.fields(row)}
    response_fields = set(response.model_fields)
    assert response_fields - row_fields == response_only
    assert row_fields - response_fields == row_only


@pytest.mark.parametrize(("response", "row"), [(r, d) for r, d, *_ in PAIRS])
def test_a_field_may_be_null_in_the_response_when_it_may_be_in_the_row(
    response: type[BaseModel], row: type[Any]
) -> None:
    hints = typing.get_type_hints(row)
    shared = set(response.model_fields) & set(hints)
    differ = {
        name
        for name in shared
        if _nullable(response.model_fields[name].annotation) != _nullable(hints[name])
    }
    assert differ == set()


def test_a_jobs_graph_fields_are_those_of_its_dependencies() -> None:
    fields = {field.name for field in dataclasses.fields(dependencies.Dependencies)}
    assert fields == {"after", "dependents", "waiting_on"} <= set(api.Job.model_fields)
