"""A PgBouncer of its own in transaction mode, in front of a PostgreSQL server: for the tests of
``PGJOBS_POOLER=transaction`` and for the benchmark that compares throughput through it with a
direct connection. Runs Debian's ``pgbouncer`` binary (1.18 on Debian 12) on a free port, with a
generated ini file, as an unprivileged user when started as root (PgBouncer refuses to run as
root): the ``postgres`` OS user, or the owner of the server's socket folder when the server is
reached by one. Stopped however the caller ends.

Example::

    with pgbouncer(server_url) as bouncer:
        url = bouncer.url(database_url)  # the same database, through PgBouncer
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from tests.support.urls import url_with

#: Where Debian installs it (``apt-get install pgbouncer``); else the one on $PATH.
BINARY = "/usr/sbin/pgbouncer"

#: Server connections per (database, user) pair: small, as a production pool is next to the
#: clients it serves, so that transactions of many clients share few sessions.
POOL_SIZE = 5


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    return shutil.which("pgbouncer")


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: where it listens, its log."""

    port: int
    log: Path

    def url(self, database_url: str) -> str:
        """``database_url`` through this PgBouncer instead, however it reaches the server (a
        socket folder in its query, as the embedded server's, is not kept)."""
        return url_with(database_url, host="127.0.0.1", port=self.port)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ini_text(server_url: str, port: int, workdir: Path, pool_size: int = POOL_SIZE) -> str:
    """The ini of a transaction-mode PgBouncer that forwards every database to the server of
    ``server_url``, with the settings pgjobs' documentation names. No
    ``ignore_startup_parameters``: pgjobs sends none PgBouncer would refuse."""
    params = conninfo_to_dict(server_url)
    host = params.get("host") or "127.0.0.1"
    server_port = params.get("port") or "5432"
    return f"""\
[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / "users.txt"}
pool_mode = transaction
max_client_conn = 200
default_pool_size = {pool_size}
logfile = {workdir / "pgbouncer.log"}
pidfile = {workdir / "pgbouncer.pid"}
"""


@contextlib.contextmanager
def pgbouncer(server_url: str, *, pool_size: int = POOL_SIZE) -> Iterator[Bouncer]:
    """Start a transaction-mode PgBouncer in front of the server of ``server_url``; stopped on
    the way out. ``RuntimeError`` when it is not installed or does not start."""
    exe = binary()
    if exe is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    params = conninfo_to_dict(server_url)
    user = str(params.get("user") or "postgres")
    # Clients are trusted; PgBouncer logs in to the server with the password of its auth_file
    # (a server that asks for one: CI's).
    password = str(params.get("password") or "").replace('"', '""')
    with tempfile.TemporaryDirectory(prefix="pgjobs-pgbouncer-") as tmp:
        workdir = Path(tmp)
        port = _free_port()
        (workdir / "users.txt").write_text(f'"{user}" "{password}"\n')
        ini = workdir / "pgbouncer.ini"
        ini.write_text(ini_text(server_url, port, workdir, pool_size))
        run_as = _unprivileged_user(server_url)
        if run_as is not None:
            shutil.chown(workdir, run_as)
            for path in workdir.iterdir():
                shutil.chown(path, run_as)
        bouncer = Bouncer(port, workdir / "pgbouncer.log")
        proc = subprocess.Popen(
            [exe, str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            user=run_as,
        )
        try:
            _wait_listening(port, proc, bouncer)
            yield bouncer
        finally:
            _stop(proc)


def _unprivileged_user(server_url: str) -> str | None:
    """Whom PgBouncer runs as when started by root (it refuses to run as root), else None: the
    owner of the server's socket folder when the server is reached by one (the embedded server's
    is its data folder, closed to other users), else ``postgres``."""
    if os.geteuid() != 0:
        return None
    host = str(conninfo_to_dict(server_url).get("host") or "")
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return owner
    return "postgres"


def _wait_listening(port: int, proc: subprocess.Popen[bytes], bouncer: Bouncer) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited at start:\n{bouncer.log_text()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on port {port} within 10 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # PgBouncer exits at once
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
