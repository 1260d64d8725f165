"""`pgjobs work --processes N`, no database: option parsing, the command each worker process
runs, and the supervisor's restart delays and exit codes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import ClassVar, NoReturn

import pytest
import typer.main

from pgjobs import App, ConfigurationError, PgjobsError, WorkerConfig, cli, supervisor
from pgjobs.cli import commands
from pgjobs.cli import work as _work_module  # noqa: F401  (cli.work below)
from pgjobs.db.dsn import Dsn
from pgjobs.retention_policy import RetentionPolicy
from pgjobs.targets import ExternalTarget
from tests.support.helpers import assert_one_line_error, run

APP = "tests.integration.cli_app:app"
#: Never connected to: every test here stops before the database.
APP_DSN = "postgresql://someone:hunter2@127.0.0.1:1/from-the-app"


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "", "257", "1000000000"])
def test_bad_processes_values_are_one_line_usage_errors(capsys, value):
    code, out, err = run(capsys, "work", "--app", APP, "--processes", value)
    assert code == 2
    assert_one_line_error(code, err, "Invalid value for '--processes'")
    assert out == ""


def test_processes_without_a_value_is_a_usage_error(capsys):
    code, _, err = run(capsys, "work", "--app", APP, "--processes")
    assert code == 2
    assert_one_line_error(code, err, "'--processes' requires an argument")


def test_supervisor_fd_by_hand_is_refused(capsys, monkeypatch):
    monkeypatch.delenv(supervisor.SLOT_ENV, raising=False)
    code, _, err = run(capsys, "work", "--app", APP, "--supervisor-fd", "0")
    assert code == 2
    assert_one_line_error(code, err, "--supervisor-fd", "--processes")


class _FakeWorker:
    """Stands in for pgjobs.Worker: records what it was given, runs nothing."""

    made: ClassVar[list[_FakeWorker]] = []

    def __init__(self, app: App, config: WorkerConfig) -> None:
        self.app, self.config = app, config
        _FakeWorker.made.append(self)

    def run(
        self, on_checked: Callable[[], None] | None = None, *, exit_process: bool = False
    ) -> int:
        self.exit_process = exit_process
        return 0


class _FakeSupervisor:
    """Stands in for pgjobs.supervisor.Supervisor: records its arguments, starts nothing."""

    made: ClassVar[list[_FakeSupervisor]] = []

    def __init__(self, command, dsn, processes, *, burst=False, forked=()) -> None:
        self.command, self.dsn, self.processes, self.burst = command, dsn, processes, burst
        self.forked = forked
        _FakeSupervisor.made.append(self)

    def run(
        self, on_checked: Callable[[], None] | None = None, *, exit_process: bool = False
    ) -> int:
        self.exit_process = exit_process
        return 0


def _leave_by_exception(code: int) -> NoReturn:
    raise typer.Exit(code)


@pytest.fixture
def fakes(monkeypatch, no_dsn_in_env):
    """cli with fake workers and supervisors, and an app that names its own database."""
    _FakeWorker.made.clear()
    _FakeSupervisor.made.clear()
    app = App(APP_DSN)

    @app.task(name="t")
    def t() -> None: ...

    monkeypatch.setattr(cli.work, "Worker", _FakeWorker)
    monkeypatch.setattr(supervisor, "Supervisor", _FakeSupervisor)
    # Nothing is forked from the test process (the fake supervisor is given no process), and
    # the command's end leaves the test process running.
    monkeypatch.setattr(supervisor, "fork_workers", lambda processes: (None, []))
    monkeypatch.setattr(supervisor, "leave", _leave_by_exception)
    monkeypatch.setattr(cli.work, "load_app", lambda ref, source="--app": app)
    return app


def test_one_process_runs_the_worker_here(capsys, fakes):
    code, _, err = run(capsys, "work", "--app", APP, "--processes", "1")
    assert code == 0, err
    assert len(_FakeWorker.made) == 1
    assert _FakeWorker.made[0].exit_process, "pgjobs work owns its process"
    assert _FakeSupervisor.made == []


OPTIONS = [
    "--concurrency=3",
    "--queue=emails",
    "--queue=-dashed",
    "--poll-interval=0.25",
    "--grace=7.5",
    "--burst",
    "--read-ahead=40",
    "--no-maintenance",
    "--rescue-interval=2.5",
    "--expire-interval=4.5",
    "--log-level=warning",
    "--http=127.0.0.1:9090",
    "--external-url=http://127.0.0.1:8000/jobs",
    "--external-timeout=2.5",
    "--external-header=X-Tenant: acme",
    "--otel-metrics",
    "--retain-archive=30d",
    "--retain-dead=1.5h",
    f"--retain-export={Path(__file__).parent}",
]


def test_worker_processes_run_the_same_options(capsys, fakes):
    code, _, err = run(capsys, "work", "--app", APP, "--processes", "3", *OPTIONS)
    assert code == 0, err
    assert _FakeWorker.made == [], "the supervisor runs no worker itself"
    [made] = _FakeSupervisor.made
    assert (made.processes, made.burst) == (3, True)
    # The database is resolved once, as a single worker would: the app's own DSN here.
    assert made.dsn.url == APP_DSN
    # The same interpreter and command, without --processes or the DSN (a password must not
    # show in `ps`).
    assert made.command[:3] == [sys.executable, "-m", "pgjobs"]
    assert not any(arg.startswith(("--processes", "--dsn")) for arg in made.command)
    assert "hunter2" not in " ".join(made.command)

    # Run as one worker, the command gives the worker the configuration it had here.
    code, _, err = run(capsys, *made.command[3:])
    assert code == 0, err
    [worker] = _FakeWorker.made
    assert worker.config == WorkerConfig(
        concurrency=3,
        queues=["emails", "-dashed"],
        poll_interval=0.25,
        grace=7.5,
        burst=True,
        maintenance=False,
        rescue_interval=2.5,
        expire_interval=4.5,
        http=("127.0.0.1", 9090),
        external=ExternalTarget("http://127.0.0.1:8000/jobs", 2.5, (("X-Tenant", "acme"),)),
        read_ahead=40,
        otel_metrics=True,
        retention=RetentionPolicy(
            archive=timedelta(days=30),
            dead_letter=timedelta(hours=1.5),
            export=Path(__file__).parent,
        ),
    )


def test_every_work_option_reaches_the_worker_processes(capsys, fakes):
    """An option added to `pgjobs work` must be handed to the worker processes too
    (``cli.work.work_argv``), or be listed here with the reason. A new flag must be set in
    OPTIONS."""
    not_forwarded = {
        "processes",  # each worker process is one process
        "supervisor_fd",  # set by the supervisor, per process
        "dsn",  # resolved once and handed over in the environment
        "pooler",  # set as $PGJOBS_POOLER, which the worker processes inherit
        "listen_dsn",  # set as $PGJOBS_LISTEN_DSN (a DSN never goes on a command line)
        "http_token",  # set as $PGJOBS_WORKER_HTTP_TOKEN (a secret never goes on one either)
    }
    code, _, err = run(capsys, "work", "--app", APP, "--processes", "2", *OPTIONS)
    assert code == 0, err
    [made] = _FakeSupervisor.made
    given = {arg.split("=", 1)[0] for arg in made.command}
    work = commands.load("work")
    for param in work.params:
        if param.name in not_forwarded:
            continue
        assert given & {*param.opts, *param.secondary_opts}, f"{param.opts} not forwarded"


def test_the_http_token_reaches_the_worker_processes_by_the_environment(capsys, fakes, monkeypatch):
    token = "a-token-of-thirty-two-characters"
    monkeypatch.setenv(cli.work.HTTP_TOKEN_ENV, "")  # restored after the test
    args = ["--processes", "2", "--http=127.0.0.1:9090", f"--http-token={token}"]
    code, _, err = run(capsys, "work", "--app", APP, *args)
    assert code == 0, err
    [made] = _FakeSupervisor.made
    assert token not in " ".join(made.command)
    assert os.environ[cli.work.HTTP_TOKEN_ENV] == token
    code, _, err = run(capsys, *made.command[3:])  # a worker process, started afresh
    assert code == 0, err
    [worker] = _FakeWorker.made
    assert worker.config.http_token == token
    assert token not in repr(worker.config)


def test_dsn_option_is_resolved_in_the_supervisor(capsys, fakes):
    other = "postgresql://u@127.0.0.1:1/given"
    code, _, err = run(capsys, "work", "--app", APP, "--processes", "2", "--dsn", other)
    assert code == 0, err
    [made] = _FakeSupervisor.made
    assert (made.dsn.url, made.dsn.source) == (other, "--dsn")


def test_restart_delay_doubles_up_to_30s_and_resets_after_a_stable_run():
    delays = []
    previous = None
    for _ in range(8):
        previous = supervisor.restart_delay(previous, ran_for=0.5)
        delays.append(previous)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert supervisor.restart_delay(30.0, ran_for=supervisor.STABLE_AFTER) == 1.0
    assert supervisor.restart_delay(8.0, ran_for=supervisor.STABLE_AFTER - 1) == 16.0


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (1, 1), (2, 2), (-9, 137), (-15, 143)])
def test_exit_codes_read_as_a_shell_reports_them(returncode, code):
    assert supervisor.exit_code(returncode) == code


def test_supervisor_needs_at_least_one_process():
    with pytest.raises(ConfigurationError, match="processes must be >= 1"):
        supervisor.Supervisor(["true"], Dsn(APP_DSN, "test"), 0)


def _fake_worker(script: str) -> list[str]:
    """A worker process's command that runs ``script`` with ``fd``, its end of the socket pair
    (the supervisor appends --supervisor-fd=N), and ``slot``, its slot."""
    prelude = (
        "import os, sys, time; fd = int(sys.argv[-1].split('=')[1]); "
        "slot = int(os.environ['PGJOBS_SUPERVISOR_SLOT'])\n"
    )
    return [sys.executable, "-c", prelude + script]


def test_failed_starts_of_every_process_raise_the_first_error_once():
    # Every process fails its start as a bad configuration does: the supervisor raises that
    # error (once) with the exit code's type, after every process has exited.
    command = _fake_worker("os.write(fd, b'failed 2 --app x: cannot import x\\n'); sys.exit(2)")
    with pytest.raises(ConfigurationError, match=r"^--app x: cannot import x$"):
        supervisor.Supervisor(command, Dsn(APP_DSN, "test"), 3).run()


def test_a_failed_start_stops_the_processes_still_starting():
    # Slot 0 fails at once; the others would take a minute to start: they are stopped.
    command = _fake_worker(
        "if slot == 0:\n"
        "    os.write(fd, b'failed 1 cannot reach the database\\n'); sys.exit(1)\n"
        "time.sleep(60)"
    )
    started = time.monotonic()
    with pytest.raises(PgjobsError, match="cannot reach the database") as failed:
        supervisor.Supervisor(command, Dsn(APP_DSN, "test"), 3).run()
    assert not isinstance(failed.value, ConfigurationError)
    assert time.monotonic() - started < 50, "the sleeping processes were stopped"


def test_a_failed_start_after_another_process_was_ready_is_logged_and_not_raised(caplog):
    # Slot 0 is ready; slot 1 fails its start: with burst nothing is replaced, and the failure
    # shows as a warning with its reason, and in the exit code.
    command = _fake_worker(
        "if slot == 0:\n"
        "    os.write(fd, b'ready\\n'); time.sleep(0.5); sys.exit(0)\n"
        "time.sleep(0.2); os.write(fd, b'failed 1 too many connections\\n'); sys.exit(1)"
    )
    with caplog.at_level("WARNING", logger="pgjobs.supervisor"):
        code = supervisor.Supervisor(command, Dsn(APP_DSN, "test"), 2, burst=True).run()
    assert code == 1
    assert "could not start: too many connections" in caplog.text


def test_every_process_starts_at_once(tmp_path):
    # Each process records its start and exits 0 without saying ready: had the supervisor
    # waited for a first process to be ready before starting the others, one would have run.
    command = _fake_worker(f"open(os.path.join({str(tmp_path)!r}, str(slot)), 'w').close()")
    assert supervisor.Supervisor(command, Dsn(APP_DSN, "test"), 3, burst=True).run() == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0", "1", "2"]


def test_a_process_running_a_thread_is_not_forked():
    # A fork copies the locks a thread holds without the thread: the supervisor starts fresh
    # interpreters instead.
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        link, forked = supervisor.fork_workers(2)
        if link is not None:  # a copy of this test process: never let it run on
            os._exit(0)
        assert (link, forked) == (None, [])
    finally:
        stop.set()
        thread.join()


_LINKED = (
    "import sys\n"
    "from pgjobs.supervisor import SupervisorLink\n"
    "link = SupervisorLink(int(sys.argv[1]), slot=0)\n"
    "print(link.dsn.url, link.dsn.source)\n"
)


def _linked_process() -> tuple[subprocess.Popen[str], socket.socket]:
    """A process that waits for the database on a SupervisorLink, and the supervisor's end."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LINKED, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    theirs.close()
    return proc, ours


def test_a_worker_process_gets_the_database_from_its_supervisor():
    proc, ours = _linked_process()
    ours.sendall(b'dsn ["postgresql://u:secret@h/db", "--dsn"]\n')
    out, err = proc.communicate(timeout=30)
    ours.close()
    assert (proc.returncode, out, err) == (0, "postgresql://u:secret@h/db --dsn\n", "")


@pytest.mark.parametrize("said", [b"", b"something else\n"])
def test_a_worker_process_whose_supervisor_leaves_without_the_database_exits_quietly(said):
    # The supervisor failed its own start (and reports it) or was killed: the worker process
    # had started nothing and says nothing.
    proc, ours = _linked_process()
    ours.sendall(said)
    ours.close()
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (1, "", "")
