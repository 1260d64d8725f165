"""Bearer tokens: none or a wrong one is 401 with a challenge, a read-only token may only read,
tokens come from the arguments or the environment (and files), a server without any refuses to
start unless told it is insecure, and no token ever reaches a log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI

from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError
from pgjobs.web import create_app
from pgjobs.web.auth import load_tokens
from tests.web.conftest import AUTH, READ_AUTH, READ_TOKEN, TOKEN, TestClient, assert_error


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789abcdef"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
)
def test_no_or_wrong_token_is_401_with_a_challenge(
    anonymous: TestClient, headers: dict[str, str]
) -> None:
    for response in (
        anonymous.get("/api/v1/jobs", headers=headers),
        anonymous.post("/api/v1/jobs", json={"task": "t"}, headers=headers),
        anonymous.get("/api/v1/stats", headers=headers),
    ):
        assert_error(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_read_only_token_reads_and_may_not_write(anonymous: TestClient) -> None:
    created = anonymous.post("/api/v1/jobs", json={"task": "t"}, headers=AUTH)
    assert created.status_code == 201
    job_id = created.json()["id"]
    assert anonymous.get(f"/api/v1/jobs/{job_id}", headers=READ_AUTH).status_code == 200
    assert anonymous.get("/api/v1/stats", headers=READ_AUTH).status_code == 200
    for response in (
        anonymous.post("/api/v1/jobs", json={"task": "t"}, headers=READ_AUTH),
        anonymous.put("/api/v1/jobs/k", json={"task": "t"}, headers=READ_AUTH),
        anonymous.post(f"/api/v1/jobs/{job_id}/cancel", headers=READ_AUTH),
        anonymous.post("/api/v1/dead-letters/purge", json={"all": True}, headers=READ_AUTH),
    ):
        assert_error(response, 403, "forbidden")
    assert anonymous.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()["status"] == "ready"


def test_tokens_from_the_environment_and_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dsn: Dsn
) -> None:
    other = "another-token-from-a-file-0001"
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# the deploy's tokens\n\n{other}\n", encoding="utf-8")
    read_file = tmp_path / "read-tokens"
    read_file.write_text(READ_TOKEN + "\n", encoding="utf-8")
    monkeypatch.setenv("PGJOBS_API_TOKENS", f" {TOKEN} ")
    monkeypatch.setenv("PGJOBS_API_TOKENS_FILE", str(tokens_file))
    monkeypatch.setenv("PGJOBS_API_READ_TOKENS_FILE", str(read_file))
    with TestClient(create_app(dsn=dsn, pool_size=1)) as client:
        for token in (TOKEN, other):
            created = client.post(
                "/api/v1/jobs", json={"task": "t"}, headers={"Authorization": f"Bearer {token}"}
            )
            assert created.status_code == 201, created.text
        writes = client.post("/api/v1/jobs", json={"task": "t"}, headers=READ_AUTH)
        assert_error(writes, 403, "forbidden")
        assert client.get("/api/v1/jobs", headers=READ_AUTH).status_code == 200


def test_no_token_refuses_to_build_the_app_unless_insecure(
    dsn: Dsn, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigurationError, match="PGJOBS_API_TOKENS"):
        create_app(dsn=dsn)
    with caplog.at_level(logging.WARNING, logger="pgjobs.web"):
        web = create_app(dsn=dsn, insecure_no_auth=True, pool_size=1)
    assert "WITHOUT AUTHENTICATION" in caplog.text
    with TestClient(web) as client:
        assert client.post("/api/v1/jobs", json={"task": "t"}).status_code == 201
    with pytest.raises(ConfigurationError, match="drop one"):
        create_app(dsn=dsn, tokens=[TOKEN], insecure_no_auth=True)


@pytest.mark.parametrize(
    ("tokens", "read_only", "words"),
    [
        (["short"], None, ["#1", "5 characters", "at least 16"]),
        ([TOKEN, "with space inside token"], None, ["#2", "spaces"]),
        ([TOKEN], [TOKEN], ["both"]),
    ],
)
def test_bad_tokens_are_refused_without_quoting_them(
    tokens: list[str], read_only: list[str] | None, words: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_tokens(tokens, read_only)
    for word in words:
        assert word in str(refused.value)
    for token in tokens:
        assert token not in str(refused.value)


def test_unreadable_token_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PGJOBS_API_TOKENS_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_tokens()


def test_tokens_never_reach_the_logs(
    make_web: Callable[..., FastAPI], caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-token-that-must-not-be-logged"
    with caplog.at_level(logging.DEBUG), TestClient(make_web()) as client:
        client.post("/api/v1/jobs", json={"task": "t"}, headers=AUTH)
        client.get("/api/v1/jobs/1", headers=READ_AUTH)
        client.post("/api/v1/jobs", json={"task": "t"}, headers=READ_AUTH)
        client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {wrong}"})
        client.get("/api/v1/jobs", headers={"Authorization": f"Basic {wrong}"})
    assert caplog.records, "nothing was logged: the test would prove nothing"
    for secret in (TOKEN, READ_TOKEN, wrong):
        assert secret not in caplog.text
