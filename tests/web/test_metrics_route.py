"""/metrics on the API server: Prometheus' text format from the tables, behind a token when
tokens are configured unless made public."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from tests.web.conftest import AUTH, READ_AUTH, TestClient, assert_error


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_parse_and_count_the_jobs(make_web: Callable[..., FastAPI]) -> None:
    with TestClient(make_web()) as client:
        client.post(
            "/api/v1/jobs/batch",
            json={"jobs": [{"task": "mail", "queue": "q"}, {"task": "mail", "queue": "q"}]},
            headers=AUTH,
        )
        response = client.get("/metrics", headers=READ_AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    assert samples[("pgjobs_metrics_up", ())] == 1
    ready = [
        value
        for (name, labels), value in samples.items()
        if name == "pgjobs_jobs" and ("state", "ready") in labels and ("queue", "q") in labels
    ]
    assert ready == [2]


def test_metrics_need_a_token_unless_public(
    make_web: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(make_web()) as client:
        assert_error(client.get("/metrics"), 401, "unauthenticated")
        assert client.get("/metrics", headers=AUTH).status_code == 200
    with TestClient(make_web(metrics_public=True)) as client:
        assert client.get("/metrics").status_code == 200
    monkeypatch.setenv("PGJOBS_METRICS_PUBLIC", "1")
    with TestClient(make_web()) as client:
        assert client.get("/metrics").status_code == 200
        assert_error(client.get("/api/v1/jobs"), 401, "unauthenticated")
