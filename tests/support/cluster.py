"""A throwaway PostgreSQL primary and a streaming standby, built from the machine's binaries
(initdb, pg_basebackup -R) on free ports in a temporary folder, run as the ``postgres`` OS user
when the tests run as root; stopped and removed however the test ends.

>>> with replicated_pair(synchronous=True) as pair:
...     pair.primary.stop(immediate=True)
...     pair.standby.promote()
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

#: Where Debian puts PostgreSQL 15's server programs.
BINARIES = Path(os.environ.get("PGJOBS_PG_BINARIES", "/usr/lib/postgresql/15/bin"))
#: The standby's name, as the primary's synchronous_standby_names lists it.
STANDBY_NAME = "pgjobs_standby"
#: Settings of both servers: small, quick to start, few connections.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "40",
    "shared_buffers": "32MB",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "fsync": "off",  # a throwaway: the primary stopped hard is never started again
    "logging_collector": "off",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 where nothing listens now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_postgres(argv: Sequence[str]) -> list[str]:
    """``argv`` run as the ``postgres`` OS user when this process is root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)


def _run(argv: Sequence[str], timeout: float = 60) -> str:
    done = subprocess.run(
        _as_postgres(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


@dataclass
class Server:
    """One PostgreSQL server of the pair: its data folder, port and log."""

    name: str
    data: Path
    port: int

    @property
    def log(self) -> Path:
        return self.data.parent / f"{self.name}.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def start(self) -> None:
        _run([str(BINARIES / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start"])

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server: ``immediate`` is a crash (no checkpoint, sessions cut)."""
        mode = "immediate" if immediate else "fast"
        _run([str(BINARIES / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def promote(self) -> None:
        """Promote this standby, returning once it takes writes."""
        _run([str(BINARIES / "pg_ctl"), "-D", str(self.data), "-w", "promote"])

    def configure(self, settings: dict[str, str]) -> None:
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def log_tail(self, size: int = 3000) -> str:
        return log_tail(self.log, size)


def log_tail(log: Path, size: int = 3000) -> str:
    """The last ``size`` characters of a server's log, for a failure's message ("" if unread)."""
    try:
        return log.read_text(errors="replace")[-size:]
    except OSError:
        return ""


@dataclass
class Pair:
    """A primary and its standby, and the multi-host DSN that reaches whichever takes writes."""

    primary: Server
    standby: Server
    synchronous: bool

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        """libpq's key=value multi-host DSN: both servers, the one that takes writes chosen."""
        params = {
            "host": "127.0.0.1,127.0.0.1",
            "port": f"{self.primary.port},{self.standby.port}",
            "user": "postgres",
            "dbname": dbname,
            "target_session_attrs": "read-write",
            "connect_timeout": "3",
            **extra,
        }
        return " ".join(f"{key}={value}" for key, value in params.items())

    def url(self, dbname: str = "postgres") -> str:
        """The same DSN as libpq's multi-host URL."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write&connect_timeout=3"
        )

    def wait_replicating(self, timeout: float = 30) -> None:
        """Wait until the standby streams from the primary (as a synchronous one, if so)."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        with self.primary.connect() as conn:
            while True:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    [STANDBY_NAME],
                ).fetchone()
                if row is not None and row[0] == wanted:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the standby is not {wanted} after {timeout}s ({row}): "
                        f"{self.standby.log_tail()}"
                    )
                time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(
            f"--- {server.name} log:\n{server.log_tail()}"
            for server in (self.primary, self.standby)
        )


def _require_binaries() -> None:
    missing = [
        name for name in ("initdb", "pg_ctl", "pg_basebackup") if not (BINARIES / name).exists()
    ]
    if missing:
        if os.environ.get("CI"):
            raise AssertionError(f"PostgreSQL's {missing} are not in {BINARIES}")
        pytest.skip(f"PostgreSQL's {missing} are not in {BINARIES}")


@contextlib.contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[Pair]:
    """A running primary and a streaming standby (``synchronous``: the primary's commits wait
    for the standby's flush), both stopped and their folder removed at the end."""
    _require_binaries()
    folder = Path(tempfile.mkdtemp(prefix="pgjobs-pair-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    primary = Server("primary", folder / "primary", free_port())
    standby = Server("standby", folder / "standby", free_port())
    try:
        _run(
            [
                str(BINARIES / "initdb"),
                "-D",
                str(primary.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        )
        primary.configure(
            {**SETTINGS, "port": str(primary.port), "unix_socket_directories": f"'{folder}'"}
        )
        primary.start()
        _run(
            [
                str(BINARIES / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                str(standby.data),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ]
        )
        # The walreceiver names itself after cluster_name when primary_conninfo names nothing.
        standby.configure({"port": str(standby.port), "cluster_name": f"'{STANDBY_NAME}'"})
        standby.start()
        pair = Pair(primary, standby, synchronous)
        if synchronous:
            with primary.connect() as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
                conn.execute("SELECT pg_reload_conf()")
        pair.wait_replicating()
        yield pair
    finally:
        for server in (standby, primary):
            if server.running():
                with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                    server.stop(immediate=True)
        shutil.rmtree(folder, ignore_errors=True)
