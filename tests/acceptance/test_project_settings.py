"""`pgjobs` as typed in a project whose pyproject.toml names its app and its database's
variable under ``[tool.pgjobs]``: no --app, no --dsn, run from a folder below the project's root.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pgjobs.db.dsn import Dsn
from pgjobs.models import ArchivedStatus
from tests.support.helpers import assert_one_line_error, pgjobs_env, run_pgjobs

SHOP_JOBS = """
import pgjobs

app = pgjobs.App()


@app.task(name="shop.welcome", queue="mail")
def welcome(user_id: int, template: str = "default") -> int:
    return user_id
"""


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A project: pyproject.toml naming ``shop.jobs:app`` and ``$SHOP_DB_URL``, the package
    ``shop``, and a folder ``docs/`` below the root to run the commands from."""
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent("""
            [project]
            name = "shop"
            version = "1.0"

            [tool.pgjobs]
            app = "shop.jobs:app"
            dsn = "env:SHOP_DB_URL"
        """)
    )
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "jobs.py").write_text(SHOP_JOBS)
    (tmp_path / "docs").mkdir()
    return tmp_path


@pytest.fixture
def shop_env(dsn: Dsn) -> dict[str, str]:
    """The database only in the variable the project names (and a decoy $DATABASE_URL the
    project's variable wins over)."""
    env = pgjobs_env(None)
    env.pop("PGJOBS_APP", None)
    env["SHOP_DB_URL"] = dsn.url
    env["DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/not_this_one"
    return env


@pytest.mark.parametrize("processes", [1, 2])
def test_work_as_typed_runs_the_jobs_of_the_app_the_project_names(shop, shop_env, conn, processes):
    where = shop / "docs"
    ids = []
    for user_id in range(1, 21):
        payload = json.dumps({"user_id": user_id})
        enqueued = run_pgjobs(shop_env, "enqueue", "shop.welcome", "-p", payload, cwd=where)
        assert enqueued.returncode == 0, enqueued.stderr
        ids.append(int(enqueued.stdout))
    queues = conn.execute("SELECT DISTINCT queue FROM queued_jobs").fetchall()
    assert queues == [("mail",)], "the task's queue, not 'default'"

    worked = run_pgjobs(
        shop_env,
        "work",
        "--concurrency",
        "8",
        "--burst",
        "--processes",
        str(processes),
        "--log-level",
        "error",
        cwd=where,
        timeout=120,
    )
    assert worked.returncode == 0, worked.stderr
    done = conn.execute("SELECT id, status, result FROM archived_jobs ORDER BY id").fetchall()
    assert done == [(i, ArchivedStatus.SUCCEEDED, n) for n, i in enumerate(ids, 1)]
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM dead_letter").fetchone() == (0,)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ('{"user_id": 1, "tempalte": "x"}', ("tempalte",)),
        ('{"template": "x"}', ("user_id",)),
        ('{"user_id": "one"}', ("user_id", "int")),
    ],
)
def test_enqueue_refuses_a_payload_the_handler_cannot_take(shop, shop_env, conn, payload, words):
    refused = run_pgjobs(shop_env, "enqueue", "shop.welcome", "-p", payload, cwd=shop)
    assert refused.returncode == 2
    assert_one_line_error(refused.returncode, refused.stderr, *words)
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)


def test_enqueue_refuses_a_task_the_app_does_not_register(shop, shop_env, conn):
    refused = run_pgjobs(shop_env, "enqueue", "shop.welcom", cwd=shop)
    assert refused.returncode == 2
    assert_one_line_error(refused.returncode, refused.stderr, "unknown task", "shop.welcome")
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)


def test_the_project_variable_must_be_set(shop, shop_env, conn):
    del shop_env["SHOP_DB_URL"]
    failed = run_pgjobs(shop_env, "stats", cwd=shop)
    assert failed.returncode == 2
    assert_one_line_error(failed.returncode, failed.stderr, "$SHOP_DB_URL", "not set")


