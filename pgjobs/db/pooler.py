"""What sits between pgjobs and PostgreSQL: nothing or a session-mode pool (``session``, the
default), or a transaction-mode pooler such as PgBouncer's ``pool_mode = transaction``
(``transaction``), where consecutive transactions of one connection may run on different server
sessions. Chosen by ``$PGJOBS_POOLER``, ``App(pooler=...)`` or ``--pooler``."""

from __future__ import annotations

import os
from enum import StrEnum

from pgjobs.errors import ConfigurationError

#: The environment variable that names the pooler mode of every DSN pgjobs resolves.
POOLER_ENV = "PGJOBS_POOLER"


class Pooler(StrEnum):
    """How the connections of a DSN reach PostgreSQL."""

    #: Directly, or through a session-mode pool: one server session per connection.
    SESSION = "session"
    #: Through a transaction-mode pooler: no session state survives a transaction (no prepared
    #: statements, no session settings, no LISTEN, no session advisory locks).
    TRANSACTION = "transaction"


def parse_pooler(raw: str | Pooler, source: str) -> Pooler:
    """``raw`` as a ``Pooler``; anything else is a ``ConfigurationError`` naming ``source``.

    Example: ``parse_pooler("Transaction", "--pooler") is Pooler.TRANSACTION``
    """
    if isinstance(raw, Pooler):
        return raw
    try:
        return Pooler(str(raw).strip().lower())
    except ValueError:
        choices = " or ".join(mode.value for mode in Pooler)
        raise ConfigurationError(
            f"{source} {raw!r}: choose {choices} (transaction behind PgBouncer's "
            "pool_mode = transaction)",
            field="pooler",
        ) from None


def pooler_from_env() -> Pooler:
    """``$PGJOBS_POOLER``, else ``Pooler.SESSION``."""
    raw = os.environ.get(POOLER_ENV, "").strip()
    return parse_pooler(raw, f"${POOLER_ENV}") if raw else Pooler.SESSION
