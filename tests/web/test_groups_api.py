"""Groups and unique keys in the HTTP API: the enqueue (one job, a batch, under an idempotency
key) takes ``group``, ``unique_key``, ``on_conflict``, ``debounce``; bad values are 422 in the
one error shape and write nothing; the job JSON (a job, a listing) shows ``group_key`` and
``unique_key`` wherever the job is; /stats says what holds a group."""

from __future__ import annotations

import typing
from typing import Any

import psycopg
import pytest

from pgjobs.submission import ON_CONFLICT, JobSpec
from pgjobs.web import models
from tests.support.factories import insert_dead_raw, insert_raw
from tests.support.helpers import count
from tests.web.conftest import TOKEN, TestClient, assert_error

OPTIONS = {
    "group": "customer-42",
    "unique_key": "cart-7",
    "on_conflict": "debounce",
    "debounce": 30,
}


def _carried(spec: JobSpec) -> tuple[Any, ...]:
    return (spec.group, spec.unique_key, spec.on_conflict, spec.debounce)


def test_one_job_a_batch_and_a_put_carry_the_options(
    client: TestClient, specs: list[JobSpec]
) -> None:
    response = client.post("/api/v1/jobs", json={"task": "t", **OPTIONS})
    assert response.status_code == 201, response.text
    response = client.post(
        "/api/v1/jobs/batch",
        json={"jobs": [{"task": "t", **OPTIONS, "unique_key": "cart-8"}, {"task": "t"}]},
    )
    assert response.status_code == 201, response.text
    response = client.put("/api/v1/jobs/key-1", json={"task": "t", "group": "customer-9"})
    assert response.status_code == 201, response.text
    assert [_carried(spec) for spec in specs] == [
        ("customer-42", "cart-7", "debounce", 30.0),
        ("customer-42", "cart-8", "debounce", 30.0),
        (None, None, None, None),
        ("customer-9", None, None, None),
    ]


def test_the_row_and_the_answer_carry_group_and_unique_key(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job = client.post(
        "/api/v1/jobs", json={"task": "t", "group": "customer-42", "unique_key": "cart-7"}
    ).json()
    assert (job["group_key"], job["unique_key"]) == ("customer-42", "cart-7")
    row = conn.execute(
        "SELECT group_key, unique_key FROM queued_jobs WHERE id = %s", [job["id"]]
    ).fetchone()
    assert row == ("customer-42", "cart-7")
    # A second enqueue with the key keeps the job not started yet (the default).
    again = client.post("/api/v1/jobs", json={"task": "t", "unique_key": "cart-7"})
    assert again.json()["id"] == job["id"]
    assert count(conn, "queued_jobs") == 1


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"group": ""}, "group", ["at least 1"]),
        ({"group": "x" * 513}, "group", ["512"]),
        ({"group": "é" * 300}, "group", ["600 bytes"]),
        ({"group": "a\x00b"}, "group", ["NUL"]),
        ({"group": " padded"}, "group", ["space"]),
        ({"group": 42}, "group", []),
        ({"unique_key": ""}, "unique_key", []),
        ({"unique_key": "e\u0301"}, "unique_key", ["NFC"]),
        ({"unique_key": "k", "on_conflict": "merge"}, "on_conflict", []),
        ({"on_conflict": "replace"}, "on_conflict", ["unique_key"]),
        ({"debounce": 5}, "debounce", ["unique_key"]),
        ({"unique_key": "k", "debounce": 5}, "debounce", ["on_conflict='debounce'"]),
        ({"unique_key": "k", "on_conflict": "keep", "debounce": 5}, "debounce", ["'keep'"]),
        ({"unique_key": "k", "on_conflict": "debounce", "debounce": -1}, "debounce", []),
    ],
)
def test_bad_values_are_422_and_write_nothing(
    client: TestClient,
    conn: psycopg.Connection[Any],
    body: dict[str, Any],
    field: str,
    words: list[str],
) -> None:
    message = assert_error(
        client.post("/api/v1/jobs", json={"task": "t", **body}), 422, "validation_error", field
    )
    for word in words:
        assert word in message, message
    batch = {"jobs": [{"task": "t"}, {"task": "t", **body}]}
    assert_error(
        client.post("/api/v1/jobs/batch", json=batch), 422, "validation_error", f"jobs[1].{field}"
    )
    assert_error(
        client.put("/api/v1/jobs/key-1", json={"task": "t", **body}),
        422,
        "validation_error",
        field,
    )
    assert count(conn, "queued_jobs") == 0


def test_job_json_shows_group_and_unique_key_in_every_table(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    queued = insert_raw(conn, "t", group_key="customer-42", unique_key="cart-7")
    dead = insert_dead_raw(conn, group_key="customer-44", unique_key="cart-9")
    plain = insert_raw(conn, "t")
    for job_id, expected in (
        (queued, ("customer-42", "cart-7")),
        (dead, ("customer-44", "cart-9")),
        (plain, (None, None)),
    ):
        job = client.get(f"/api/v1/jobs/{job_id}").json()
        assert (job["group_key"], job["unique_key"]) == expected
    listed = client.get("/api/v1/jobs", params={"state": ["ready", "dead"]}).json()["jobs"]
    assert {job["id"]: (job["group_key"], job["unique_key"]) for job in listed} == {
        queued: ("customer-42", "cart-7"),
        dead: ("customer-44", "cart-9"),
        plain: (None, None),
    }


def test_the_openapi_document_describes_the_options(client: TestClient) -> None:
    document = client.get("/api/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    create = schemas["JobCreate"]["properties"]
    assert {"group", "unique_key", "on_conflict", "debounce"} <= set(create)
    assert {"group_key", "unique_key"} <= set(schemas["Job"]["properties"])
    assert {"group_key", "unique_key"} <= set(schemas["JobSummary"]["properties"])


def test_on_conflict_values_are_pgjobs_own() -> None:
    annotation = models.JobOptions.model_fields["on_conflict"].annotation
    (literal, _) = typing.get_args(annotation)
    assert typing.get_args(literal) == ON_CONFLICT


def test_stats_show_what_holds_a_group_with_the_servers_app(
    make_web: Any, conn: psycopg.Connection[Any], dsn: Any
) -> None:
    """The server knows its app's ordered tasks: /stats says which job holds an ordered group."""
    from pgjobs import App

    app = App(dsn.url)

    @app.task(name="ledger.post", ordered=True)
    def post() -> None: ...

    first = app.enqueue("ledger.post", group="customer-1")
    app.enqueue("ledger.post", group="customer-1")
    conn.execute(
        "UPDATE queued_jobs SET attempts = 1, run_at = '2999-01-01' WHERE id = %s", [first]
    )
    with TestClient(make_web(app=app), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        document = client.get("/api/v1/stats", params={"verbose": "true"}).json()
    app.close()
    ((group,),) = [q["top"] for q in document["groups"]]
    assert group["held_by"] == [
        {
            "reason": "retry",
            "task": "ledger.post",
            "job_ids": [first],
            "jobs": 1,
            "until": "2999-01-01T00:00:00+00:00",
            "rate": None,
        }
    ]
