"""Fixtures of the tests that run `pgjobs` as real processes: start workers, each killed at the
end of its test if still running, and the side table of the acceptance app. The helpers they use
(waiting, stopping, the invariant) are in ``tests/support/helpers.py``."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.workload import RUNS_DDL
from tests.support.helpers import Proc, pgjobs_process, scalar, wait_until

APP = "tests.acceptance.workload:app"


@pytest.fixture
def spawn(subprocess_env: dict[str, str]) -> Iterator[Callable[..., Proc]]:
    """Start `pgjobs ARGS...` in the background, on the test database unless ``env`` says
    otherwise; every process still running at teardown is killed (SIGKILL) and reaped."""
    with contextlib.ExitStack() as started:

        def start(*args: str, env: dict[str, str] | None = None) -> Proc:
            return started.enter_context(
                pgjobs_process(subprocess_env if env is None else env, *args)
            )

        yield start


@pytest.fixture
def start_worker(spawn: Callable[..., Proc]) -> Callable[..., Proc]:
    """Start `pgjobs work --app tests.acceptance.workload:app EXTRA...`."""

    def start(*extra: str, env: dict[str, str] | None = None) -> Proc:
        return spawn("work", "--app", APP, "--poll-interval", "0.2", *extra, env=env)

    return start


@pytest.fixture
def runs_file() -> Iterator[Path]:
    """An empty file where the failover tests' app records every run (see ``failover_app``),
    outside the database, in a folder the workers can reach whoever they run as."""
    with tempfile.TemporaryDirectory(prefix="pgjobs-failover-") as folder:
        path = Path(folder, "runs")
        path.touch()
        os.chmod(folder, 0o755)
        yield path


@pytest.fixture
def runs(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """An empty side table ``runs`` (see ``workload.RUNS_DDL``); returns the test connection."""
    conn.execute(RUNS_DDL)
    return conn


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


def wait_busy(
    conn: psycopg.Connection[Any], watched: Proc, pids: Collection[int], concurrency: int
) -> None:
    """Wait until every slot of each worker process in ``pids`` is busy: ``concurrency`` jobs
    leased and as many handlers started. Fails at once when ``watched`` exits."""

    def each() -> list[tuple[int, int]]:
        return [leased_and_started(conn, pid) for pid in pids]

    wait_until(
        lambda: all(found == (concurrency, concurrency) for found in each()),
        timeout=30,
        what=lambda: f"{concurrency} running jobs in each of {sorted(pids)}, got {each()}",
        procs=[watched],
        interval=0.05,
    )
