"""Every module and package of pgjobs/ sits in an import contract (pyproject.toml's
``[tool.importlinter]``), so a new module cannot slip in beside the layers unchecked.

A top-level module or package is named in the "pgjobs layers" contract (a layer entry may hold
several names, ``"a | b"``); the name covers the whole package unless the package has a contract
of its own, whose layers (or independent modules) then name every module in it. A package with
no contract of its own is listed in ``UNCONTRACTED`` with the reason, and a directory of Python
files that is not a package at all in ``NOT_PACKAGES``."""

from __future__ import annotations

import re
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pgjobs

ROOT = Path(pgjobs.__file__).parent
PYPROJECT = ROOT.parent / "pyproject.toml"

#: Packages without a contract of their own, each pinned whole by its name in its parent's.
UNCONTRACTED = {
    "pgjobs.cli": (
        "the command line is the top layer (only pgjobs.__main__ imports it); its command "
        "modules share options, rendering and messages with no order among them worth a contract"
    ),
    "pgjobs.queries": (
        "the statements, one module per entity: they import only "
        "the vocabulary below them and each other, and the top-level layers pin them below db"
    ),
}

#: Directories of Python files inside pgjobs/ that are not packages, so nothing imports them.
NOT_PACKAGES = {
    "pgjobs.migrations": "Alembic's env.py and versions/, loaded by Alembic from their paths",
}


def _contracts() -> list[dict[str, Any]]:
    with PYPROJECT.open("rb") as file:
        contracts: list[dict[str, Any]] = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    return contracts


def _named() -> dict[str, set[str]]:
    """Per package (dotted name), the names of its children that a contract of its own names."""
    named: dict[str, set[str]] = defaultdict(set)
    for contract in _contracts():
        if contract["type"] == "layers":
            containers = contract.get("containers") or [""]
            for layer in contract["layers"]:
                # "a | b" (independent) or "a : b" (not); "(a)" marks an optional layer.
                for name in re.split(r"[|:]", layer):
                    name = name.strip().strip("()").strip()
                    for container in containers:
                        full = f"{container}.{name}" if container else name
                        parent, _, child = full.rpartition(".")
                        named[parent].add(child)
        elif contract["type"] == "independence":
            for module in contract["modules"]:
                parent, _, child = module.rpartition(".")
                named[parent].add(child)
    return named


def _children(directory: Path) -> list[Path]:
    """A directory's modules (``*.py`` but ``__init__``) and directories holding Python files."""
    found = []
    for entry in sorted(directory.iterdir()):
        if (entry.is_file() and entry.suffix == ".py" and entry.name != "__init__.py") or (
            entry.is_dir() and entry.name != "__pycache__" and any(entry.rglob("*.py"))
        ):
            found.append(entry)
    return found


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts)


def _packages() -> list[Path]:
    """pgjobs and every package below it (directories with an ``__init__.py``)."""
    found, todo = [], [ROOT]
    while todo:
        directory = todo.pop()
        found.append(directory)
        for child in _children(directory):
            if child.is_dir() and _dotted(child) not in NOT_PACKAGES:
                todo.append(child)
    return sorted(found)


def test_every_top_level_module_and_package_is_in_the_pgjobs_layers():
    named = _named()["pgjobs"]
    top = {_dotted(child).removeprefix("pgjobs.") for child in _children(ROOT)}
    missing = sorted(top - named - {name.removeprefix("pgjobs.") for name in NOT_PACKAGES})
    assert not missing, f"not in the pgjobs layers (pyproject.toml): {missing}"


def test_every_module_of_a_package_with_a_contract_is_named_in_it():
    named = _named()
    missing = []
    for package in _packages():
        dotted = _dotted(package)
        if dotted in named:
            missing += [
                _dotted(child)
                for child in _children(package)
                if child.with_suffix("").name not in named[dotted]
                and _dotted(child) not in NOT_PACKAGES
            ]
    assert not missing, f"not in their package's contract (pyproject.toml): {missing}"


def test_a_package_without_a_contract_of_its_own_is_listed_with_the_reason():
    named = _named()
    unlisted = [
        _dotted(package)
        for package in _packages()
        if _dotted(package) not in named and _dotted(package) not in UNCONTRACTED
    ]
    assert not unlisted, f"give these a contract or list them in UNCONTRACTED: {unlisted}"


def test_every_directory_of_python_files_is_a_package_or_listed():
    odd = [
        _dotted(directory)
        for directory in [ROOT, *ROOT.rglob("*")]
        if directory.is_dir()
        and directory.name != "__pycache__"
        and any(directory.glob("*.py"))
        and not (directory / "__init__.py").exists()
        and not any(_dotted(directory).startswith(name) for name in NOT_PACKAGES)
    ]
    assert not odd, f"directories of Python files that are not packages: {odd}"


def test_the_lists_of_exceptions_name_what_is_there_and_has_no_contract():
    named = _named()
    for name in UNCONTRACTED:
        path = ROOT.parent.joinpath(*name.split("."))
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"{name} is gone"
        assert name not in named, f"{name} has a contract now: take it out of UNCONTRACTED"
    for name in NOT_PACKAGES:
        path = ROOT.parent.joinpath(*name.split("."))
        assert path.is_dir() and not (path / "__init__.py").exists(), name


def test_a_layer_entry_may_hold_several_names():
    # The parse the tests above rely on: the contract's own syntax, read as import-linter does.
    named = _named()
    assert {"worker", "supervisor", "web", "testing", "__main__"} <= named["pgjobs"]
    assert {"libpq", "reads"} <= named["pgjobs.db"]
    assert "overview" in named["pgjobs.web.dashboard.pages"]
