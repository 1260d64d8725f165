"""The wheel as users get it: built from this tree, installed into a fresh venv, `pgjobs migrate`
run from there brings a new database to head, and an application's own `alembic upgrade head`
can include pgjobs' migrations from the installed package. Its metadata is what the package
index shows: the distribution's name (not the import package's), the license, the classifiers.

The fresh venv gets the wheel by `pip install --no-deps --no-index` and its dependencies from the
project's venv: one symlink per top-level module of each distribution the wheel's metadata
requires (the closure, extras and markers evaluated). No registry is asked, so the test runs
offline in a few seconds, and a module pgjobs imports without declaring it is missing there.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import psycopg
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pgjobs import migrate
from pgjobs.cli import DISTRIBUTION

REPO = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (a console script of the venv, or ``python``) with no trace of the
        repository: not on sys.path, not the working directory, no DSN from the environment."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PGJOBS_DATABASE_URL", "DATABASE_URL"}
        }
        return subprocess.run(
            [str(self.venv / "bin" / argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _requirements(metadata: str) -> list[Requirement]:
    return [Requirement(r) for r in HeaderParser().parsestr(metadata).get_all("Requires-Dist", [])]


def _closure(requirements: list[Requirement]) -> set[str]:
    """The names of the installed distributions that ``requirements`` need, transitively."""
    needed: set[str] = set()
    todo = [(r, "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        dist = importlib.metadata.distribution(requirement.name)
        name = canonicalize_name(dist.metadata["Name"])
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in needed:
            continue
        needed.update({name, key})
        for child in dist.requires or []:
            for wanted in ("", *requirement.extras):
                todo.append((Requirement(child), wanted))
    return {n for n in needed if "[" not in n}


def _link_dependencies(metadata: str, site_packages: Path) -> None:
    """Symlink every top-level module and dist-info of the wheel's dependencies, as installed in
    this venv, into ``site_packages``."""
    for name in _closure(_requirements(metadata)):
        dist = importlib.metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site_packages / top).exists():
                (site_packages / top).symlink_to(source)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            *PIP,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(root / "dist"),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (root / "dist").glob(f"{DISTRIBUTION.replace('-', '_')}-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_packages = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    _link_dependencies(metadata, site_packages)
    pip = subprocess.run(
        [
            *PIP,
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return Installed(wheel, venv)


def test_the_wheel_carries_the_migrations_inside_the_package(installed):
    with zipfile.ZipFile(installed.wheel) as archive:
        names = archive.namelist()
    (info,) = {n.split("/")[0] for n in names} - {"pgjobs"}
    assert info.startswith("pgjobs_queue-") and info.endswith(".dist-info")
    assert {"pgjobs/migrations/env.py", "pgjobs/migrations/script.py.mako"} <= set(names)
    shipped = {Path(n).name for n in names if n.startswith("pgjobs/migrations/versions/")}
    in_tree = {p.name for p in (migrate.migrations_dir() / "versions").glob("*.py")}
    assert shipped == in_tree


def _metadata(wheel: Path) -> tuple[list[str], dict[str, list[str]], str]:
    """The wheel's file names, its METADATA headers (each name: its values) and its body."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        message = HeaderParser().parsestr(archive.read(metadata_name).decode())
    headers: dict[str, list[str]] = {}
    for key, value in message.items():
        headers.setdefault(key, []).append(value)
    return names, headers, str(message.get_payload())


