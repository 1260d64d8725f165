"""What every benchmark group needs: a throwaway database, fills, subprocesses that are always
reaped, and the measurements read from the outside (throughput from ``finished_at``, the CPU of
the database's backends from /proc, peak RSS from /proc/PID/status)."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from rich.console import Console

from benchmarks import QUEUE
from pgjobs import migrate, queries
from pgjobs.db.dsn import ENV_DSN, Dsn

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Days over which the history rows of ``fill_archived`` finished.
HISTORY_DAYS = 30
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

#: Progress lines go to stderr, so that ``--json`` output on stdout stays clean.
progress = Console(stderr=True, highlight=False)


def say(message: str) -> None:
    progress.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


class BenchmarkError(Exception):
    """A benchmark could not measure what it set out to (a worker failed, a wait timed out)."""


# -- the database -------------------------------------------------------------------------------


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    if "dbname=" in parts.query:
        query = "&".join(
            f"dbname={name}" if item.startswith("dbname=") else item
            for item in parts.query.split("&")
        )
        return urlunsplit(parts._replace(query=query))
    return urlunsplit(parts._replace(path=f"/{name}"))


class BenchDatabase:
    """A database ``pgjobs_bench_<random>`` created on the server of ``server``, migrated, and
    dropped by ``drop()``; ``conn`` is an autocommit connection to it for fills and readings."""

    def __init__(self, server: Dsn) -> None:
        self.server = server
        self.name = f"pgjobs_bench_{secrets.token_hex(4)}"
        self.dsn = Dsn(_with_database(server.url, self.name), "bench")
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        try:
            migrate.upgrade(self.dsn)
            self.conn = psycopg.connect(self.dsn.url, autocommit=True)
        except BaseException:
            self._drop()
            raise
        #: Whether the server runs on this machine, so that /proc shows its backends' CPU.
        self.local = process_cpu(int(self.scalar("SELECT pg_backend_pid()"))) is not None

    @property
    def url(self) -> str:
        return self.dsn.url

    def drop(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.conn.close()
        self._drop()

    def _drop(self) -> None:
        with psycopg.connect(self.server.url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )

    def scalar(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else row[0]

    def reset(self) -> None:
        """Empty every pgjobs table."""
        self.conn.execute("TRUNCATE queued_jobs, archived_jobs, dead_letter")

    def fill_ready(self, jobs: int, task: str = "bench.noop", payload: str = "{}") -> int:
        """Insert ``jobs`` ready jobs (server-side, fast) and vacuum; returns a marker: every
        job inserted from now on has a larger id."""
        marker = int(self.scalar("SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id'))"))
        self.conn.execute(
            "INSERT INTO queued_jobs (queue, task, payload) "
            "SELECT %s, %s, %s::jsonb FROM generate_series(1, %s)",
            (QUEUE, task, payload, jobs),
        )
        self.vacuum("queued_jobs")
        return marker

    def fill_scheduled(self, jobs: int) -> None:
        """Insert ``jobs`` jobs of the benchmark queue that become ready only in a day."""
        self.conn.execute(
            "INSERT INTO queued_jobs (queue, task, payload, run_at) "
            "SELECT %s, 'bench.noop', '{}', now() + interval '1 day' FROM generate_series(1, %s)",
            (QUEUE, jobs),
        )
        self.vacuum("queued_jobs")

    def fill_archived(self, rows: int) -> None:
        """Add ``rows`` rows of history to archived_jobs, finished evenly over the last
        ``HISTORY_DAYS`` days, with ids no job will take (the id sequence moves past them).

        When archived_jobs is partitioned by day, the partitions of those days are created
        first, as the workers' archive-partitions service would have created them.
        """
        if self.scalar("SELECT relkind = 'p' FROM pg_class WHERE oid = 'archived_jobs'::regclass"):
            self.create_archive_days(HISTORY_DAYS)
        start = int(self.scalar("SELECT coalesce(max(id), 0) FROM archived_jobs")) + 1
        start = max(
            start, int(self.scalar("SELECT nextval(pg_get_serial_sequence('queued_jobs', 'id'))"))
        )
        chunk = 1_000_000
        for first in range(start, start + rows, chunk):
            last = min(first + chunk, start + rows) - 1
            self.conn.execute(
                "INSERT INTO archived_jobs (id, queue, task, payload, priority, run_at, attempts, "
                "max_attempts, status, worker, created_at, finished_at) "
                "SELECT g, 'history', 'bench.noop', '{}', 0, t, 1, 5, 'succeeded', 'bench', t, t "
                "FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g, "
                "LATERAL (SELECT now() - %(days)s * interval '1 day' "
                "                * (1 - (g - %(start)s) / %(rows)s::float8)) AS x(t)",
                {"first": first, "last": last, "start": start, "rows": rows, "days": HISTORY_DAYS},
            )
        self.conn.execute(
            "SELECT setval(pg_get_serial_sequence('queued_jobs', 'id'), %s)", (start + rows,)
        )
        # Vacuumed now, not by autovacuum during the next runs: a history grown over weeks has
        # been vacuumed as it grew, while autovacuum catching up on millions of fresh rows slowed
        # the runs after a fill (pgjobs and raw alike) by as much as half.
        self.vacuum("archived_jobs")
        with contextlib.suppress(psycopg.Error):
            self.conn.execute("CHECKPOINT")  # so that no checkpoint of the fill runs mid-measure

    def create_archive_days(self, days: int) -> None:
        """The daily archived_jobs partitions of today and the ``days`` before, as the workers'
        archive-partitions service would have created them."""
        from pgjobs.archive import create_statement

        today = datetime.now(UTC).date()
        with self.conn.transaction():
            self.conn.execute(queries.ARCHIVE_DDL_LOCK, {"key": queries.ARCHIVE_DDL_LOCK_KEY})
            for n in range(days + 1):
                day = today - timedelta(days=n)
                self.conn.execute(create_statement(day))

    def vacuum(self, *tables: str) -> None:
        for table in tables:
            self.conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))

    def archived_window(self, marker: int, table: str = "archived_jobs") -> Window:
        """The jobs archived with ids above ``marker``, and the span of their ``finished_at``
        (``table``: pgjobs' archive, or the narrow reference's ``narrow.archived_jobs``)."""
        row = self.conn.execute(
            sql.SQL(
                """
            WITH run AS (SELECT finished_at FROM {table} WHERE id > %(marker)s)
            SELECT count(*),
                   count(*) FILTER (WHERE finished_at = (SELECT min(finished_at) FROM run)),
                   coalesce(extract(epoch FROM min(finished_at)), 0)::float8,
                   coalesce(extract(epoch FROM max(finished_at)), 0)::float8
            FROM run
            """
            ).format(table=sql.Identifier(*table.split("."))),
            {"marker": marker},
        ).fetchone()
        assert row is not None
        return Window(int(row[0]), int(row[1]), float(row[2]), float(row[3]))

    def transactions(self) -> int:
        """Transactions committed or rolled back in the benchmark database so far (each
        autocommit statement is one; a backend reports its count at the latest when it exits)."""
        return int(
            self.scalar(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
        )

    def other_backends(self) -> list[int]:
        """Pids of the backends connected to the benchmark database, except ours."""
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    def wait_for_disconnects(self, timeout: float = 10.0) -> None:
        """Wait until no other backend is connected: a backend reports its statistics, and the
        postmaster accounts for its CPU, only once it has exited, a moment after its client."""
        wait_until(lambda: not self.other_backends(), timeout, "the workers' backends to exit")

    def listeners(self) -> int:
        """How many backends of the benchmark database LISTEN (wait for NOTIFY)."""
        return int(
            self.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query ILIKE 'LISTEN%%'"
            )
        )

    def queue_drained(self) -> bool:
        """No job of the benchmark queue is ready or running (scheduled ones may remain)."""
        return not self.scalar(
            "SELECT EXISTS (SELECT 1 FROM queued_jobs WHERE queue = %s "
            "AND (lease_expires_at IS NOT NULL OR run_at <= now()))",
            (QUEUE,),
        )


@dataclass(frozen=True, slots=True)
class Window:
    """Jobs archived by one run: ``count``, of which ``first`` finished at the very first
    ``finished_at``; ``started`` and ``ended`` are the first and last ``finished_at`` (Unix
    time, the server shares this machine's clock)."""

    count: int
    first: int
    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def rate(self) -> float:
        """Jobs/s over the processing window, startup excluded: the jobs that finished after
        the first batch, over the time from the first batch's settle to the last."""
        if self.seconds <= 0:
            return float("nan")
        return (self.count - self.first) / self.seconds


# -- CPU and memory from /proc ------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may hold spaces.
    return raw[raw.rindex(")") + 2 :].split()


def process_cpu(pid: int) -> float | None:
    """CPU seconds of a live process: from /proc/PID/schedstat (nanoseconds) when the kernel has
    it, else utime + stime from /proc/PID/stat (clock ticks, 10 ms)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return process_tree_cpu(pid)


def process_tree_cpu(pid: int) -> float | None:
    """CPU seconds of a live process and all its threads (utime + stime of /proc/PID/stat, in
    clock ticks of 10 ms; /proc/PID/schedstat counts the main thread only)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class CpuTrace:
    """CPU seconds of some processes over time, sampled while they run, so that the CPU they
    used between two moments (a processing window) can be read afterwards, without their
    startup and shutdown."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (Unix time, CPU seconds of all)

    def sample(self, pids: Sequence[int]) -> None:
        now = time.time()
        cpu = [process_tree_cpu(pid) for pid in pids]
        if None not in cpu:
            self.samples.append((now, sum(c for c in cpu if c is not None)))

    def at(self, when: float) -> float | None:
        """The CPU used by ``when``, interpolated between the samples around it."""
        for (t0, c0), (t1, c1) in itertools.pairwise(self.samples):
            if t0 <= when <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)
        return None

    def between(self, start: float, end: float) -> float | None:
        """CPU seconds used from ``start`` to ``end``; None when the samples do not cover both."""
        first, last = self.at(start), self.at(end)
        return None if first is None or last is None else last - first


def peak_rss_mib(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class BackendCpu:
    """CPU seconds used by the backends serving the benchmark database (ours excepted) while a
    run lasts, read from /proc: the backends alive at the start count from there, those that
    connect later (found in pg_stat_activity every quarter second) from zero, and a backend
    that exits counts with its last sample. ``sample()`` often (every few tens of ms) while
    the run goes on; other databases on the same server do not count."""

    def __init__(self, db: BenchDatabase) -> None:
        self.db = db
        self.start = {pid: process_cpu(pid) or 0.0 for pid in db.other_backends()}
        self.last = dict(self.start)
        self._listed = time.monotonic()

    def sample(self) -> None:
        if time.monotonic() - self._listed >= 0.25:
            for pid in self.db.other_backends():
                self.start.setdefault(pid, 0.0)
                self.last.setdefault(pid, 0.0)
            self._listed = time.monotonic()
        for pid in self.last:
            cpu = process_cpu(pid)
            if cpu is not None:
                self.last[pid] = cpu

    def seconds(self) -> float:
        return sum(self.last[pid] - self.start[pid] for pid in self.last)


def cpu_used(before: dict[int, float | None], pids: Sequence[int]) -> float:
    """CPU seconds the processes ``pids`` used since ``before`` (a ``{pid: process_cpu(pid)}``
    taken earlier); a process that was not running at both times counts as 0."""
    used = 0.0
    for pid in pids:
        start, end = before.get(pid), process_cpu(pid)
        if start is not None and end is not None:
            used += end - start
    return used


# -- subprocesses -------------------------------------------------------------------------------


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of worker subprocesses: the repository on sys.path, no DSN variables
    (every command gets ``--dsn``)."""
    env = dict(os.environ)
    for name in ENV_DSN:
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def pgjobs_worker(
    dsn: str, concurrency: int, *, burst: bool = True, app: str = "benchmarks.tasks:app"
) -> list[str]:
    """The command line of one `pgjobs work` process on the benchmark app (or ``app``)."""
    command = [sys.executable, "-m", "pgjobs", "work", "--app", app]
    command += ["--dsn", dsn, "--concurrency", str(concurrency), "--log-level", "warning"]
    return [*command, "--burst"] if burst else command


def raw_client(mode: str, dsn: str, *options: str) -> list[str]:
    """The command line of one raw-SQL reference client (``benchmarks/raw.py``)."""
    return [sys.executable, "-m", "benchmarks.raw", mode, "--dsn", dsn, *options]


@dataclass
class Proc:
    """A subprocess whose stderr goes to a file (a pipe could fill up and block it). ``wait``
    reaps it with ``wait4``, which gives its CPU time; its peak RSS is VmHWM, polled while it
    runs (``ru_maxrss`` would count the parent's memory too, shared until the exec)."""

    popen: subprocess.Popen[bytes]
    stderr_file: IO[bytes]
    command: Sequence[str]
    peak_rss: float = 0.0
    cpu: float | None = None
    returncode: int | None = None
    _started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr(self) -> str:
        self.stderr_file.flush()
        return Path(self.stderr_file.name).read_text(errors="replace")

    def sample(self) -> None:
        """Keep the peak RSS (VmHWM) seen so far; VmHWM only grows, so a sample every few tens
        of milliseconds misses at most the last moments of the process."""
        rss = peak_rss_mib(self.pid)
        if rss is not None:
            self.peak_rss = max(self.peak_rss, rss)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self.sample()
        pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        self.returncode = self.popen.returncode = os.waitstatus_to_exitcode(status)
        self.cpu = rusage.ru_utime + rusage.ru_stime
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"{self.describe()} still running after {timeout:.0f}s")
            time.sleep(0.02)
        if code != 0:
            raise BenchmarkError(f"{self.describe()} exited with {code}")
        return code

    def describe(self) -> str:
        tail = ""
        with contextlib.suppress(OSError, ValueError):
            tail = self.stderr()[-1500:]
        name = " ".join(self.command[1:5])
        return f"`{name} ...` (pid {self.pid}){': ' + tail if tail.strip() else ''}"

    def terminate(self) -> None:
        """SIGTERM (a graceful stop for a worker), if still running."""
        if self.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
        if self.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.popen.kill()
                os.waitpid(self.pid, 0)
                self.returncode = self.popen.returncode = -9
                return
            time.sleep(0.02)