def test_pgjobs_app_and_pgjobs_database_url_win_over_the_file(shop, shop_env, conn, dsn):
    (shop / "other.py").write_text(SHOP_JOBS.replace('queue="mail"', 'queue="other"'))
    shop_env["PGJOBS_APP"] = "other:app"
    shop_env["SHOP_DB_URL"] = "postgresql://nobody@127.0.0.1:1/not_this_one"
    shop_env["PGJOBS_DATABASE_URL"] = dsn.url
    enqueued = run_pgjobs(shop_env, "enqueue", "shop.welcome", "-p", '{"user_id": 1}', cwd=shop)
    assert enqueued.returncode == 0, enqueued.stderr
    assert conn.execute("SELECT queue FROM queued_jobs").fetchall() == [("other",)]
    explicit = run_pgjobs(
        shop_env, "enqueue", "shop.welcome", "--app", "shop.jobs:app", "-p", "{}", cwd=shop
    )
    assert explicit.returncode == 2, "--app wins: shop.jobs' handler needs user_id"
    assert "user_id" in explicit.stderr


def test_a_literal_dsn_in_the_file_is_refused_without_showing_it(shop, shop_env, conn):
    pyproject = shop / "pyproject.toml"
    secret = "postgresql://shop:s3cret@db.internal/shop"
    pyproject.write_text(pyproject.read_text().replace('"env:SHOP_DB_URL"', f'"{secret}"'))
    refused = run_pgjobs(shop_env, "enqueue", "shop.welcome", "-p", '{"user_id": 1}', cwd=shop)
    assert_one_line_error(refused.returncode, refused.stderr, "[tool.pgjobs] dsn", "env:")
    assert refused.returncode == 2
    assert "s3cret" not in refused.stderr
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)


def test_work_with_no_app_named_says_the_three_ways(tmp_path, shop_env):
    failed = run_pgjobs(shop_env, "work", "--burst", cwd=tmp_path)
    assert failed.returncode == 2
    assert_one_line_error(
        failed.returncode, failed.stderr, "--app", "$PGJOBS_APP", "[tool.pgjobs]", "pyproject.toml"
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[tool.pgjobs\napp = 'x:app'\n", ("not valid TOML",)),
        ("[tool.pgjobs]\napp = 3\n", ("[tool.pgjobs] app", "string")),
        ("[tool.pgjobs]\napps = 'x:app'\n", ("'apps'", "app, dsn")),
        ("[tool]\npgjobs = 'x'\n", ("tool.pgjobs must be a table",)),
        ("[tool.pgjobs]\ndsn = 5432\n", ("[tool.pgjobs] dsn", "string")),
        ("[tool.pgjobs]\ndsn = 'MY_URL'\n", ("[tool.pgjobs] dsn", "env:DATABASE_URL")),
    ],
)
def test_a_bad_pyproject_is_one_line_and_exit_2(tmp_path, shop_env, content, words):
    (tmp_path / "pyproject.toml").write_text(content)
    failed = run_pgjobs(shop_env, "work", "--burst", cwd=tmp_path)
    assert failed.returncode == 2
    assert_one_line_error(failed.returncode, failed.stderr, str(tmp_path), *words)


def test_a_scripts_app_uses_the_database_the_commands_use(shop, shop_env, conn):
    """A plain script's ``App()`` reads ``[tool.pgjobs] dsn`` as the commands do (before the
    decoy $DATABASE_URL): the job it enqueues is the one the worker runs."""
    script = "from shop.jobs import app\nprint(app.enqueue('shop.welcome', {'user_id': 7}))\n"
    (shop / "enqueue_one.py").write_text(script)
    ran = subprocess.run(
        [sys.executable, "enqueue_one.py"],
        cwd=shop,
        env=shop_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == "", "a database was found: nothing said of the embedded server"
    job_id = int(ran.stdout)
    worked = run_pgjobs(shop_env, "work", "--burst", "--log-level", "error", cwd=shop / "docs")
    assert worked.returncode == 0, worked.stderr
    done = conn.execute("SELECT id, status, result FROM archived_jobs").fetchall()
    assert done == [(job_id, ArchivedStatus.SUCCEEDED, 7)]
