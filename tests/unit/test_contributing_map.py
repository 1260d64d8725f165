"""CONTRIBUTING.md's map of the house names every top-level module of pgjobs/ and every package
(at any depth), so whoever adds one has to say where it sits and what lives there.

A module is named as ``x`` or ``x.py`` in backticks, a package by its path from pgjobs/ with a
slash, ``web/dashboard/``; ``pgjobs/`` in front is allowed. ``queries`` passes either way: a
module today, a package (``queries/``) once it is split."""

from __future__ import annotations

import re
from pathlib import Path

import pgjobs

ROOT = Path(pgjobs.__file__).parent
CONTRIBUTING = ROOT.parent / "CONTRIBUTING.md"

#: Directories of Python files that are not packages: the map names them, but not as a package.
NOT_PACKAGES = {"migrations"}


def _map_section(text: str) -> str:
    start = text.index("## The map of the house")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _named(text: str) -> set[str]:
    """What the map's backticks name, without a leading ``pgjobs/`` or ``pgjobs.``."""
    names = set()
    for token in re.findall(r"`([^`\n]+)`", _map_section(text)):
        token = token.strip()
        names.add(token.removeprefix("pgjobs/").removeprefix("pgjobs."))
    return names


def _expected() -> list[tuple[str, set[str]]]:
    """Each top-level module and each package, with the spellings that name it."""
    expected = []
    for entry in sorted(ROOT.iterdir()):
        if entry.is_file() and entry.suffix == ".py" and entry.name != "__init__.py":
            expected.append((entry.name, {entry.stem, entry.name}))
    for init in sorted(ROOT.rglob("__init__.py")):
        path = init.parent.relative_to(ROOT).as_posix()
        if path != "." and path.split("/")[0] not in NOT_PACKAGES:
            expected.append((f"{path}/", {f"{path}/"}))
    return expected


def _missing(text: str) -> list[str]:
    named = _named(text)
    return [shown for shown, spellings in _expected() if not spellings & named]


def test_the_map_names_every_top_level_module_and_every_package():
    missing = _missing(CONTRIBUTING.read_text())
    assert not missing, f"not in CONTRIBUTING.md's map of the house: {missing}"


def test_the_map_names_the_migrations_folder():
    assert {"migrations/", "pgjobs/migrations/"} & _named(CONTRIBUTING.read_text())


def test_a_name_outside_the_map_does_not_count():
    page = "## The map of the house\n\n| `db/` | `errors` |\n\n## Where a change goes\n\n`app`\n"
    missing = _missing(page)
    assert "db/" not in missing and "errors.py" not in missing
    assert "app.py" in missing and "worker/" in missing