class Procs:
    """Starts subprocesses and guarantees that none outlives the benchmark."""

    def __init__(self) -> None:
        self._all: list[Proc] = []

    def start(self, command: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        stderr_file = tempfile.NamedTemporaryFile(prefix="pgjobs-bench-", suffix=".log")  # noqa: SIM115
        popen = subprocess.Popen(
            list(command),
            cwd=REPO_ROOT,
            env=env if env is not None else subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
        )
        proc = Proc(popen, stderr_file, list(command))
        self._all.append(proc)
        return proc

    def last(self) -> Proc:
        """The process started last."""
        return self._all[-1]

    def stop_all(self) -> None:
        for proc in self._all:
            with contextlib.suppress(Exception):
                proc.stop(grace=5.0)
            proc.stderr_file.close()  # and deleted
        self._all.clear()


@contextlib.contextmanager
def procs() -> Iterator[Procs]:
    group = Procs()
    try:
        yield group
    finally:
        group.stop_all()


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


# -- the shared state of one benchmark run ------------------------------------------------------


@dataclass
class Context:
    """What groups share: the database, the size of the run, and results other groups reuse."""

    db: BenchDatabase
    quick: bool
    repeats: int
    procs: Procs
    cache: dict[str, Any] = field(default_factory=dict)

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def runs(self, at_most: int) -> int:
        """Runs per figure for a group whose runs are long or steady: ``repeats``, capped."""
        return min(self.repeats, at_most)
