"""Where the database is: DSN parsing, normalising, redaction, and the one order in which pgjobs
looks for one, for the CLI and for ``App()`` alike (``--dsn`` or ``App(dsn=...)``, the
environment, ``[tool.pgjobs] dsn``, the embedded server)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgjobs.db import embedded
from pgjobs.db.pooler import Pooler, pooler_from_env
from pgjobs.db.project import find_project
from pgjobs.errors import ConfigurationError

ENV_DSN = ("PGJOBS_DATABASE_URL", "DATABASE_URL")
#: How an application gives its database, in messages.
APP_SOURCE = "App(dsn=...)"
_SCHEMES = ("postgresql", "postgres")
_DRIVER_SUFFIXES = ("+psycopg", "+psycopg2", "+psycopg3", "+asyncpg")


@dataclass(frozen=True, slots=True)
class Dsn:
    """A libpq connection URL and where it came from (for messages), and what sits between it
    and PostgreSQL (``$PGJOBS_POOLER`` unless given: see ``pgjobs.db.pooler``)."""

    url: str
    source: str
    pooler: Pooler = field(default_factory=pooler_from_env, compare=False)

    @property
    def transaction_pooled(self) -> bool:
        """Whether connections of this DSN go through a transaction-mode pooler."""
        return self.pooler is Pooler.TRANSACTION

    @property
    def redacted(self) -> str:
        return redact(self.url)

    @property
    def sqlalchemy_url(self) -> str:
        """The same URL for SQLAlchemy's psycopg 3 dialect."""
        scheme, rest = self.url.split("://", 1)
        return f"postgresql+psycopg://{rest}" if scheme in _SCHEMES else self.url


def normalize_dsn(raw: str, source: str) -> Dsn:
    """Accept ``postgresql://``, ``postgres://`` and ``postgresql+psycopg://`` URLs and libpq
    ``key=value`` connection strings (as psycopg does); the result is always a
    ``postgresql://`` URL. ``source`` says where the DSN came from, in messages.

    Example: ``normalize_dsn("postgresql+psycopg://u@h/db", "--dsn").url == "postgresql://u@h/db"``
    and ``normalize_dsn("host=h dbname=db user=u", "App(dsn=...)").url == "postgresql://u@h/db"``
    """
    raw = raw.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep and "=" in raw:
        return Dsn(_url_from_keywords(raw, source), source)
    if not sep:
        raise ConfigurationError(
            f"{source} is not a PostgreSQL DSN: expected postgresql://user@host:port/dbname "
            "or 'host=... dbname=... user=...'"
        )
    base = scheme.lower()
    for suffix in _DRIVER_SUFFIXES:
        base = base.removesuffix(suffix)
    if base not in _SCHEMES:
        raise ConfigurationError(
            f"{source} has scheme {scheme!r}: expected postgresql://user@host:port/dbname"
        )
    url = f"postgresql://{rest}"
    _check_parses(url, source)
    return Dsn(url, source)


def _url_from_keywords(conninfo: str, source: str) -> str:
    """A libpq ``key=value`` connection string as the ``postgresql://`` URL that means the same:
    user, password, a single host and port, and dbname in their places, every other parameter
    (several hosts, a socket directory, sslmode, ...) as a query parameter. Refused, with libpq's
    reason and no secret, when libpq cannot read it."""
    params = _parsed(conninfo, source)
    user, password = params.pop("user", None), params.pop("password", None)
    host, port = params.get("host"), params.get("port")
    dbname = params.pop("dbname", None)
    userinfo = ""
    if user is not None or password is not None:
        userinfo = quote(user or "", safe="")
        if password is not None:
            userinfo += ":" + quote(password, safe="")
        userinfo += "@"
    netloc = ""
    # One host name or address goes in its place; a socket directory ("/..."), several hosts or
    # an empty host stay parameters, which libpq reads the same way.
    if host and not any(c in host for c in "/,@") and (not port or port.isdigit()):
        params.pop("host")
        netloc = f"[{host}]" if ":" in host else host
        if port:
            netloc += f":{params.pop('port')}"
    path = "/" + quote(dbname, safe="") if dbname is not None else ""
    query = "&".join(
        f"{quote(key, safe='')}={quote(value, safe='')}" for key, value in params.items()
    )
    url = f"postgresql://{userinfo}{netloc}{path}" + (f"?{query}" if query else "")
    _check_parses(url, source)
    return url


