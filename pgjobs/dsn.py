"""Where the database is: DSN parsing, normalising, redaction, and the order in which pgjobs
looks for one (``--dsn``, the environment, the embedded server)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from pgjobs import embedded
from pgjobs.errors import ConfigurationError

ENV_DSN = ("PGJOBS_DATABASE_URL", "DATABASE_URL")
_SCHEMES = ("postgresql", "postgres")
_DRIVER_SUFFIXES = ("+psycopg", "+psycopg2", "+psycopg3", "+asyncpg")


@dataclass(frozen=True, slots=True)
class Dsn:
    """A libpq connection URL and where it came from (for messages)."""

    url: str
    source: str

    @property
    def redacted(self) -> str:
        return redact(self.url)

    @property
    def sqlalchemy_url(self) -> str:
        """The same URL for SQLAlchemy's psycopg 3 dialect."""
        scheme, rest = self.url.split("://", 1)
        return f"postgresql+psycopg://{rest}" if scheme in _SCHEMES else self.url


def normalize_dsn(raw: str, source: str) -> Dsn:
    """Accept ``postgresql://``, ``postgres://`` and ``postgresql+psycopg://`` forms.

    Example: ``normalize_dsn("postgresql+psycopg://u@h/db", "--dsn").url == "postgresql://u@h/db"``
    """
    raw = raw.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise ConfigurationError(
            f"{source} is not a PostgreSQL URL: expected postgresql://user@host:port/dbname"
        )
    base = scheme.lower()
    for suffix in _DRIVER_SUFFIXES:
        base = base.removesuffix(suffix)
    if base not in _SCHEMES:
        raise ConfigurationError(
            f"{source} has scheme {scheme!r}: expected postgresql://user@host:port/dbname"
        )
    return Dsn(f"postgresql://{rest}", source)


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, safe for logs and errors."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable DSN>"
    # libpq also takes the password as a URI parameter: postgresql://u@h/db?password=...
    query = re.sub(r"(?i)(^|&)password=[^&]*", r"\1password=***", parts.query)
    if parts.password is not None:
        userinfo, _, hostinfo = parts.netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        parts = parts._replace(netloc=f"{user}:***@{hostinfo}")
    elif query == parts.query:
        return url
    return urlunsplit(parts._replace(query=query))


def resolve_dsn(explicit: str | None = None, *, announce: bool = True) -> Dsn:
    """Find the database: ``explicit`` (``--dsn``), then $PGJOBS_DATABASE_URL, then $DATABASE_URL,
    then the embedded server when the ``embedded`` extra is installed.

    Example: ``resolve_dsn("postgresql://postgres@127.0.0.1/app").source == "--dsn"``
    """
    if explicit:
        return normalize_dsn(explicit, "--dsn")
    for name in ENV_DSN:
        value = os.environ.get(name)
        if value:
            return normalize_dsn(value, f"${name}")
    return Dsn(embedded.start(announce=announce), "embedded")
