"""Files pgjobs must not trust: a settings file (pyproject.toml) or an app's module that someone
other than the current user or root may have written is refused in one line naming the file and
why (exit 2), before any of its code runs; the search for pyproject.toml stops at the
repository's root and at the home folder; `pgjobs stats` imports an app only when given --app.

The tests run as root (as CI does): files are handed to another user with ``os.chown``.
"""

from __future__ import annotations

import os
import textwrap
import zipfile
from pathlib import Path

import pytest

from pgjobs.db.dsn import Dsn
from tests.support.helpers import assert_one_line_error, pgjobs_env, run_pgjobs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing a file to another user (os.chown) needs root"
)

#: The user ``nobody``: another user than the one running the tests.
OTHER_UID = 65534
#: A group id no user has as its own: a group-writable file of that group is others'.
SHARED_GID = 54321

#: An app whose module leaves a marker when it is imported (its code ran).
MARKING_APP = """
import pathlib

import pgjobs

pathlib.Path({marker!r}).write_text("imported")
app = pgjobs.App()


@app.task(name="shop.welcome", queue="mail")
def welcome(user_id: int = 0) -> int:
    return user_id
"""


@pytest.fixture
def env(dsn: Dsn) -> dict[str, str]:
    """The test database only in $SHOP_DB_URL, which the projects' pyproject.toml names (so that
    every command reads the file), no $PGJOBS_APP."""
    env = pgjobs_env(None)
    env.pop("PGJOBS_APP", None)
    env["SHOP_DB_URL"] = dsn.url
    return env


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "imported.marker"


def project(root: Path, marker: Path) -> Path:
    """A project in ``root``: pyproject.toml naming ``shop.jobs:app`` and ``$SHOP_DB_URL``, the
    package ``shop`` whose module marks its import, and a folder ``docs/`` below the root to run
    commands from."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""
            [project]
            name = "shop"

            [tool.pgjobs]
            app = "shop.jobs:app"
            dsn = "env:SHOP_DB_URL"
        """)
    )
    (root / "shop").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "jobs.py").write_text(MARKING_APP.format(marker=str(marker)))
    (root / "docs").mkdir()
    return root


def hand_to_another_user(path: Path) -> None:
    os.chown(path, OTHER_UID, OTHER_UID)


def open_to_everyone(path: Path) -> None:
    path.chmod(0o666)


def open_to_a_shared_group(path: Path) -> None:
    os.chown(path, 0, SHARED_GID)
    path.chmod(0o664)


UNTRUSTED = {
    "another user's": (hand_to_another_user, "belongs to nobody (uid 65534)"),
    "world-writable": (open_to_everyone, "everyone can write it (mode 0666)"),
    "group-writable": (open_to_a_shared_group, "group gid 54321 can write it (mode 0664)"),
}

#: Commands that read the project's settings: two that import the app, one that never does.
COMMANDS = [
    ("enqueue", "shop.welcome"),
    ("work", "--burst"),
    ("stats",),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("untrusted", UNTRUSTED.values(), ids=UNTRUSTED.keys())
def test_an_untrusted_pyproject_above_the_folder_is_refused(
    tmp_path, env, conn, marker, command, untrusted
):
    make_untrusted, why = untrusted
    root = project(tmp_path / "outer", marker)
    make_untrusted(root / "pyproject.toml")
    refused = run_pgjobs(env, *command, cwd=root / "docs")
    assert refused.returncode == 2, refused.stderr
    assert_one_line_error(
        refused.returncode, refused.stderr, f"refusing {root / 'pyproject.toml'}", why
    )
    assert not marker.exists(), "the app named by the refused file was imported"
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)


@pytest.mark.parametrize("command", COMMANDS[:2], ids=lambda c: c[0])
@pytest.mark.parametrize("untrusted", UNTRUSTED.values(), ids=UNTRUSTED.keys())
@pytest.mark.parametrize("module", ["shop/jobs.py", "shop/__init__.py"])
def test_an_untrusted_app_module_is_refused_before_it_runs(
    tmp_path, env, conn, marker, command, untrusted, module
):
    """The module the app names, or a package above it that importing it would run first."""
    make_untrusted, why = untrusted
    root = project(tmp_path / "shop-project", marker)
    if module == "shop/__init__.py":
        (root / module).write_text(MARKING_APP.format(marker=str(marker)).split("app =")[0])
    make_untrusted(root / module)
    refused = run_pgjobs(env, *command, cwd=root / "docs")
    assert refused.returncode == 2, refused.stderr
    assert_one_line_error(refused.returncode, refused.stderr, f"refusing {root / module}", why)
    assert "[tool.pgjobs] app" in refused.stderr, "the message says where the app was named"
    assert not marker.exists(), "the refused module ran"
    assert conn.execute("SELECT count(*) FROM queued_jobs").fetchone() == (0,)