def _parsed(conninfo: str, source: str) -> dict[str, str]:
    """libpq's reading of ``conninfo`` (a URL or ``key=value`` string), values as strings."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        reason = scrub(" ".join(str(exc).split()), conninfo)
        raise ConfigurationError(
            f"{source} is not a valid PostgreSQL DSN ({reason}): in a URL percent-encode special "
            "characters in the user name and password (# as %23, @ as %40, / as %2F, % as %25); "
            "in a key=value string quote a value holding spaces or quotes ('it''s')"
        ) from None
    return {key: str(value) for key, value in params.items() if value is not None}


def _check_parses(url: str, source: str) -> None:
    """Refuse, before any connection, a URL libpq cannot read or whose port is not a number:
    ``ConfigurationError`` with libpq's reason, its secrets scrubbed."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        reason = scrub(" ".join(str(exc).split()), url)
        raise ConfigurationError(
            f"{source} is not a valid PostgreSQL URL ({reason}): percent-encode special "
            "characters in the user name and password (# as %23, @ as %40, / as %2F, % as %25)"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            where = scrub(f'port "{port}"', url)
            raise ConfigurationError(
                f"{source} has {where}: expected a number from 1 to 65535 "
                "(percent-encode special characters in the password: # as %23, @ as %40)"
            )


#: Connection parameters whose values are secrets, wherever they appear in a DSN.
_SECRET_KEYS = frozenset({"password", "sslpassword"})
#: ``key=value`` in a libpq connection string: a value is quoted ('...' with \\ escapes) or runs to
#: the next ``key=`` (a password with an unquoted space is still all hidden) or the end.
_KV_SECRET = re.compile(
    r"(?i)(?<![\w.])(?P<key>ssl)?password\s*=\s*"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|.*?)(?=\s+[\w.]+\s*=|\s*$)",
    re.DOTALL,
)
#: Text a libpq message quotes from the connection string: "..." or '...'.
_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")
#: A PostgreSQL URL inside a message (up to the next space or quote).
_URL_IN_TEXT = re.compile(r"(?i)postgres(?:ql)?(?:\+\w+)?://[^\s\"']*")
_MASK = "***"
#: Passwords shorter than this are not replaced wherever they occur in a message.
_SHORTEST_REPLACED = 4


def redact(url: str) -> str:
    """The DSN with every password replaced by ``***``, safe for logs and errors: URLs (the
    password in the userinfo, percent-encoded or not, even holding ``#``, ``?``, ``/`` or ``@``,
    or given as a ``password=`` parameter) and libpq ``key=value`` strings.

    Example: ``redact("postgresql://u:p#?/@x@h/db") == "postgresql://u:***@h/db"``
    """
    spans = _secret_spans(url)
    for start, end in reversed(spans):
        url = url[:start] + _MASK + url[end:]
    return url


def scrub(message: str, url: str | None = None) -> str:
    """``message`` (a driver's or libpq's error text) without the secrets of ``url``: the whole URL
    becomes its redacted form, and the password (raw, percent-encoded or decoded) and any quoted
    fragment of the DSN that overlaps it (libpq echoes tokens such as ``"%:x@h"``) become ``***``.
    URLs and ``password=`` values the message holds are redacted even without ``url``.

    Example: ``scrub('invalid percent-encoded token: "sec%ret"', "postgresql://u:sec%ret@h/db")``
    is ``'invalid percent-encoded token: "***"'``.
    """
    if url:
        message = message.replace(url, redact(url))
        spans = _secret_spans(url)
        message = _QUOTED.sub(lambda m: _mask_quoted(m, url, spans), message)
        for secret in _secrets(url, spans):
            message = message.replace(secret, _MASK)
    message = _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), message)
    return redact(message) if "://" not in message else message


