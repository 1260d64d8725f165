"""What a project says about pgjobs in its ``pyproject.toml``: the ``[tool.pgjobs]`` table of the
nearest one, searched from the working directory upward.

``app = "package.module:app"`` names the app, as ``--app`` does. ``dsn = "env:VARIABLE"`` names
the environment variable that holds the database's URL: a file never holds the URL itself (it
would hold the password too, and end up in version control).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pgjobs.errors import ConfigurationError

PYPROJECT = "pyproject.toml"
#: ``dsn = "env:NAME"``: the one form of a DSN in the file, a reference to a variable.
_DSN_REFERENCE = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")
_KEYS = ("app", "dsn")


@dataclass(frozen=True, slots=True)
class Project:
    """The ``[tool.pgjobs]`` table of ``path``: the app's reference and the name of the variable
    that holds the DSN, each None when the table does not give it."""

    path: Path
    app: str | None = None
    dsn_variable: str | None = None

    @property
    def root(self) -> Path:
        """The project's directory, from which its app is imported."""
        return self.path.parent

    def where(self, key: str) -> str:
        """How messages name a key: ``[tool.pgjobs] app in /srv/shop/pyproject.toml``."""
        return f"[tool.pgjobs] {key} in {self.path}"


def nearest_pyproject(start: Path | None = None) -> Path | None:
    """The ``pyproject.toml`` of ``start`` (the working directory) or of its nearest parent that
    has one; None when no directory up to the root has one."""
    here = (start or Path(os.getcwd())).resolve()
    for directory in (here, *here.parents):
        candidate = directory / PYPROJECT
        if candidate.is_file():
            return candidate
    return None


def find_project(start: Path | None = None) -> Project | None:
    """The ``[tool.pgjobs]`` settings of the nearest ``pyproject.toml``; None when there is no
    such file or it has no ``[tool.pgjobs]`` table. A file that is not valid TOML, or a table
    with an unknown key or a value of the wrong type, raises ``ConfigurationError``.

    Example: ``find_project().app == "shop.jobs:app"`` under a project whose pyproject.toml has
    ``[tool.pgjobs]`` and ``app = "shop.jobs:app"``.
    """
    path = nearest_pyproject(start)
    return None if path is None else read_project(path)


def read_project(path: Path) -> Project | None:
    """``path``'s ``[tool.pgjobs]`` table, checked (see ``find_project``)."""
    import tomllib  # only where a project file is read: not by `pgjobs work --app ... --dsn ...`

    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid UTF-8 (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None
    tool = document.get("tool", {})
    table = tool.get("pgjobs") if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: tool.pgjobs must be a table ([tool.pgjobs])")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{path}: [tool.pgjobs] has no setting {unknown[0]!r} (the settings are "
            f"{', '.join(_KEYS)})"
        )
    project = Project(path)
    app, dsn = table.get("app"), table.get("dsn")
    if app is not None and (not isinstance(app, str) or not app.strip()):
        raise ConfigurationError(
            f'{project.where("app")} must be a string such as "package.module:app"'
        )
    return Project(path, app.strip() if app else None, _dsn_variable(project, dsn))


def _dsn_variable(project: Project, value: object) -> str | None:
    """The variable ``dsn = "env:NAME"`` names. Anything else is refused, without showing the
    value: a literal URL or ``key=value`` string would hold the password."""
    if value is None:
        return None
    where = project.where("dsn")
    if not isinstance(value, str):
        raise ConfigurationError(f'{where} must be a string such as "env:DATABASE_URL"')
    found = _DSN_REFERENCE.fullmatch(value.strip())
    if found is not None:
        return found.group(1)
    if "://" in value or "=" in value:
        raise ConfigurationError(
            f"{where} holds a DSN itself: a file must not hold the database's address and "
            'password; put the URL in an environment variable and write dsn = "env:VARIABLE"'
        )
    raise ConfigurationError(
        f'{where} must name an environment variable, as dsn = "env:DATABASE_URL" does'
    )
