"""Helpers for tests that run `pgjobs` as real processes: start workers, wait for conditions with
a deadline, and make sure no process outlives its test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from tests.acceptance.workload import RUNS_DDL

APP = "tests.acceptance.workload:app"


@dataclass
class Proc:
    """A `pgjobs` subprocess whose stderr goes to a file (a pipe could fill up and block it)."""

    popen: subprocess.Popen[bytes]
    args: Sequence[str]
    stderr_file: Any = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr(self) -> str:
        self.stderr_file.flush()
        with open(self.stderr_file.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        """The exit code, failing the test when the process is still running after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"pid {self.pid} ({' '.join(self.args[-6:])}) still running {timeout}s after "
                f"being told to stop; stderr tail:\n{self.stderr()[-2000:]}"
            )

    def describe(self) -> str:
        return f"pid {self.pid} exit={self.popen.poll()} stderr tail:\n{self.stderr()[-2000:]}"


def pgjobs_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgjobs", *args]


@pytest.fixture
def spawn(subprocess_env: dict[str, str]) -> Iterator[Callable[..., Proc]]:
    """Start `pgjobs ARGS...` in the background; every process still running at teardown is
    killed (SIGKILL) and reaped."""
    procs: list[Proc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Proc:
        stderr_file = tempfile.NamedTemporaryFile(prefix="pgjobs-acc-", suffix=".log")  # noqa: SIM115
        command = pgjobs_command(*args)
        popen = subprocess.Popen(
            command,
            env=env if env is not None else subprocess_env,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
            cwd=subprocess_env["PYTHONPATH"].split(os.pathsep)[0],
        )
        proc = Proc(popen, command, stderr_file)
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.alive():
                proc.popen.kill()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)
            proc.stderr_file.close()


@pytest.fixture
def start_worker(spawn: Callable[..., Proc]) -> Callable[..., Proc]:
    """Start `pgjobs work --app tests.acceptance.workload:app EXTRA...`."""

    def start(*extra: str, env: dict[str, str] | None = None) -> Proc:
        return spawn("work", "--app", APP, "--poll-interval", "0.2", *extra, env=env)

    return start


@pytest.fixture
def runs(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """An empty side table ``runs`` (see ``workload.RUNS_DDL``); returns the test connection."""
    conn.execute(RUNS_DDL)
    return conn


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """The first column of the first row of ``query``."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    message: str | Callable[[], str],
    *,
    procs: Sequence[Proc] = (),
    interval: float = 0.1,
) -> Any:
    """Poll ``condition`` until it returns something truthy (which is returned); fail with
    ``message`` after ``timeout`` seconds, or at once when one of ``procs`` died."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for proc in procs:
            if not proc.alive():
                pytest.fail(f"worker died while waiting ({_text(message)}): {proc.describe()}")
        if time.monotonic() >= deadline:
            details = "\n".join(proc.describe() for proc in procs)
            pytest.fail(f"timed out after {timeout}s: {_text(message)}\n{details}")
        time.sleep(interval)


def _text(message: str | Callable[[], str]) -> str:
    return message() if callable(message) else message


def lease_owner_pattern(pid: int) -> str:
    """A LIKE pattern matching the worker id ("host:pid:random") of the worker with ``pid``."""
    return f"%:{pid}:%"


def leased_and_started(conn: psycopg.Connection[Any], pid: int) -> tuple[int, int]:
    """(jobs leased to the worker process with ``pid``, handlers of it that started), from the
    acceptance app's ``runs`` table."""
    leased = scalar(
        conn,
        "SELECT count(*) FROM queued_jobs WHERE lease_owner LIKE %s",
        [lease_owner_pattern(pid)],
    )
    started = scalar(
        conn, "SELECT count(*) FROM runs WHERE worker_pid = %s AND phase = 'start'", [pid]
    )
    return leased, started


def stop(procs: Sequence[Proc], timeout: float) -> list[int]:
    """SIGTERM every process, then wait for each; returns their exit codes."""
    for proc in procs:
        proc.signal(signal.SIGTERM)
    return [proc.wait_exit(timeout) for proc in procs]
