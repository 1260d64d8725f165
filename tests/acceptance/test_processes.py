"""`pgjobs work --processes N`: one command runs N worker processes under a supervisor that
forwards signals, replaces a worker process that dies, and exits with one error line when they
cannot start. Worker processes are found through /proc (their parent is the supervisor)."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import pytest

from pgjobs import JobSpec
from tests.acceptance.conftest import APP, lease_owner_pattern, wait_busy
from tests.acceptance.workload import SHORT_LEASE
from tests.support.helpers import (
    Proc,
    assert_one_home,
    assert_one_line_error,
    count,
    scalar,
    stop,
    wait_archived,
    wait_until,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes in /proc"),
]

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the name may hold spaces and ")"


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for child in _pids():
        fields = _stat(child)
        if fields is not None and fields[0] != "Z" and int(fields[1]) == pid:
            found.add(child)
    return found


def _running_with(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for pid in _pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and _alive(pid):
            found.append(pid)
    return found


def _registered(conn, pids: set[int]) -> set[int]:
    """Those of ``pids`` with a live row in pgjobs_workers (`pgjobs stats` lists them)."""
    rows = conn.execute(
        "SELECT pid FROM pgjobs_workers"
        " WHERE pid = ANY(%s) AND last_seen_at > now() - interval '60 seconds'",
        [list(pids)],
    ).fetchall()
    return {row[0] for row in rows}


def _wait_for_processes(conn, supervisor, count: int) -> set[int]:
    """Wait until ``supervisor`` has ``count`` worker processes, each registered; their pids."""

    def registered() -> set[int] | None:
        children = _children(supervisor.pid)
        if len(children) == count and _registered(conn, children) == children:
            return children
        return None

    found: set[int] = wait_until(
        registered,
        timeout=30,
        what=lambda: f"{count} registered worker processes, got {_children(supervisor.pid)}",
        procs=[supervisor],
    )
    return found


def test_two_processes_share_the_queue_and_show_as_two_workers(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    supervisor = start_worker("--processes", "2", "--concurrency", "4")
    children = _wait_for_processes(conn, supervisor, 2)
    assert supervisor.pid not in children

    jobs = 300
    ids = app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(jobs))
    wait_archived(conn, jobs, timeout=60, procs=[supervisor])
    # Still two live workers after the run, the same two processes.
    assert _children(supervisor.pid) == children
    assert _registered(conn, children) == children

    assert_one_home(conn, ids)
    assert count(conn, "queued_jobs") == 0
    done = conn.execute(
        "SELECT count(*), count(DISTINCT key) FROM runs WHERE phase = 'done'"
    ).fetchone()
    assert done == (jobs, jobs), "every job ran to completion exactly once"
    pids = {row[0] for row in conn.execute("SELECT DISTINCT worker_pid FROM runs")}
    assert pids == children, "both worker processes ran jobs"

    assert stop([supervisor], timeout=30) == [0], supervisor.describe()
    assert not [pid for pid in children if _alive(pid)]
    assert _registered(conn, children) == set(), "worker processes unregister at a clean exit"


def test_sigterm_lets_every_process_finish_its_running_jobs(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    concurrency = 2
    ids = app.enqueue_many(JobSpec("accept.slow", {"key": n, "seconds": 2.0}) for n in range(8))
    supervisor = start_worker("--processes", "2", "--concurrency", str(concurrency))
    children = _wait_for_processes(conn, supervisor, 2)

    wait_busy(conn, supervisor, children, concurrency)
    in_flight = {
        row[0] for row in conn.execute("SELECT id FROM queued_jobs WHERE lease_owner IS NOT NULL")
    }
    assert stop([supervisor], timeout=30) == [0], supervisor.describe()
    assert not [pid for pid in children if _alive(pid)], "a worker process outlived the supervisor"

    # What ran finished, once each; the rest is ready, with no attempt used.
    archived = conn.execute("SELECT id, status, attempts FROM archived_jobs").fetchall()
    assert {row[0] for row in archived} == in_flight
    assert {(row[1], row[2]) for row in archived} == {("succeeded", 1)}
    rest = conn.execute("SELECT id, lease_owner, attempts FROM queued_jobs").fetchall()
    assert {row[0] for row in rest} == set(ids) - in_flight
    assert {row[1:] for row in rest} == {(None, 0)}
    done = conn.execute("SELECT key, count(*) FROM runs WHERE phase = 'done' GROUP BY key")
    assert sorted(n for _, n in done) == [1] * len(in_flight)
    assert "SIGTERM: forwarded to 2 worker process(es)" in supervisor.err()


def test_second_sigterm_makes_every_process_exit_at_once(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    handler_seconds = 30.0  # far longer than the bound on the exit below
    app.enqueue_many(
        JobSpec("accept.slow", {"key": n, "seconds": handler_seconds}) for n in range(4)
    )
    supervisor = start_worker("--processes", "2", "--concurrency", "2")
    children = _wait_for_processes(conn, supervisor, 2)
    wait_busy(conn, supervisor, children, 2)  # both processes running jobs
    supervisor.signal(signal.SIGTERM)
    wait_until(
        lambda: supervisor.err().count("finishing") == 2,
        timeout=10,
        what="both worker processes told to finish",
        procs=[supervisor],
    )
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait_exit(handler_seconds / 2) == 128 + signal.SIGTERM, supervisor.describe()
    assert not [pid for pid in children if _alive(pid)]
    assert scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'done'") == 0


def test_kill_9_of_a_worker_process_starts_another_and_loses_no_job(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    jobs = 24
    ids = app.enqueue_many(
        JobSpec("accept.slow_short_lease", {"key": n, "seconds": 1.5}) for n in range(jobs)
    )
    supervisor = start_worker("--processes", "2", "--concurrency", "4", "--rescue-interval", "0.5")
    children = _wait_for_processes(conn, supervisor, 2)
    victim = min(children)

    def victim_holds_jobs() -> bool:
        held = scalar(
            conn,
            "SELECT count(*) FROM queued_jobs WHERE lease_owner LIKE %s",
            [lease_owner_pattern(victim)],
        )
        return bool(held > 0)

    wait_until(victim_holds_jobs, timeout=30, what="the victim to hold jobs", procs=[supervisor])
    os.kill(victim, signal.SIGKILL)

    replacements = wait_until(
        lambda: (_children(supervisor.pid) - children) or None,
        timeout=30,
        what="a worker process to replace the one killed",
        procs=[supervisor],
    )
    assert len(replacements) == 1
    assert not _alive(victim)
    lines = [line for line in supervisor.err().splitlines() if f"process {victim} " in line]
    assert len(lines) == 1, lines
    assert "was killed by SIGKILL" in lines[0] and "starting another" in lines[0]

    # Every job finishes, the killed process's after their lease ran out.
    bound = SHORT_LEASE + jobs * 1.5 / 4 + 30
    wait_archived(conn, jobs, timeout=bound, procs=[supervisor], interval=0.25)
    assert_one_home(conn, ids)
    statuses = conn.execute("SELECT DISTINCT status FROM archived_jobs").fetchall()
    assert statuses == [("succeeded",)]
    twice = conn.execute(
        "SELECT key FROM runs WHERE phase = 'done' GROUP BY key HAVING count(*) > 1"
        " EXCEPT SELECT key FROM runs WHERE worker_pid = %s",
        [victim],
    ).fetchall()
    assert twice == [], "only the killed process's jobs may have run twice"

    survivors = _children(supervisor.pid)
    assert survivors == (children - {victim}) | replacements
    assert _registered(conn, survivors) == survivors
    assert stop([supervisor], timeout=30) == [0], supervisor.describe()
    assert not [pid for pid in survivors if _alive(pid)]


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("bad app", 2, ["cannot import"]),
        ("missing schema", 1, ["pgjobs migrate"]),
        ("unreachable database", 1, ["cannot reach the database"]),
    ],
)
def test_a_failed_start_is_one_error_line_and_leaves_no_process(
    dsn, create_database, spawn, case, code, words
):
    marker = f"marker-{secrets.token_hex(4)}"  # a queue name, to find the worker processes
    options = ["--processes", "2", "--queue", marker, "--poll-interval", "0.2"]
    if case == "bad app":
        supervisor = spawn("work", "--app", "tests.acceptance.no_such_module:app", *options)
    elif case == "missing schema":
        supervisor = spawn("work", "--app", APP, *options, "--dsn", create_database().url)
    else:
        supervisor = spawn("work", "--app", APP, *options, "--dsn", UNREACHABLE)
    assert supervisor.wait_exit(60) == code, supervisor.describe()
    assert_one_line_error(code, supervisor.err(), *words)
    assert _running_with(marker) == []


def test_burst_exits_0_once_the_queue_is_empty(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    jobs = 50
    ids = app.enqueue_many(JobSpec("accept.record", {"key": n}) for n in range(jobs))
    marker = f"marker-{secrets.token_hex(4)}"
    first = start_worker("--processes", "2", "--burst", "--queue", "default", "--queue", marker)
    assert first.wait_exit(60) == 0, first.describe()
    assert count(conn, "archived_jobs") == jobs
    assert_one_home(conn, ids)
    assert count(conn, "queued_jobs") == 0

    # Nothing left: a second burst finds the queue empty and exits 0 too.
    again = start_worker("--processes", "2", "--burst", "--queue", "default", "--queue", marker)
    assert again.wait_exit(60) == 0, again.describe()
    assert _running_with(marker) == []


def test_worker_processes_stop_when_the_supervisor_is_killed(make_app, runs, start_worker):
    conn = runs
    app = make_app()
    app.enqueue_many(JobSpec("accept.slow", {"key": n, "seconds": 2.0}) for n in range(2))
    supervisor = start_worker("--processes", "2", "--concurrency", "1")
    children = _wait_for_processes(conn, supervisor, 2)
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'start'") == 2,
        timeout=30,
        what="both jobs running",
        procs=[supervisor],
    )
    supervisor.signal(signal.SIGKILL)
    assert supervisor.wait_exit(10) == -signal.SIGKILL

    # Orphaned, each worker process stops as on SIGTERM: it finishes its job and unregisters.
    wait_until(
        lambda: not [pid for pid in children if _alive(pid)],
        timeout=30,
        what=lambda: f"worker processes {children} to stop",
    )
    assert count(conn, "archived_jobs") == 2
    assert scalar(conn, "SELECT count(*) FROM runs WHERE phase = 'done'") == 2
    assert _registered(conn, children) == set()


def _start_imports_app(
    spawn, subprocess_env: dict[str, str], tmp_path: Path, *options: str
) -> tuple[Proc, Path]:
    """`pgjobs work --processes 2 OPTIONS...` on tests/acceptance/imports_app.py, and its log."""
    log = tmp_path / "imports.log"
    log.touch()
    env = {**subprocess_env, "PGJOBS_TEST_IMPORTS_LOG": str(log)}
    app = "tests.acceptance.imports_app:app"
    return spawn("work", "--app", app, "--processes", "2", *options, env=env), log


def _said(log: Path) -> dict[str, set[int]]:
    """The pids of each word in the imports app's log (``import``, ``run``, ``exit``)."""
    words: dict[str, set[int]] = {}
    for line in log.read_text().splitlines():
        word, pid = line.split()
        words.setdefault(word, set()).add(int(pid))
    return words


