"""The order in which the CLI looks for the app and the database: options, the environment, the
nearest pyproject.toml's ``[tool.pgjobs]`` (no database: DSNs are only read, never used)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgjobs import App
from pgjobs.cli.options import app_reference, database, use_database
from pgjobs.db import embedded
from pgjobs.db.project import find_project, nearest_pyproject
from pgjobs.errors import ConfigurationError

FROM_FILE = "postgresql://file@127.0.0.1/file"
FROM_PGJOBS = "postgresql://pgjobs@127.0.0.1/pgjobs"
FROM_GENERIC = "postgresql://generic@127.0.0.1/generic"
FROM_OPTION = "postgresql://option@127.0.0.1/option"
FROM_APP = "postgresql://app@127.0.0.1/app"
FROM_EMBEDDED = "postgresql://postgres@127.0.0.1:1/embedded"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project naming ``shop.jobs:app`` and ``$SHOP_DB_URL``, the working directory a folder
    two levels below its root; nothing of pgjobs' in the environment."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "shop"\n\n[tool.pgjobs]\napp = "shop.jobs:app"\n'
        'dsn = "env:SHOP_DB_URL"\n'
    )
    below = tmp_path / "src" / "shop"
    below.mkdir(parents=True)
    monkeypatch.chdir(below)
    for name in ("PGJOBS_APP", "PGJOBS_DATABASE_URL", "DATABASE_URL", "SHOP_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_the_nearest_pyproject_is_found_from_a_folder_below(project: Path):
    found = find_project()
    assert found is not None
    assert (found.path, found.app, found.dsn_variable) == (
        project / "pyproject.toml",
        "shop.jobs:app",
        "SHOP_DB_URL",
    )


def test_a_pyproject_without_the_table_names_nothing(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PGJOBS_APP", raising=False)
    assert find_project() is None
    assert app_reference(None) is None


def test_the_app_option_then_the_variable_then_the_file(project, monkeypatch):
    found = app_reference(None)
    assert found is not None and (found.text, found.source) == (
        "shop.jobs:app",
        f"[tool.pgjobs] app in {project / 'pyproject.toml'}",
    )
    monkeypatch.setenv("PGJOBS_APP", "env.jobs:app")
    assert app_reference(None) == type(found)("env.jobs:app", "$PGJOBS_APP")
    assert app_reference("opt.jobs:app") == type(found)("opt.jobs:app", "--app")


def test_the_database_order(project, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", FROM_GENERIC)
    monkeypatch.setenv("SHOP_DB_URL", FROM_FILE)
    assert database(None).url == FROM_FILE, "the project's variable before $DATABASE_URL"
    assert "SHOP_DB_URL" in database(None).source
    monkeypatch.setenv("PGJOBS_DATABASE_URL", FROM_PGJOBS)
    assert database(None).url == FROM_PGJOBS
    assert database(FROM_OPTION).url == FROM_OPTION
    (project / "pyproject.toml").write_text('[tool.pgjobs]\napp = "shop.jobs:app"\n')
    monkeypatch.delenv("PGJOBS_DATABASE_URL")
    assert database(None).url == FROM_GENERIC, "a file naming no variable: $DATABASE_URL"


def test_an_unset_project_variable_is_an_error_not_a_fallback(project, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", FROM_GENERIC)
    monkeypatch.setenv("SHOP_DB_URL", FROM_FILE)
    assert database(None).url == FROM_FILE
    monkeypatch.delenv("SHOP_DB_URL")
    with pytest.raises(ConfigurationError, match=r"names \$SHOP_DB_URL, which is not set"):
        database(None)


def test_an_apps_own_dsn_comes_after_the_option_only(project, monkeypatch):
    monkeypatch.setenv("SHOP_DB_URL", FROM_FILE)
    monkeypatch.setenv("PGJOBS_DATABASE_URL", FROM_PGJOBS)
    own = App(FROM_APP)
    use_database(own, None)
    assert own.dsn.url == FROM_APP
    use_database(own, FROM_OPTION)
    assert own.dsn.url == FROM_OPTION
    monkeypatch.delenv("PGJOBS_DATABASE_URL")
    unset = App()
    use_database(unset, None)
    assert unset.dsn.url == FROM_FILE, "an app without its own DSN takes the file's variable"


@pytest.mark.parametrize(
    "literal",
    [
        "postgresql://shop:s3cret@db.internal/shop",
        "host=db.internal user=shop password=s3cret",
    ],
)
def test_a_literal_dsn_in_the_file_is_refused_and_not_shown(project, literal):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("env:SHOP_DB_URL", literal))
    with pytest.raises(ConfigurationError) as refused:
        find_project()
    assert "s3cret" not in str(refused.value)
    assert 'dsn = "env:VARIABLE"' in str(refused.value)


@pytest.mark.parametrize("boundary", ["repository", "home"])
def test_the_search_stops_at_the_repository_root_or_the_home_folder(
    tmp_path, monkeypatch, boundary
):
    """The boundary folder's own pyproject.toml is read; one above it never is."""
    (tmp_path / "pyproject.toml").write_text('[tool.pgjobs]\napp = "above:app"\n')
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    if boundary == "repository":
        (root / ".git").write_text("gitdir: /elsewhere\n")  # a worktree's .git is a file
    else:
        monkeypatch.setenv("HOME", str(root))
    assert nearest_pyproject(root / "src") is None
    assert find_project(root / "src") is None
    (root / "pyproject.toml").write_text('[tool.pgjobs]\napp = "mine:app"\n')
    found = find_project(root / "src")
    assert found is not None and found.app == "mine:app"


