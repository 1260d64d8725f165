"""What a project says about pgjobs in its ``pyproject.toml``: the ``[tool.pgjobs]`` table of the
nearest one, searched from the working directory upward, no further than the repository's root
(a folder holding ``.git``) or the user's home.

``app = "package.module:app"`` names the app, as ``--app`` does. ``dsn = "env:VARIABLE"`` names
the environment variable that holds the database's URL: a file never holds the URL itself (it
would hold the password too, and end up in version control). ``[tool.pgjobs.retention]`` is the
retention policy `pgjobs work` applies (``pgjobs.retention_policy``).

A settings file, like the app's code, is trusted only when no one but the current user or root
could have written it (``check_trusted``): it names code that pgjobs imports and runs.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from pgjobs.errors import ConfigurationError
from pgjobs.retention_policy import RetentionPolicy

PYPROJECT = "pyproject.toml"
#: ``dsn = "env:NAME"``: the one form of a DSN in the file, a reference to a variable.
_DSN_REFERENCE = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")
_KEYS = ("app", "dsn", "retention")


@dataclass(frozen=True, slots=True)
class Project:
    """The ``[tool.pgjobs]`` table of ``path``: the app's reference and the name of the variable
    that holds the DSN, and its retention policy, each None when the table does not give it."""

    path: Path
    app: str | None = None
    dsn_variable: str | None = None
    retention: RetentionPolicy | None = None

    @property
    def root(self) -> Path:
        """The project's directory, from which its app is imported."""
        return self.path.parent

    def where(self, key: str) -> str:
        """How messages name a key: ``[tool.pgjobs] app in /srv/shop/pyproject.toml``."""
        return f"[tool.pgjobs] {key} in {self.path}"


def nearest_pyproject(start: Path | None = None) -> Path | None:
    """The ``pyproject.toml`` of ``start`` (the working directory) or of its nearest parent that
    has one, up to the first folder that is a repository's root (holds ``.git``) or the user's
    home, included; None when none has one. Not checked: see ``check_trusted``."""
    found, _ = _search(start)
    return found


def project_root(start: Path | None = None) -> Path | None:
    """The folder of the project ``start`` (the working directory) is in: that of the nearest
    ``pyproject.toml`` (``nearest_pyproject``), else the repository's root the search stopped
    at; None outside both.

    Example: ``project_root(Path("/srv/shop/src")) == Path("/srv/shop")`` when
    /srv/shop/pyproject.toml exists.
    """
    found, repository = _search(start)
    return found.parent if found is not None else repository


def _search(start: Path | None) -> tuple[Path | None, Path | None]:
    """(the nearest pyproject.toml, the repository root the search stopped at), each or both
    None."""
    here = (start or Path(os.getcwd())).resolve()
    home = _home()
    for directory in (here, *here.parents):
        candidate = directory / PYPROJECT
        if candidate.is_file():
            return candidate, None
        if (directory / ".git").exists():
            return None, directory
        if directory == home:
            break
    return None, None


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (KeyError, RuntimeError):  # no home: no such boundary
        return None


def check_trusted(path: Path, what: str | None = None) -> None:
    """Refuse ``path`` (``ConfigurationError``, one line naming it and why) when someone other
    than the current user or root may have written it: it belongs to another user, everyone may
    write it, or its group may and that group is not its owner's own (a group of one user, as
    a umask of 002 makes files group-writable on many systems). ``what`` names the file in the
    message (default: the path), for an app's module.

    Example: ``check_trusted(Path("pyproject.toml"))`` returns quietly for a file of yours
    (mode 0644), and raises for one of ``nobody``'s.
    """
    if not hasattr(os, "geteuid"):
        return  # Windows: files have no uid and mode bits to judge by
    label = what or str(path)
    try:
        found = path.stat()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {label}: {exc.strerror}") from None
    if found.st_uid not in (os.geteuid(), 0):
        raise ConfigurationError(
            f"refusing {label}: it belongs to {_user_name(found.st_uid)}, not to you or root; "
            "pgjobs takes settings and code only from files of yours or root's (work from a "
            "folder of your own, or chown the file if it is yours)"
        )
    mode = stat.S_IMODE(found.st_mode)
    if mode & stat.S_IWOTH:
        writer, bits = "everyone", "o"
    elif mode & stat.S_IWGRP and not _own_group(found.st_gid, found.st_uid):
        writer, bits = f"group {_group_name(found.st_gid)}", "g"
    else:
        return
    raise ConfigurationError(
        f"refusing {label}: {writer} can write it (mode {mode:04o}); pgjobs takes settings "
        f"and code only from files no one else can change (chmod {bits}-w {path})"
    )


def _own_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is the private group of user ``uid``: the user's primary group, with no
    other user in it."""
    import grp
    import pwd

    try:
        owner = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    if owner.pw_gid != gid or set(group.gr_mem) - {owner.pw_name}:
        return False
    return not any(user.pw_gid == gid and user.pw_uid != uid for user in pwd.getpwall())


def _user_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    import grp

    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def find_project(start: Path | None = None) -> Project | None:
    """The ``[tool.pgjobs]`` settings of the nearest ``pyproject.toml``; None when there is no
    such file or it has no ``[tool.pgjobs]`` table. A file that is not valid TOML, a table
    with an unknown key or a value of the wrong type, or a table in a file someone else may have
    written (``check_trusted``) raises ``ConfigurationError``.

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
    check_trusted(path)
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
    retention = table.get("retention")
    return Project(
        path,
        app.strip() if app else None,
        _dsn_variable(project, dsn),
        None
        if retention is None
        else RetentionPolicy.of(retention, f"[tool.pgjobs.retention] in {path}"),
    )


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