def test_each_worker_process_imports_the_app_itself_and_runs_its_exit_handlers(
    make_app, conn, spawn, subprocess_env, tmp_path
):
    # The worker processes are forked before the command imports the app: each imports it
    # itself (what it started at import, a thread here, is its own), runs jobs, and at its end
    # runs the atexit handlers the app registered. The supervisor imports the app too (to find
    # its database) and runs none of its jobs.
    jobs = 40
    make_app(check_task_names=False).enqueue_many(
        JobSpec("imports.record", {}) for _ in range(jobs)
    )
    supervisor, log = _start_imports_app(
        spawn, subprocess_env, tmp_path, "--burst", "--concurrency", "2"
    )
    assert supervisor.wait_exit(60) == 0, supervisor.describe()
    assert count(conn, "archived_jobs") == jobs
    words = _said(log)
    workers = words["run"]
    assert supervisor.pid not in workers
    assert words["import"] == workers | {supervisor.pid}, words
    assert words["exit"] == words["import"], "every process ran the app's atexit handler"
    assert len(log.read_text().splitlines()) == jobs + 2 * len(words["import"])


def test_a_replacement_starts_while_the_supervisor_runs_a_thread_of_the_app(
    make_app, conn, spawn, subprocess_env, tmp_path
):
    # The supervisor imported the app, which started a thread: a worker process that replaces
    # one killed is a fresh interpreter (never a fork of that process), and it works.
    supervisor, log = _start_imports_app(spawn, subprocess_env, tmp_path, "--poll-interval", "0.2")
    children = _wait_for_processes(conn, supervisor, 2)
    victim = min(children)
    os.kill(victim, signal.SIGKILL)
    replacement = wait_until(
        lambda: (_children(supervisor.pid) - children) or None,
        timeout=30,
        what="a worker process to replace the one killed",
        procs=[supervisor],
    )
    [new] = replacement
    wait_until(lambda: new in _registered(conn, {new}) or None, timeout=30, what="registered")
    assert b"--supervisor-fd=" in Path(f"/proc/{new}/cmdline").read_bytes()
    make_app(check_task_names=False).enqueue_many(JobSpec("imports.record", {}) for _ in range(20))
    wait_archived(conn, 20, timeout=30, procs=[supervisor])
    assert stop([supervisor], timeout=30) == [0], supervisor.describe()
    assert new in _said(log)["import"]
