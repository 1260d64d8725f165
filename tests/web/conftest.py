"""Fixtures of the HTTP API tests: the app built by ``create_app`` on the test database (see
``tests/conftest.py``), with one full and one read-only token, and HTTP clients for it (Starlette's
TestClient: httpx, the app served in process, its lifespan run)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI

with warnings.catch_warnings():
    # Starlette asks for its httpx fork (httpx2) when it finds httpx; the client works the same.
    warnings.simplefilter("ignore", UserWarning)
    from starlette.testclient import TestClient as TestClient

from pgjobs.db.dsn import Dsn
from pgjobs.web import create_app

TOKEN = "full-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_AUTH = {"Authorization": f"Bearer {READ_TOKEN}"}


@pytest.fixture(autouse=True)
def _no_tokens_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No token reaches a test from the environment it runs in."""
    for name in (
        "PGJOBS_API_TOKENS",
        "PGJOBS_API_TOKENS_FILE",
        "PGJOBS_API_READ_TOKENS",
        "PGJOBS_API_READ_TOKENS_FILE",
        "PGJOBS_METRICS_PUBLIC",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def make_web(dsn: Dsn) -> Callable[..., FastAPI]:
    """Factory of API apps on the test database: two connections at most, both tokens."""

    def make(**kwargs: Any) -> FastAPI:
        options: dict[str, Any] = {
            "dsn": dsn,
            "tokens": [TOKEN],
            "read_only_tokens": [READ_TOKEN],
            "pool_size": 2,
        }
        options.update(kwargs)
        return create_app(**options)

    return make


@pytest.fixture
def web(make_web: Callable[..., FastAPI]) -> FastAPI:
    return make_web()


@pytest.fixture
def client(web: FastAPI) -> Iterator[TestClient]:
    """A client with the full token."""
    with TestClient(web, headers=AUTH) as test_client:
        yield test_client


@pytest.fixture
def anonymous(web: FastAPI) -> Iterator[TestClient]:
    """A client without a token."""
    with TestClient(web) as test_client:
        yield test_client


def assert_error(response: Any, status: int, code: str, field: str | None = None) -> str:
    """``response`` is the one error shape with ``status`` and ``code`` (and ``field``, when
    given); returns its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}, body
    assert body["error"]["code"] == code, body
    if field is not None:
        assert body["error"]["field"] == field, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])
