"""Bearer tokens for the HTTP API.

Tokens come from ``create_app(tokens=..., read_only_tokens=...)`` or, when those are not given,
from the environment:

* ``PGJOBS_API_TOKENS``: comma-separated tokens that may do everything;
* ``PGJOBS_API_TOKENS_FILE``: a file of such tokens, one per line (blank lines and lines
  starting with ``#`` are skipped);
* ``PGJOBS_API_READ_TOKENS`` and ``PGJOBS_API_READ_TOKENS_FILE``: read-only tokens, the same way.
  A read-only token may use GET (and HEAD) routes only; on any other it gets 403.

A token is at least ``MIN_TOKEN_LENGTH`` characters of printable ASCII without spaces. A request
presents one as ``Authorization: Bearer <token>``; it is compared with every configured token in
constant time (SHA-256 digests compared with ``hmac.compare_digest``, all of them every time), so
neither the timing nor the order of the tokens tells anything. No token is ever logged, and no
message quotes one.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pgjobs.errors import ConfigurationError

ENV_TOKENS = "PGJOBS_API_TOKENS"
ENV_TOKENS_FILE = "PGJOBS_API_TOKENS_FILE"
ENV_READ_TOKENS = "PGJOBS_API_READ_TOKENS"
ENV_READ_TOKENS_FILE = "PGJOBS_API_READ_TOKENS_FILE"
#: Characters a token must have at least: a guessable token is no protection.
MIN_TOKEN_LENGTH = 16
#: Methods a read-only token may use.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_TOKEN_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class Access(enum.Enum):
    """What a presented token may do."""

    FULL = "full"
    READ_ONLY = "read_only"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True, slots=True)
class Tokens:
    """The configured tokens, kept as digests only."""

    full: tuple[bytes, ...]
    read_only: tuple[bytes, ...]

    @property
    def configured(self) -> bool:
        return bool(self.full or self.read_only)

    def access(self, presented: str) -> Access | None:
        """What ``presented`` may do, or None when it is no configured token. Every configured
        token is compared, whatever matches first."""
        digest = _digest(presented)
        full = read_only = False
        for known in self.full:
            full |= hmac.compare_digest(digest, known)
        for known in self.read_only:
            read_only |= hmac.compare_digest(digest, known)
        if full:
            return Access.FULL
        return Access.READ_ONLY if read_only else None


def load_tokens(
    tokens: Iterable[str] | None = None, read_only_tokens: Iterable[str] | None = None
) -> Tokens:
    """The API's tokens: ``tokens``/``read_only_tokens`` when given, else the environment's
    (``PGJOBS_API_TOKENS``, ``PGJOBS_API_TOKENS_FILE``, and their ``READ`` counterparts).
    ``ConfigurationError`` for a token too short or holding spaces (the message says which one
    by position and source, never quoting it), an unreadable file, or a token listed as both.

    Example: ``load_tokens(["s3cr3t-token-of-32-characters!!"]).configured`` is True.
    """
    full = _gather(tokens, ENV_TOKENS, ENV_TOKENS_FILE, "tokens")
    read_only = _gather(read_only_tokens, ENV_READ_TOKENS, ENV_READ_TOKENS_FILE, "read-only tokens")
    both = set(full) & set(read_only)
    if both:
        raise ConfigurationError(
            f"{len(both)} API token(s) are listed both as full and as read-only tokens: "
            "list each token once"
        )
    return Tokens(tuple(full), tuple(read_only))


def _gather(given: Iterable[str] | None, env: str, env_file: str, kind: str) -> list[bytes]:
    """Digests of the tokens ``given``, else of the environment's."""
    sources: list[tuple[str, list[str]]] = []
    if given is not None:
        sources.append((f"create_app's {kind.replace(' ', '_').replace('-', '_')}", list(given)))
    else:
        if os.environ.get(env):
            sources.append((f"${env}", os.environ[env].split(",")))
        path = os.environ.get(env_file)
        if path:
            sources.append((f"${env_file} ({path})", _read_file(path, env_file)))
    digests = []
    for source, values in sources:
        for position, raw in enumerate(values, start=1):
            digests.append(_digest(_check(raw.strip(), position, source)))
    return digests


def _read_file(path: str, env_file: str) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigurationError(f"${env_file}: cannot read {path}: {reason}") from None
    return [
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _check(token: str, position: int, source: str) -> str:
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"API token #{position} of {source} is {len(token)} characters long; use at least "
            f"{MIN_TOKEN_LENGTH} ({_TOKEN_HINT})"
        )
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ConfigurationError(
            f"API token #{position} of {source} holds spaces or characters outside printable "
            f"ASCII, which an Authorization header cannot carry ({_TOKEN_HINT})"
        )
    return token
