"""The Python reference (docs/reference/python.md, mkdocstrings' ``::: path`` entries) keeps pace
with the code: every name ``pgjobs`` exports has an entry, every entry is read from one of the
public paths the page names, and no entry shows a class of pgjobs' internals (an underscore name,
or a base class the reference does not document) as if it were public."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import yaml

import pgjobs

ROOT = Path(pgjobs.__file__).parent.parent
PAGE = ROOT / "docs" / "reference" / "python.md"
MKDOCS = ROOT / "mkdocs.yml"

#: The public paths the page's introduction promises.
PUBLIC = ("pgjobs", "pgjobs.errors", "pgjobs.worker", "pgjobs.testing", "pgjobs.web")


def _entries(text: str) -> dict[str, dict[str, Any]]:
    """Each ``::: path`` of a page with the options indented below it."""
    entries: dict[str, dict[str, Any]] = {}
    for match in re.finditer(r"^::: (\S+)\n((?:(?: {4}.*)?\n)*)", text, flags=re.MULTILINE):
        block = yaml.safe_load(match.group(2)) if match.group(2).strip() else None
        entries[match.group(1)] = (block or {}).get("options") or {}
    return entries


def _resolve(path: str) -> tuple[str, Any]:
    """The module a dotted path is read from and the object it names (an attribute before a
    submodule of the same name, as ``pgjobs.testing.drain``, the function, is read)."""
    parts = path.split(".")
    found: Any = importlib.import_module(parts[0])
    module = parts[0]
    for depth, name in enumerate(parts[1:], start=2):
        try:
            found = getattr(found, name)
        except AttributeError:
            found = importlib.import_module(".".join(parts[:depth]))
        if inspect.ismodule(found):
            module = ".".join(parts[:depth])
    return module, found


def _default_options() -> dict[str, Any]:
    config = yaml.safe_load(MKDOCS.read_text())
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            options: dict[str, Any] = plugin["mkdocstrings"]["handlers"]["python"].get(
                "options", {}
            )
            return options
    raise AssertionError("mkdocs.yml configures no mkdocstrings")


def _missing_exports(text: str) -> list[str]:
    documented = [_resolve(path)[1] for path in _entries(text)]
    return [
        name
        for name in pgjobs.__all__
        if not any(getattr(pgjobs, name) is thing for thing in documented)
    ]


def _internal_bases(text: str) -> list[str]:
    """Entries whose shown bases include a pgjobs class the reference has no entry for."""
    entries = _entries(text)
    documented = [_resolve(path)[1] for path in entries]
    shows_bases = _default_options().get("show_bases", True)
    shown = []
    for path, options in entries.items():
        thing = _resolve(path)[1]
        if not inspect.isclass(thing) or not options.get("show_bases", shows_bases):
            continue
        shown += [
            f"{path}: {base.__module__}.{base.__qualname__}"
            for base in thing.__bases__
            if base.__module__.split(".")[0] == "pgjobs"
            and not any(base is other for other in documented)
        ]
    return shown


def test_every_exported_name_has_an_entry():
    missing = _missing_exports(PAGE.read_text())
    assert not missing, f"pgjobs.__all__ names without an entry in {PAGE.name}: {missing}"


def test_every_entry_is_read_from_a_public_path_and_names_nothing_private():
    for path in _entries(PAGE.read_text()):
        module, _ = _resolve(path)
        assert module in PUBLIC, f"{path} is read from {module}, not a public path"
        assert not any(part.startswith("_") for part in path.split(".")), path


def test_no_entry_shows_an_internal_base_class():
    shown = _internal_bases(PAGE.read_text())
    assert not shown, f"internal base classes shown (set show_bases: false): {shown}"


def test_the_checks_see_what_a_page_leaves_out():
    # What the page looked like before Batch, the errors of app.wait and show_bases: false.
    page = "::: pgjobs.App\n    options:\n      inherited_members: true\n\n::: pgjobs.Job\n"
    assert {"Batch", "Snooze", "WaitTimeout"} <= set(_missing_exports(page))
    assert _internal_bases(page) == [
        "pgjobs.App: pgjobs.registry.Registry",
        "pgjobs.App: pgjobs.operator.Operator",
    ]
    page = page.replace("true\n", "true\n      show_bases: false\n", 1)
    assert _internal_bases(page) == []
    assert "App" not in _missing_exports(page)
