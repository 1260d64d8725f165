"""Paths and query strings that are not text, and trailing slashes: each answered in the one
error shape, and nothing stored. Keys sent as raw percent-encoded bytes (a URL the client does
not re-encode) are either stored exactly as the text they decode to or refused, so two different
byte strings never become one key."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote_from_bytes

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.helpers import count
from tests.web.conftest import TestClient, assert_error


def _put(client: TestClient, key: bytes, n: int = 1) -> Any:
    return client.put(
        f"/api/v1/jobs/{quote_from_bytes(key, safe='')}", json={"task": "t", "payload": {"n": n}}
    )


def test_keys_differing_only_in_invalid_bytes_are_refused_not_merged(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    first = _put(client, b"order-\xff", 1)
    second = _put(client, b"order-\xfe", 2)
    assert_error(first, 400, "invalid_path")
    assert_error(second, 400, "invalid_path")
    assert count(conn, "queued_jobs") == 0


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/%C3%28",
        "/api/v1/jobs/%ED%A0%80",  # a surrogate, which UTF-8 never encodes
        "/api/v1/jobs?queue=%FF",
        "/api/v1/jobs?task=a%80b",
        "/api/v1/dead-letters?queue=%E2%82",
        "/queues/%FF",
        "/queues/%FF/pause",
        "/dead?task=%C0%AF",
    ],
)
def test_every_route_refuses_a_path_or_query_that_is_not_utf8(
    client: TestClient, conn: psycopg.Connection[Any], path: str
) -> None:
    method = "POST" if path.endswith("/pause") else "GET"
    code = "invalid_query" if "?" in path else "invalid_path"
    assert_error(client.request(method, path), 400, code)
    assert count(conn, "pgjobs_queues") == 0


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    key=st.one_of(
        st.binary(min_size=1, max_size=12),
        st.text(min_size=1, max_size=8).map(lambda t: t.encode()),
        st.tuples(st.text(max_size=4), st.binary(min_size=1, max_size=3)).map(
            lambda parts: parts[0].encode() + parts[1]
        ),
    )
)
def test_a_key_is_stored_as_the_text_it_decodes_to_or_refused(
    client: TestClient, conn: psycopg.Connection[Any], key: bytes
) -> None:
    """Stored keys are the sent bytes decoded as UTF-8, exactly: no two byte strings share one."""
    before = count(conn, "queued_jobs")
    answer = _put(client, key)
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        assert_error(answer, 400, "invalid_path")
        assert count(conn, "queued_jobs") == before
        return
    if answer.status_code == 422:  # text pgjobs refuses as a key (control characters...)
        return
    assert answer.status_code in (200, 201), answer.text
    assert answer.json()["idempotency_key"] == text


@pytest.mark.parametrize(
    ("method", "path", "route"),
    [
        ("GET", "/api/v1/jobs/", "/api/v1/jobs"),
        ("POST", "/api/v1/jobs/", "/api/v1/jobs"),
        ("GET", "/api/v1/stats/", "/api/v1/stats"),
        ("POST", "/api/v1/jobs/1/cancel/", "/api/v1/jobs/1/cancel"),
        ("GET", "/healthz/", "/healthz"),
        ("GET", "/dead//", "/dead"),
    ],
)
def test_a_trailing_slash_is_a_404_naming_the_route(
    client: TestClient, method: str, path: str, route: str
) -> None:
    answer = client.request(method, path, json={"task": "t"}, follow_redirects=False)
    message = assert_error(answer, 404, "not_found")
    assert message.endswith(f"the route is {route}")
