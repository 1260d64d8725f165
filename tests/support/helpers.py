"""Helpers shared by unit, integration and acceptance tests. None is a fixture and none opens a
connection of its own: they wait for a condition with a deadline, check the three-table invariant
on a connection they are given, and run `pgjobs` in process or as a subprocess.

The fixtures built on them are in ``tests/conftest.py``; the rows integration tests need are built
by ``tests/support/factories.py``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGTERM
from typing import IO, TYPE_CHECKING, Any, TypeVar

from psycopg.conninfo import conninfo_to_dict

from pgjobs import cli

if TYPE_CHECKING:
    import psycopg
    import pytest

T = TypeVar("T")

#: The repository's root: subprocesses run there, with it on PYTHONPATH (the test apps live in it).
REPO = Path(__file__).resolve().parents[2]

#: The three homes of a job.
TABLES = ("queued_jobs", "archived_jobs", "dead_letter")


# -- waiting -------------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float = 10.0,
    what: str | Callable[[], str] = "",
    procs: Sequence[Proc] = (),
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that. Fail after
    ``timeout`` seconds (a bound, not a measurement) saying ``what`` was awaited (a callable is
    asked at that moment, to show the latest figures), or at once when one of ``procs`` exits.

    >>> wait_until(lambda: archived() == 10, timeout=30, what="10 jobs archived", procs=[worker])
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        awaited = what() if callable(what) else what or repr(predicate)
        for proc in procs:
            if not proc.alive():
                raise AssertionError(f"exited while waiting for {awaited}: {proc.describe()}")
        if time.monotonic() >= deadline:
            details = "".join(f"\n{proc.describe()}" for proc in procs)
            raise AssertionError(f"timed out after {timeout}s waiting for {awaited}{details}")
        time.sleep(interval)


def wait_archived(
    conn: psycopg.Connection[Any],
    jobs: int,
    *,
    timeout: float,
    procs: Sequence[Proc] = (),
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> None:
    """Wait until archived_jobs holds ``jobs`` rows; ``detail`` adds to the message on failure.

    >>> wait_archived(conn, 300, timeout=60, procs=[worker])
    """

    def what() -> str:
        now = count(conn, "archived_jobs")
        return f"{jobs} jobs archived (now {now}){'; ' + detail() if detail else ''}"

    wait_until(
        lambda: count(conn, "archived_jobs") == jobs,
        timeout=timeout,
        what=what,
        procs=procs,
        interval=interval,
    )


# -- rows and the three-table invariant ----------------------------------------------------------


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """The first column of the first row of ``query``."""
    found = conn.execute(query, params).fetchone()
    assert found is not None, query
    return found[0]


def count(conn: psycopg.Connection[Any], table: str) -> int:
    """The rows in ``table``."""
    return int(scalar(conn, f"SELECT count(*) FROM {table}"))


def homes(conn: psycopg.Connection[Any]) -> dict[int, str]:
    """Where every job id lives, asserting that none lives in two tables at once."""
    rows = conn.execute(
        " UNION ALL ".join(f"SELECT '{table}', id FROM {table}" for table in TABLES)
    ).fetchall()
    seen = Counter(job_id for _, job_id in rows)
    twice = sorted(job_id for job_id, n in seen.items() if n > 1)
    assert not twice, f"job ids in more than one table: {twice[:20]}"
    return {job_id: table for table, job_id in rows}


def assert_one_home(conn: psycopg.Connection[Any], ids: Iterable[int]) -> dict[int, str]:
    """The invariant: every enqueued id is in exactly one of the three tables, and the tables
    hold no other id. Returns where each id is."""
    where = homes(conn)
    expected = set(ids)
    missing, unexpected = sorted(expected - set(where)), sorted(set(where) - expected)
    assert not missing and not unexpected, (
        f"{len(missing)} missing: {missing[:20]}, {len(unexpected)} unexpected: {unexpected[:20]}"
    )
    return where


# -- pgjobs in process ---------------------------------------------------------------------------


def database_name(url: str) -> str:
    """The database ``url`` connects to, whatever form its host takes (``...@host:5432/db`` or the
    embedded server's ``...@/db?host=/folder``)."""
    return str(conninfo_to_dict(url)["dbname"])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``pgjobs ARGV`` in process: (exit code, stdout, stderr)."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    """A failed command's stderr: one line, "pgjobs: error: ...", naming each of ``words``."""
    assert code != 0, f"exit code 0, stderr {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith("pgjobs: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]


# -- pgjobs as a subprocess ----------------------------------------------------------------------


def pgjobs_command(*args: str) -> list[str]:
    """`pgjobs ARGS...` run by this interpreter."""
    return [sys.executable, "-m", "pgjobs", *args]


def pgjobs_env(url: str | None) -> dict[str, str]:
    """The environment of a `pgjobs` subprocess: this one's, with ``url`` as the only DSN (none at
    all when None: the embedded server), the repository on PYTHONPATH, and rich tables 200
    columns wide (as wide as they are drawn when stdout is not a terminal)."""
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env.pop("PGJOBS_DATABASE_URL", None)
    if url is not None:
        env["PGJOBS_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "200"
    return env


def run_pgjobs(
    env: Mapping[str, str], *args: str, timeout: float = 60, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """`pgjobs ARGS...` to its end (``timeout`` bounds a hang): exit code, stdout, stderr."""
    with pgjobs_process(env, *args, cwd=cwd) as proc:
        code = proc.wait_exit(timeout)
        return subprocess.CompletedProcess(pgjobs_command(*args), code, proc.out(), proc.err())


@dataclass
class Proc:
    """A `pgjobs` subprocess whose stdout and stderr go to files (a pipe could fill up and block
    it)."""

    popen: subprocess.Popen[bytes]
    args: Sequence[str]
    stdout: IO[bytes] = field(repr=False)
    stderr: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def out(self) -> str:
        return Path(self.stdout.name).read_text(encoding="utf-8", errors="replace")

    def err(self) -> str:
        return Path(self.stderr.name).read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        """The exit code, failing when the process is still running after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s: {self.describe()}") from None

    def stop(self, signum: int = SIGTERM, timeout: float = 30.0) -> int:
        """Send ``signum`` and return the exit code (fails when it does not exit in time)."""
        self.signal(signum)
        return self.wait_exit(timeout)

    def describe(self) -> str:
        return (
            f"pid {self.pid} (pgjobs {' '.join(self.args)}) exit={self.popen.poll()}, "
            f"stderr tail:\n{self.err()[-2000:]}"
        )


@contextlib.contextmanager
def pgjobs_process(env: Mapping[str, str], *args: str, cwd: Path = REPO) -> Iterator[Proc]:
    """`pgjobs ARGS...` in the background, with ``env`` (see ``pgjobs_env``), in ``cwd`` (the
    repository); killed (SIGKILL) and reaped if it is still running at the end.

    >>> with pgjobs_process(pgjobs_env(dsn.url), "work", "--app", APP) as worker: ...
    """
    with (
        tempfile.NamedTemporaryFile(prefix="pgjobs-out-") as stdout,
        tempfile.NamedTemporaryFile(prefix="pgjobs-err-") as stderr,
    ):
        popen = subprocess.Popen(
            pgjobs_command(*args),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            yield Proc(popen, args, stdout, stderr)
        finally:
            if popen.poll() is None:
                popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)


def stop(procs: Sequence[Proc], timeout: float) -> list[int]:
    """SIGTERM every process, then wait for each; their exit codes."""
    for proc in procs:
        proc.signal(SIGTERM)
    return [proc.wait_exit(timeout) for proc in procs]