def test_an_untrusted_module_named_by_the_environment_is_refused(tmp_path, env, conn, marker):
    env["PGJOBS_DATABASE_URL"] = env["SHOP_DB_URL"]
    (tmp_path / "evil.py").write_text(MARKING_APP.format(marker=str(marker)))
    hand_to_another_user(tmp_path / "evil.py")
    env["PGJOBS_APP"] = "evil:app"
    refused = run_pgjobs(env, "enqueue", "shop.welcome", cwd=tmp_path)
    assert_one_line_error(
        refused.returncode, refused.stderr, f"refusing {tmp_path / 'evil.py'}", "$PGJOBS_APP"
    )
    assert refused.returncode == 2
    assert not marker.exists()


def test_files_of_ones_own_private_group_are_trusted(tmp_path, env, conn, marker):
    """A umask of 002 makes files group-writable: by the owner's own group (root's here, which
    no other user has) that is no one else."""
    root = project(tmp_path / "shop", marker)
    for path in (root / "pyproject.toml", root / "shop" / "jobs.py"):
        os.chown(path, 0, 0)
        path.chmod(0o664)
    enqueued = run_pgjobs(env, "enqueue", "shop.welcome", cwd=root / "docs")
    assert enqueued.returncode == 0, enqueued.stderr
    assert marker.exists()
    assert conn.execute("SELECT queue FROM queued_jobs").fetchall() == [("mail",)]


@pytest.mark.parametrize("boundary", ["repository", "home"])
def test_the_search_stops_at_the_repository_and_the_home_folder(
    tmp_path, env, conn, marker, boundary
):
    """A project above a repository's root, or above the home folder, is not this one's: its
    settings are not read and its app is not imported, even when it is trusted."""
    env["PGJOBS_DATABASE_URL"] = env["SHOP_DB_URL"]
    outer = project(tmp_path / "outer", marker)
    inner = outer / "checkout"
    inner.mkdir()
    if boundary == "repository":
        (inner / ".git").mkdir()
    else:
        env["HOME"] = str(inner)
    enqueued = run_pgjobs(env, "enqueue", "shop.welcome", cwd=inner)
    assert enqueued.returncode == 0, enqueued.stderr
    assert not marker.exists(), f"the app of the project above the {boundary} was imported"
    assert conn.execute("SELECT queue FROM queued_jobs").fetchall() == [("default",)]
    (inner / "pyproject.toml").write_text('[tool.pgjobs]\napp = "shop.jobs:app"\n')
    found = run_pgjobs(env, "enqueue", "shop.welcome", cwd=inner)
    assert found.returncode == 2, "the boundary's own pyproject.toml is read"
    assert "cannot import shop" in found.stderr


def test_stats_imports_no_app_unless_given_app(tmp_path, env, conn, marker):
    root = project(tmp_path / "shop", marker)
    env["PGJOBS_APP"] = "shop.jobs:app"
    for named_by in ("$PGJOBS_APP", "[tool.pgjobs] app"):
        shown = run_pgjobs(env, "stats", "--json", cwd=root / "docs")
        assert shown.returncode == 0, shown.stderr
        assert shown.stderr == ""
        assert not marker.exists(), f"stats imported the app {named_by} names"
        env.pop("PGJOBS_APP", None)
    asked = run_pgjobs(env, "stats", "--json", "--app", "shop.jobs:app", cwd=root / "docs")
    assert asked.returncode == 0, asked.stderr
    assert marker.exists(), "--app: the app is imported (its tasks' group limits)"


def test_an_app_in_a_zip_archive_is_judged_by_the_archive(tmp_path, env, conn, marker):
    """A module imported from a zip on sys.path (a zipapp's): its archive is the file."""
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("zipped/__init__.py", "")
        bundle.writestr("zipped/jobs.py", MARKING_APP.format(marker=str(marker)))
    env.update(PGJOBS_APP="zipped.jobs:app", PGJOBS_DATABASE_URL=env["SHOP_DB_URL"])
    env["PYTHONPATH"] = os.pathsep.join([str(archive), env["PYTHONPATH"]])
    hand_to_another_user(archive)
    refused = run_pgjobs(env, "enqueue", "shop.welcome", cwd=tmp_path)
    assert_one_line_error(refused.returncode, refused.stderr, f"refusing {archive}", "nobody")
    assert not marker.exists()
    os.chown(archive, 0, 0)
    enqueued = run_pgjobs(env, "enqueue", "shop.welcome", cwd=tmp_path)
    assert enqueued.returncode == 0, enqueued.stderr
    assert marker.exists()


@pytest.mark.parametrize(
    "command",
    [
        ("doctor",),
        ("dead", "list"),
        ("dead", "group"),
        ("job", "show", "1"),
        ("queue", "list"),
        ("schedule",),
        ("prune", "--older-than", "30d", "--dry-run"),
        ("migrate", "--sql"),
    ],
    ids=" ".join,
)
def test_the_commands_that_run_no_task_import_no_app(tmp_path, env, conn, marker, command):
    """What the configuration page says of them: the app $PGJOBS_APP and the file name is never
    imported, whatever the command's outcome."""
    root = project(tmp_path / "shop", marker)
    env["PGJOBS_APP"] = "shop.jobs:app"
    ran = run_pgjobs(env, *command, cwd=root / "docs")
    assert ran.returncode != 2, f"refused before it ran: {ran.stderr}"
    assert "Traceback" not in ran.stderr
    assert not marker.exists(), f"pgjobs {' '.join(command)} imported the app"