@pytest.mark.parametrize("pgjobs_url", [None, FROM_PGJOBS])
@pytest.mark.parametrize("file_names", ["SHOP_DB_URL", None])
@pytest.mark.parametrize("generic_url", [None, FROM_GENERIC])
def test_a_plain_app_finds_the_database_the_cli_finds(
    project, monkeypatch, pgjobs_url, file_names, generic_url
):
    """``App()`` without a DSN and a command without --dsn look in the one same order, whatever
    is set: the variables, and the variable the project's file names."""
    if file_names is None:
        (project / "pyproject.toml").write_text('[tool.pgjobs]\napp = "shop.jobs:app"\n')
    monkeypatch.setenv("SHOP_DB_URL", FROM_FILE)
    for name, value in (("PGJOBS_DATABASE_URL", pgjobs_url), ("DATABASE_URL", generic_url)):
        if value is not None:
            monkeypatch.setenv(name, value)
    if pgjobs_url is None and file_names is None and generic_url is None:
        monkeypatch.setattr(embedded, "start", lambda announce: FROM_EMBEDDED)
    expected = pgjobs_url or (FROM_FILE if file_names else generic_url) or FROM_EMBEDDED
    assert database(None).url == expected
    assert App().dsn.url == expected
    assert App().dsn.source == database(None).source


def test_a_plain_app_says_when_it_falls_back_to_the_embedded_server(project, monkeypatch, capsys):
    (project / "pyproject.toml").write_text('[tool.pgjobs]\napp = "shop.jobs:app"\n')
    monkeypatch.setattr(embedded, "start", lambda announce: FROM_EMBEDDED)
    for _ in range(2):  # each script that runs says it, not only the first since boot
        assert App().dsn.url == FROM_EMBEDDED
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "App() was given no database" in err and "[tool.pgjobs] dsn" in err
        assert f"using the embedded PostgreSQL in {embedded.data_dir()}" in err
    monkeypatch.setenv("DATABASE_URL", FROM_GENERIC)
    assert App().dsn.url == FROM_GENERIC
    assert capsys.readouterr().err == "", "a database found: nothing to say"


def test_with_no_database_at_all_each_says_what_it_can_do(project, monkeypatch):
    """The embedded extra not installed: a script's App is told the ways a script has (not
    --dsn); a command is told --dsn."""
    (project / "pyproject.toml").write_text('[tool.pgjobs]\napp = "shop.jobs:app"\n')
    monkeypatch.setattr(embedded, "installed", lambda: False)
    with pytest.raises(ConfigurationError) as by_app:
        App().dsn  # noqa: B018 (resolved on first use)
    message = str(by_app.value)
    for way in ("App(dsn=...)", "PGJOBS_DATABASE_URL", "[tool.pgjobs]", "pgjobs-queue[embedded]"):
        assert way in message
    assert "--dsn" not in message
    with pytest.raises(ConfigurationError, match="give --dsn, set PGJOBS_DATABASE_URL"):
        database(None)
    monkeypatch.setenv("SHOP_DB_URL", FROM_FILE)
    (project / "pyproject.toml").write_text('[tool.pgjobs]\ndsn = "env:SHOP_DB_URL"\n')
    assert App().dsn.url == FROM_FILE


def test_an_unset_project_variable_tells_a_script_its_way(project):
    with pytest.raises(ConfigurationError, match=r"\$SHOP_DB_URL, which is not set") as raised:
        App().dsn  # noqa: B018
    assert "App(dsn=...)" in str(raised.value) and "--dsn" not in str(raised.value)
