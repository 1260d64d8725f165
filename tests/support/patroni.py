"""A throwaway Patroni cluster from Debian's packages (``patroni``, ``etcd-server``): a one-member
etcd and two PostgreSQL 15 members in synchronous mode, on free ports of 127.0.0.1, in a temporary
folder, run as the ``postgres`` OS user when the tests run as root; every process is stopped and
the folder removed however the test ends.

>>> with patroni_cluster() as cluster:
...     leader, standby = cluster.wait_healthy()
...     leader.kill_postmaster()
...     cluster.wait_leader(other_than=leader)
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from tests.support.cluster import BINARIES, free_port, log_tail

#: The programs the cluster needs, and the Debian packages that bring them.
PROGRAMS = {"patroni": "patroni", "patronictl": "patroni", "etcd": "etcd-server"}
#: Seconds of Patroni's leader lock, of its loop, and of its retries against etcd and
#: PostgreSQL: small, so that a failover takes seconds (the defaults are 30, 10 and 10).
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 4
#: Settings of both PostgreSQL members: small, quick to start, few connections.
PARAMETERS = {
    "max_connections": 40,
    "shared_buffers": "32MB",
    "wal_level": "replica",
    "max_wal_senders": 5,
    "max_replication_slots": 5,
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "logging_collector": "off",
    # A throwaway: a postmaster killed keeps the kernel's page cache, and no machine crashes.
    "fsync": "off",
}


def require_patroni() -> None:
    """Skip, saying which Debian packages to install, when a program is missing; fail under CI,
    which installs them (``.ci/run``)."""
    missing = sorted(
        {package for program, package in PROGRAMS.items() if not shutil.which(program)}
    )
    if not missing and (BINARIES / "initdb").exists():
        return
    reason = (
        f"Patroni's cluster needs {', '.join(PROGRAMS)} and PostgreSQL's binaries in {BINARIES}"
        f" (apt-get install {' '.join(missing or ['postgresql-15'])})"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI runs the Patroni tests")
    pytest.skip(reason)


def _postgres_user() -> dict[str, Any]:
    """Popen's arguments that run a program as ``postgres`` when this process is root."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _environment() -> dict[str, str]:
    """The environment of Patroni and etcd: this one's without the test's Python settings (they
    run on Debian's Python), with ``postgres``'s home when they run as that user."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV", "PG"))
    }
    if os.geteuid() == 0:
        env["HOME"] = pwd.getpwnam("postgres").pw_dir
    return env


def _get_json(url: str, timeout: float = 2.0) -> Any:
    """The JSON body of a GET, whatever its status (Patroni answers 503 with a body too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as refused:
        with refused:
            return json.load(refused)


@dataclass
class Daemon:
    """One background process (etcd or a Patroni member), its output in a log file."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._out = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=_environment(),
            start_new_session=True,
            **_postgres_user(),
        )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; reaped either way."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        if self._out is not None:
            self._out.close()

    def log_tail(self, size: int = 3000) -> str:
        return log_tail(self.log, size)


@dataclass
class Member:
    """A Patroni member: its PostgreSQL port and data folder, its REST API, its process."""

    name: str
    port: int
    rest_port: int
    data: Path
    config: Path
    daemon: Daemon

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=3)

    def status(self) -> dict[str, Any]:
        """Patroni's own view of this member (``GET /patroni``): role, state, timeline..."""
        found = _get_json(f"http://127.0.0.1:{self.rest_port}/patroni")
        return found if isinstance(found, dict) else {}

    def postmaster_pid(self) -> int | None:
        """The pid of this member's postmaster, from its ``postmaster.pid``, if it has one."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return None

    def kill_postmaster(self) -> None:
        """SIGKILL this member's postmaster: its sessions cut, no checkpoint, nothing flushed."""
        pid = self.postmaster_pid()
        assert pid is not None, f"{self.name} has no postmaster"
        os.kill(pid, signal.SIGKILL)


@dataclass
class PatroniCluster:
    """Two members, the etcd they share, and the multi-host DSN that reaches the leader."""

    folder: Path
    scope: str
    etcd: Daemon
    members: list[Member]

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        """libpq's key=value multi-host DSN: both members, the one that takes writes chosen."""
        params = {
            "host": ",".join("127.0.0.1" for _ in self.members),
            "port": ",".join(str(member.port) for member in self.members),
            "user": "postgres",
            "dbname": dbname,
            "target_session_attrs": "read-write",
            "connect_timeout": "3",
            **extra,
        }
        return " ".join(f"{key}={value}" for key, value in params.items())

    def url(self, dbname: str = "postgres") -> str:
        """The same DSN as libpq's multi-host URL."""
        hosts = ",".join(f"127.0.0.1:{member.port}" for member in self.members)
        return (
            f"postgresql://postgres@{hosts}/{dbname}"
            "?target_session_attrs=read-write&connect_timeout=3"
        )

    def roles(self) -> dict[str, tuple[str, str]]:
        """Every member's (role, state), as the cluster's view in etcd has them
        (``GET /cluster`` of any member that answers): leader, sync_standby or replica."""
        for member in self.members:
            with contextlib.suppress(OSError, ValueError):
                found = _get_json(f"http://127.0.0.1:{member.rest_port}/cluster")
                return {
                    m["name"]: (m.get("role", ""), m.get("state", "")) for m in found["members"]
                }
        return {}

    def member(self, name: str) -> Member:
        return next(member for member in self.members if member.name == name)

    def healthy(self) -> tuple[Member, Member] | None:
        """(leader, synchronous standby) when the leader runs and has that standby streaming to
        it as synchronous; None otherwise."""
        roles = self.roles()
        leader = [
            n for n, (role, state) in roles.items() if role == "leader" and state == "running"
        ]
        sync = [
            n
            for n, (role, state) in roles.items()
            if role == "sync_standby" and state in ("running", "streaming")
        ]
        if len(leader) != 1 or len(sync) != 1:
            return None
        first, second = self.member(leader[0]), self.member(sync[0])
        try:
            with first.connect() as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    [second.name],
                ).fetchone()
        except psycopg.Error:
            return None
        return (first, second) if row is not None and row[0] == "sync" else None

    def wait_healthy(self, timeout: float = 60) -> tuple[Member, Member]:
        """Wait for a leader with a synchronous standby; (leader, standby)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.healthy()
            if found is not None:
                return found
            for daemon in (self.etcd, *(member.daemon for member in self.members)):
                if not daemon.alive():
                    raise AssertionError(f"{daemon.name} exited: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no leader with a synchronous standby after {timeout}s "
                    f"({self.roles()}): {self.logs()}"
                )
            time.sleep(0.2)

    def switchover(self, leader: Member, candidate: Member) -> None:
        """``patronictl switchover --force``: the leader hands over to the candidate and follows
        it; returns once Patroni has taken the request (it completes in the background)."""
        done = subprocess.run(
            [
                "patronictl",
                "-c",
                str(leader.config),
                "switchover",
                "--leader",
                leader.name,
                "--candidate",
                candidate.name,
                "--force",
                self.scope,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=_environment(),
            check=False,
        )
        assert done.returncode == 0, f"patronictl switchover: {done.stdout} {done.stderr}"

    def logs(self) -> str:
        return "\n".join(
            f"--- {daemon.name} log:\n{daemon.log_tail()}"
            for daemon in (self.etcd, *(member.daemon for member in self.members))
        )


def _etcd(folder: Path) -> tuple[Daemon, int]:
    client, peer = free_port(), free_port()
    daemon = Daemon(
        "etcd",
        [
            "etcd",
            "--name",
            "etcd0",
            "--data-dir",
            str(folder / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{client}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{client}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"etcd0=http://127.0.0.1:{peer}",
            "--initial-cluster-token",
            f"pgjobs-{uuid.uuid4().hex[:8]}",
            "--initial-cluster-state",
            "new",
        ],
        folder / "etcd.log",
    )
    return daemon, client


def _wait_etcd(daemon: Daemon, client: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            if _get_json(f"http://127.0.0.1:{client}/health").get("health") == "true":
                return
        if not daemon.alive() or time.monotonic() > deadline:
            raise AssertionError(f"etcd is not healthy after {timeout}s: {daemon.log_tail()}")
        time.sleep(0.1)


def _member_config(
    folder: Path, scope: str, etcd_client: int, name: str, port: int, rest_port: int
) -> dict[str, Any]:
    """Patroni's configuration of one member: JSON, which is YAML too."""
    return {
        "scope": scope,
        "namespace": "/pgjobs/",
        "name": name,
        "restapi": {
            "listen": f"127.0.0.1:{rest_port}",
            "connect_address": f"127.0.0.1:{rest_port}",
        },
        "etcd3": {"hosts": [f"127.0.0.1:{etcd_client}"]},
        "bootstrap": {
            "dcs": {
                "ttl": TTL,
                "loop_wait": LOOP_WAIT,
                "retry_timeout": RETRY_TIMEOUT,
                # A crashed leader fails over at once rather than restart in place (300 s).
                "primary_start_timeout": 0,
                # Commits wait for the standby, and only it may be promoted. Not strict: with
                # two members, strict mode would refuse writes on the new leader until the old
                # one rejoins as its standby.
                "synchronous_mode": True,
                "synchronous_mode_strict": False,
                "postgresql": {"use_pg_rewind": False, "parameters": PARAMETERS},
            },
            "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, "no-sync"],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{port}",
            "connect_address": f"127.0.0.1:{port}",
            "data_dir": str(folder / name),
            "bin_dir": str(BINARIES),
            "pgpass": str(folder / f"{name}.pgpass"),
            "authentication": {
                "superuser": {"username": "postgres"},
                "replication": {"username": "postgres"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
            "parameters": {"unix_socket_directories": str(folder)},
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


def _kill_postmasters(members: list[Member]) -> None:
    """SIGKILL any postmaster a member left (Patroni detaches its postmaster from itself)."""
    for member in members:
        pid = member.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def patroni_cluster(members: int = 2) -> Iterator[PatroniCluster]:
    """A running Patroni cluster of ``members`` PostgreSQL members, the first bootstrapping as
    leader; Patroni, PostgreSQL and etcd stopped and the folder removed at the end."""
    require_patroni()
    folder = Path(tempfile.mkdtemp(prefix="pgjobs-patroni-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    scope = f"pgjobs-{uuid.uuid4().hex[:8]}"
    etcd, client = _etcd(folder)
    started: list[Member] = []
    try:
        etcd.start()
        _wait_etcd(etcd, client)
        for index in range(members):
            name = f"member{index}"
            port, rest_port = free_port(), free_port()
            config = folder / f"{name}.yml"
            config.write_text(
                json.dumps(_member_config(folder, scope, client, name, port, rest_port), indent=1)
            )
            daemon = Daemon(name, ["patroni", str(config)], folder / f"{name}.log")
            member = Member(name, port, rest_port, folder / name, config, daemon)
            started.append(member)
            daemon.start()
            if index == 0:  # the first bootstraps alone, the others clone it
                _wait_primary(member)
        yield PatroniCluster(folder, scope, etcd, started)
    finally:
        for member in reversed(started):
            member.daemon.stop()
        _kill_postmasters(started)
        etcd.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_primary(member: Member, timeout: float = 60) -> None:
    """Wait until ``member`` has bootstrapped and runs as the primary."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            if member.status().get("role") in ("primary", "master"):
                return
        if not member.daemon.alive() or time.monotonic() > deadline:
            raise AssertionError(f"{member.name} did not bootstrap: {member.daemon.log_tail()}")
        time.sleep(0.2)
