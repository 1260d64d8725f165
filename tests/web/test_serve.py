"""`pgjobs serve` as a real process on uvicorn: it answers, refuses to start without a token
unless told it is insecure (and then says so), and keeps tokens out of its output."""

from __future__ import annotations

import socket

import httpx

from pgjobs.db.dsn import Dsn
from tests.support.helpers import pgjobs_process, run_pgjobs, wait_until
from tests.web.conftest import READ_TOKEN, TOKEN

#: How `pgjobs serve` ends on SIGTERM: a graceful shutdown, exit 0.
STOPPED = (0,)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, **kwargs: object) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2, **kwargs)  # type: ignore[arg-type]
    except httpx.TransportError:
        return None


def test_serve_answers_with_tokens_and_never_prints_them(
    subprocess_env: dict[str, str],
) -> None:
    env = {**subprocess_env, "PGJOBS_API_TOKENS": TOKEN, "PGJOBS_API_READ_TOKENS": READ_TOKEN}
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with pgjobs_process(env, "serve", "--port", str(port), "--pool-size", "2") as server:
        health = wait_until(
            lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server]
        )
        assert health.json() == {"status": "ok"}
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
        auth = {"Authorization": f"Bearer {TOKEN}"}
        created = httpx.post(f"{base}/api/v1/jobs", json={"task": "t"}, headers=auth)
        assert created.status_code == 201, created.text
        read = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert httpx.get(f"{base}/api/v1/jobs", headers=read).status_code == 200
        assert httpx.get(f"{base}/api/v1/jobs").status_code == 401
        assert server.stop() in STOPPED
        output = server.out() + server.err()
    assert "/api/v1/jobs" in output  # the access log was on
    for token in (TOKEN, READ_TOKEN):
        assert token not in output


def test_serve_refuses_to_start_without_a_token(subprocess_env: dict[str, str]) -> None:
    result = run_pgjobs(subprocess_env, "serve", "--port", str(_free_port()))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("pgjobs: error: no API token")
    assert "--insecure-no-auth" in lines[0]


def test_serve_insecure_says_so_on_start(subprocess_env: dict[str, str]) -> None:
    port = _free_port()
    with pgjobs_process(
        subprocess_env, "serve", "--port", str(port), "--insecure-no-auth", "--pool-size", "1"
    ) as server:
        wait_until(
            lambda: _get(f"http://127.0.0.1:{port}/healthz"),
            timeout=30,
            what="/healthz",
            procs=[server],
        )
        created = httpx.post(f"http://127.0.0.1:{port}/api/v1/jobs", json={"task": "t"})
        assert created.status_code == 201
        assert server.stop() in STOPPED
        assert "WITHOUT AUTHENTICATION" in server.err()


def test_serve_behind_a_proxy_prefix_links_under_it(subprocess_env: dict[str, str]) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = ("serve", "--port", str(port), "--insecure-no-auth", "--root-path", "/pgjobs")
    with pgjobs_process(subprocess_env, *args, "--pool-size", "1") as server:
        wait_until(lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server])
        # The proxy strips the prefix; the pages link under it.
        page = httpx.get(f"{base}/dead")
        assert page.status_code == 200, page.text
        assert 'href="/pgjobs/jobs' in page.text
        assert server.stop() in STOPPED
    result = run_pgjobs(subprocess_env, "serve", "--insecure-no-auth", "--root-path", "pgjobs/")
    assert result.returncode == 2
    assert result.stderr.startswith("pgjobs: error: --root-path") and result.stderr.count("\n") == 1


def test_serve_with_an_app_accepts_only_its_tasks(subprocess_env: dict[str, str], dsn: Dsn) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = ("serve", "--port", str(port), "--insecure-no-auth", "--pool-size", "1")
    app = ("--app", "tests.integration.cli_app:app", "--dsn", dsn.url)
    with pgjobs_process({**subprocess_env, "PGJOBS_DATABASE_URL": ""}, *args, *app) as server:
        wait_until(lambda: _get(f"{base}/healthz"), timeout=30, what="/healthz", procs=[server])
        unknown = httpx.post(f"{base}/api/v1/jobs", json={"task": "cli.nope"})
        assert unknown.status_code == 422
        assert unknown.json()["error"]["code"] == "unknown_task"
        known = httpx.post(
            f"{base}/api/v1/jobs", json={"task": "cli.shout", "payload": {"text": "a"}}
        )
        assert known.status_code == 201, known.text
        assert known.json()["queue"] == "loud"  # the task's default
        server.stop()


def test_serve_bad_options_are_one_line(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "PGJOBS_API_TOKENS": "short"}
    result = run_pgjobs(env, "serve", "--port", str(_free_port()))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "at least 16" in result.stderr
    assert "short" not in result.stderr.replace("characters long", "")
    result = run_pgjobs(subprocess_env, "serve", "--insecure-no-auth", "--app", "no.such:app")
    assert result.returncode == 2
    assert result.stderr.startswith("pgjobs: error: --app") and result.stderr.count("\n") == 1
