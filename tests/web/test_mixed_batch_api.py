"""POST /api/v1/jobs/batch keeps every option of every job whatever else the batch holds (a job
waiting ``after`` it or after an earlier job, many plain jobs, a job with a group), as
``enqueue_many`` does; a job waiting for others keeps its own; a key or a group on a job with
``after`` is a 422 in the one error shape, writing nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgjobs.enqueue import COPY_MIN_ROWS
from tests.support.helpers import scalar
from tests.support.job_options import (
    DEPENDENT_OPTIONS,
    FUTURE,
    OPTIONS,
    TASK,
    Option,
    column,
)
from tests.web.conftest import TestClient

OTHER = "mixed.other"

#: What a batch holds beside the job with the option (listed first), given an earlier job's id.
BESIDE: dict[str, Callable[[int], list[dict[str, Any]]]] = {
    "nothing": lambda earlier: [],
    "a job after it": lambda earlier: [{"task": OTHER, "after": [{"ref": 0}]}],
    "a job after an earlier one": lambda earlier: [{"task": OTHER, "after": [earlier]}],
    "a copy-sized batch": lambda earlier: [
        {"task": OTHER, "payload": {"n": n}} for n in range(COPY_MIN_ROWS)
    ],
    "a copy-sized batch with a job after it": lambda earlier: [
        *({"task": OTHER, "payload": {"n": n}} for n in range(COPY_MIN_ROWS)),
        {"task": OTHER, "after": [{"ref": 0}, earlier]},
    ],
    "a job with a group": lambda earlier: [{"task": OTHER, "group": "other"}],
}

HTTP_OPTIONS = [option for option in OPTIONS if option.json is not None]


def _batch(client: TestClient, jobs: list[dict[str, Any]]) -> list[int]:
    response = client.post("/api/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    return [job["id"] for job in response.json()["jobs"]]


@pytest.mark.parametrize("beside", BESIDE)
@pytest.mark.parametrize("option", HTTP_OPTIONS, ids=[o.name for o in HTTP_OPTIONS])
def test_an_option_survives_whatever_else_the_batch_holds(
    client: TestClient, conn: psycopg.Connection[Any], option: Option, beside: str
) -> None:
    earlier = client.post("/api/v1/jobs", json={"task": OTHER}).json()["id"]

    def send(payload: dict[str, Any]) -> int:
        assert option.json is not None
        jobs = [{"task": TASK, "payload": payload, **option.json}, *BESIDE[beside](earlier)]
        ids = _batch(client, jobs)
        assert len(ids) == len(jobs)
        return ids[0]

    option.check(conn, send)


#: The jobs a dependent waits for, listed before it in the same batch.
BEFORE = {
    "a plain job": {"task": OTHER},
    "a job with an idempotency key": {"task": OTHER, "idempotency_key": "before"},
    "a job with a group": {"task": OTHER, "group": "before"},
    "a job with a unique key": {"task": OTHER, "unique_key": "before"},
}

DEPENDENT_JSON: dict[str, dict[str, Any]] = {
    "queue": {"queue": "elsewhere"},
    "priority": {"priority": -3},
    "run_at": {"run_at": FUTURE.isoformat()},
    "tags": {"tags": ["dependent"]},
    "max_attempts": {"max_attempts": 4},
    "expires_at": {"expires_at": FUTURE.isoformat()},
    "idempotency_key": {"idempotency_key": "dependent"},
    "group": {"group": "dependent"},
    **{
        f"unique_key-{mode}": {"unique_key": "dependent", "on_conflict": mode}
        for mode in ("keep", "replace", "debounce")
    },
}


@pytest.mark.parametrize("before", BEFORE)
@pytest.mark.parametrize("option", DEPENDENT_OPTIONS)
def test_a_job_after_others_keeps_its_own_options(
    client: TestClient, conn: psycopg.Connection[Any], option: str, before: str
) -> None:
    _, name, expected = DEPENDENT_OPTIONS[option]
    dependent: dict[str, Any] = {"task": TASK, "after": [{"ref": 0}, {"ref": 1}]}
    dependent.update(DEPENDENT_JSON[option])
    ids = _batch(client, [BEFORE[before], {"task": OTHER}, dependent])
    assert column(conn, ids[2], name) == expected
    assert scalar(conn, "SELECT waiting_on FROM pgjobs_waiting WHERE job_id = %s", [ids[2]]) == 2


@pytest.mark.parametrize(
    ("option", "name"),
    [("idempotency_key", "idempotency_key"), ("unique_key", "unique_key"), ("group", "group_key")],
)
def test_a_job_after_others_takes_a_key_or_a_group(
    client: TestClient, conn: psycopg.Connection[Any], option: str, name: str
) -> None:
    first = client.post("/api/v1/jobs", json={"task": OTHER}).json()["id"]
    response = client.post("/api/v1/jobs", json={"task": TASK, "after": [first], option: "k"})
    assert response.status_code in (200, 201), response.text  # 200: a key's enqueue
    job = response.json()["id"]
    assert column(conn, job, name) == "k"
    assert scalar(conn, "SELECT waiting_on FROM pgjobs_waiting WHERE job_id = %s", [job]) == 1
    if option != "group":  # the second enqueue of the key returns the waiting job
        again = client.post("/api/v1/jobs", json={"task": TASK, option: "k"})
        assert again.json()["id"] == job
