"""`pgjobs work --processes N`, no database: option parsing, the command each worker process
runs, and the supervisor's restart delays and exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ClassVar

import pytest
import typer.main

from pgjobs import App, ConfigurationError, WorkerConfig, cli, supervisor
from pgjobs.dsn import Dsn
from pgjobs.tasks import ExternalTarget
from tests.helpers import assert_one_line_error, run

APP = "tests.integration.cli_app:app"
#: Never connected to: every test here stops before the database.
APP_DSN = "postgresql://someone:hunter2@127.0.0.1:1/from-the-app"


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
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
    monkeypatch.delenv(supervisor.DSN_ENV, raising=False)
    code, _, err = run(capsys, "work", "--app", APP, "--supervisor-fd", "0")
    assert code == 2
    assert_one_line_error(code, err, "--supervisor-fd", "--processes")


class _FakeWorker:
    """Stands in for pgjobs.Worker: records what it was given, runs nothing."""

    made: ClassVar[list[_FakeWorker]] = []

    def __init__(self, app: App, config: WorkerConfig) -> None:
        self.app, self.config = app, config
        _FakeWorker.made.append(self)

    def run(self, on_checked: Callable[[], None] | None = None) -> int:
        return 0


class _FakeSupervisor:
    """Stands in for pgjobs.supervisor.Supervisor: records its arguments, starts nothing."""

    made: ClassVar[list[_FakeSupervisor]] = []

    def __init__(self, command, dsn, processes, *, burst=False) -> None:
        self.command, self.dsn, self.processes, self.burst = command, dsn, processes, burst
        _FakeSupervisor.made.append(self)

    def run(self, on_checked: Callable[[], None] | None = None) -> int:
        return 0


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
    monkeypatch.setattr(cli.work, "load_app", lambda ref: app)
    return app


def test_one_process_runs_the_worker_here(capsys, fakes):
    code, _, err = run(capsys, "work", "--app", APP, "--processes", "1")
    assert code == 0, err
    assert len(_FakeWorker.made) == 1
    assert _FakeSupervisor.made == []


OPTIONS = [
    "--concurrency=3",
    "--queue=emails",
    "--queue=-dashed",
    "--poll-interval=0.25",
    "--grace=7.5",
    "--burst",
    "--no-maintenance",
    "--rescue-interval=2.5",
    "--expire-interval=4.5",
    "--log-level=warning",
    "--http=127.0.0.1:9090",
    "--external-url=http://127.0.0.1:8000/jobs",
    "--external-timeout=2.5",
    "--external-header=X-Tenant: acme",
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
    )


def test_every_work_option_reaches_the_worker_processes(capsys, fakes):
    """An option added to `pgjobs work` must be handed to the worker processes too
    (``cli.work.work_argv``), or be listed here with the reason. A new flag must be set in OPTIONS."""
    not_forwarded = {
        "processes",  # each worker process is one process
        "supervisor_fd",  # set by the supervisor, per process
        "dsn",  # resolved once and handed over in the environment
    }
    code, _, err = run(capsys, "work", "--app", APP, "--processes", "2", *OPTIONS)
    assert code == 0, err
    [made] = _FakeSupervisor.made
    given = {arg.split("=", 1)[0] for arg in made.command}
    work = typer.main.get_command(cli.cli).commands["work"]  # type: ignore[attr-defined]
    for param in work.params:
        if param.name in not_forwarded:
            continue
        assert given & {*param.opts, *param.secondary_opts}, f"{param.opts} not forwarded"


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