def _secret_spans(dsn: str) -> list[tuple[int, int]]:
    """Where the secrets lie in ``dsn``: (start, end) index pairs, in order, not overlapping."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or not re.fullmatch(r"(?i)[a-z][a-z0-9+.-]*", scheme):
        return [(m.start("value"), m.end("value")) for m in _KV_SECRET.finditer(dsn)]
    offset = len(scheme) + len(sep)
    spans: list[tuple[int, int]] = []
    # libpq ends the userinfo at the first "@"; a password holding an unencoded "@", "/", "?" or
    # "#" moves that point, so everything up to the last "@" is taken as the userinfo.
    userinfo, at, _ = rest.rpartition("@")
    colon = userinfo.find(":")
    if at and colon >= 0:
        spans.append((offset + colon + 1, offset + len(userinfo)))
    # A parameter may hold the password too (?password=...), itself holding "@" or "?".
    _, question, query = rest.partition("?")
    position = offset + len(rest) - len(query)
    for parameter in query.split("&") if question else []:
        key, equals, value = parameter.partition("=")
        if equals and unquote(key).strip().lower() in _SECRET_KEYS:
            start = position + len(key) + 1
            spans.append((start, start + len(value)))
        position += len(parameter) + 1
    return _merged(spans)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _secrets(dsn: str, spans: list[tuple[int, int]]) -> list[str]:
    """Each password of ``dsn`` as written, percent-decoded and percent-encoded, longest first."""
    found: set[str] = set()
    for start, end in spans:
        raw = dsn[start:end].strip("'")
        found.update({raw, unquote(raw), quote(raw, safe=""), quote(unquote(raw), safe="")})
    # A very short one is left to the quoted-token and URL rules: replacing every "a" of a
    # message would leave nothing to read.
    return sorted((s for s in found if len(s) >= _SHORTEST_REPLACED), key=len, reverse=True)


def _mask_quoted(match: re.Match[str], dsn: str, spans: list[tuple[int, int]]) -> str:
    """A quoted token of a libpq message, masked when some place it comes from in ``dsn``
    overlaps a password."""
    token = match.group(1) if match.group(1) is not None else match.group(2)
    if token:
        index = dsn.find(token)
        while index >= 0:
            end = index + len(token)
            if any(index < s_end and s_start < end for s_start, s_end in spans):
                quote_char = match.group(0)[0]
                return f"{quote_char}{_MASK}{quote_char}"
            index = dsn.find(token, index + 1)
    return match.group(0)


def resolve_dsn(
    explicit: str | None = None, *, announce: bool = True, source: str = "--dsn"
) -> Dsn:
    """Find the database: ``explicit`` (given as ``source``: ``--dsn``, ``App(dsn=...)``), then
    $PGJOBS_DATABASE_URL, then the variable that ``dsn = "env:NAME"`` under ``[tool.pgjobs]``
    in the nearest pyproject.toml names, then $DATABASE_URL, then the embedded server when the
    ``embedded`` extra is installed (said on stderr once per boot unless ``announce`` is False).
    The project's variable comes before $DATABASE_URL, which is often set for something else; a
    variable it names that is not set is an error, not a reason to look further.

    Example: ``resolve_dsn("postgresql://postgres@127.0.0.1/app").source == "--dsn"``
    """
    if explicit:
        return normalize_dsn(explicit, source)
    first, generic = ENV_DSN
    if os.environ.get(first):
        return normalize_dsn(os.environ[first], f"${first}")
    project = find_project()
    name = project.dsn_variable if project is not None else None
    if project is not None and name is not None:
        value = os.environ.get(name)
        if not value:
            raise ConfigurationError(
                f"{project.where('dsn')} names ${name}, which is not set: set it to the "
                f"database's URL, or give {source}"
            )
        return normalize_dsn(value, f"${name} (named by [tool.pgjobs] dsn)")
    if os.environ.get(generic):
        return normalize_dsn(os.environ[generic], f"${generic}")
    if not embedded.installed():
        raise ConfigurationError(
            f"no database configured: give {source}, set {first}, or name the variable that "
            'holds its URL with dsn = "env:NAME" under [tool.pgjobs] in pyproject.toml (or '
            "install pgjobs-queue[embedded] for a local embedded PostgreSQL)"
        )
    return Dsn(embedded.start(announce=announce), "embedded")


def app_dsn() -> Dsn:
    """The database of an ``App()`` made without ``dsn``: ``resolve_dsn``'s order, as the CLI's.
    Falling back to the embedded server is said on stderr every time, naming its folder: a
    script's jobs would otherwise seem lost when its workers use another database.

    Example: ``app_dsn().source == "$PGJOBS_DATABASE_URL"`` with that variable set.
    """
    found = resolve_dsn(None, announce=False, source=APP_SOURCE)
    if found.source == "embedded":
        print(
            f"pgjobs: App() was given no database ({APP_SOURCE}, ${ENV_DSN[0]}, "
            f"[tool.pgjobs] dsn, ${ENV_DSN[1]}): using the embedded PostgreSQL in "
            f"{embedded.data_dir()}",
            file=sys.stderr,
        )
    return found