def test_the_wheel_is_named_pgjobs_queue_and_carries_what_the_index_page_shows(installed):
    names, headers, readme = _metadata(installed.wheel)
    assert headers["Name"] == [DISTRIBUTION] == ["pgjobs-queue"]
    assert headers["Summary"] == [
        "A durable background-job queue for Python, backed by PostgreSQL alone."
    ]
    assert headers["License-Expression"] == ["Apache-2.0"]
    assert headers["License-File"] == ["LICENSE"]
    assert headers["Requires-Python"] == [">=3.11"]
    assert {"Typing :: Typed", "Topic :: Database"} <= set(headers["Classifier"])
    assert headers["Description-Content-Type"] == ["text/markdown"]
    assert "pip install pgjobs-queue" in readme
    assert {"web", "embedded", "otel", "pydantic"} <= set(headers["Provides-Extra"])
    # An extra that includes another (docs: web) names this distribution, which the build
    # expands; naming "pgjobs" would pull the index's other project.
    required = [Requirement(r) for r in headers["Requires-Dist"]]
    assert not [r for r in required if canonicalize_name(r.name).startswith("pgjobs")]
    assert "fastapi" in {r.name for r in required if r.marker and "docs" in str(r.marker)}
    assert "pgjobs/py.typed" in names
    (license_file,) = (n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    with zipfile.ZipFile(installed.wheel) as archive:
        text = archive.read(license_file).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert text == (REPO / "LICENSE").read_text()


def test_the_installed_wheel_gives_the_pgjobs_command_and_import_package(installed, tmp_path):
    version = installed.run("pgjobs", "--version", cwd=tmp_path)  # no database anywhere
    assert (version.returncode, version.stdout, version.stderr) == (0, "pgjobs 0.1.0\n", "")
    imported = installed.run(
        "python",
        "-c",
        "import importlib.metadata as m, pathlib, pgjobs; "
        "print(m.version('pgjobs-queue')); print(pathlib.Path(pgjobs.__file__).parent)",
        cwd=tmp_path,
    )
    assert imported.returncode == 0, imported.stderr
    found_version, package = imported.stdout.split()
    assert found_version == "0.1.0"
    assert Path(package).is_relative_to(installed.venv)
    assert (Path(package) / "py.typed").is_file()
    helped = installed.run("pgjobs", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "Usage: pgjobs" in helped.stdout


def test_pgjobs_migrate_from_the_wheel_brings_a_new_database_to_head(
    installed, create_database, tmp_path
):
    fresh = create_database()
    where = installed.run(
        "python", "-c", "import pgjobs.migrate as m; print(m.migrations_dir())", cwd=tmp_path
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed.venv), "pgjobs from the wheel"

    migrated = installed.run("pgjobs", "migrate", "--dsn", fresh.url, cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert migrate.current(fresh) == migrate.HEAD
    checked = installed.run("pgjobs", "migrate", "--check", "--dsn", fresh.url, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.split() == ["current:", migrate.HEAD, "head:", migrate.HEAD]


#: The manual's recipe (Deploy and upgrade), as the page shows it.
APP_ENV_PY = (
    Path(__file__).resolve().parents[2] / "docs" / "snippets" / "alembic_env.py"
).read_text()

APP_REVISION = """
from alembic import op

revision = "a1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE app_orders (id int PRIMARY KEY)")


def downgrade() -> None:
    op.execute("DROP TABLE app_orders")
"""


def test_an_applications_alembic_run_includes_pgjobs_migrations(
    installed, create_database, tmp_path
):
    """The manual's recipe: the application's env.py calls ``pgjobs.migrate.upgrade`` after its
    own migrations, and one `alembic upgrade head` upgrades both histories."""
    dsn = create_database()
    (tmp_path / "migrations" / "versions").mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text(APP_ENV_PY)
    (tmp_path / "migrations" / "versions" / "a1_orders.py").write_text(APP_REVISION)
    (tmp_path / "alembic.ini").write_text(
        f"[alembic]\nscript_location = migrations\nsqlalchemy.url = {dsn.sqlalchemy_url}\n"
    )
    done = installed.run("python", "-m", "alembic", "upgrade", "head", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(dsn.url) as conn:
        versions = {
            table: conn.execute(f"SELECT version_num FROM {table}").fetchall()
            for table in ("alembic_version", "pgjobs_alembic_version")
        }
        assert conn.execute("SELECT count(*) FROM app_orders").fetchone() == (0,)
    assert versions == {"alembic_version": [("a1",)], "pgjobs_alembic_version": [(migrate.HEAD,)]}
