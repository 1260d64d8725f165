"""Retention policies: how long finished jobs are kept, per table and per queue.

One shape wherever a policy is given: ``[tool.pgjobs.retention]`` in ``pyproject.toml``,
``App(retention=...)`` (the same keys in a dict, or a ``RetentionPolicy``) and the flags of
`pgjobs work` (``--retain-archive``, ``--retain-dead``, ``--retain-export``)::

    [tool.pgjobs.retention]
    archive = "30d"          # archived_jobs: succeeded, cancelled, expired
    dead_letter = "90d"      # dead_letter: failed for good
    export = "/backup/jobs"  # optional: a folder; what retention removes is copied there first
    export_format = "csv"    # csv (with a header, the default) or text (COPY's own format)

    [tool.pgjobs.retention.queues.reports]
    archive = "7d"           # this queue's own period, in place of the table's

A period is an age as the command line writes it (``12h``, ``30d``, ``2w``), from one second to
100 years. A table without a period is kept whole; a policy without any is off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_queue
from pgjobs.text import MAX_AGE, age_of

#: The tables a policy names, by their key.
TABLES = ("archive", "dead_letter")
#: Export formats a policy takes (those of `pgjobs prune --format`).
EXPORT_FORMATS = ("csv", "text")
_KEYS = (*TABLES, "export", "export_format", "queues")
_AGE_EXAMPLES = "90m, 12h, 30d or 2w"


def check_period(source: str, value: object) -> timedelta:
    """``value`` as a retention period: a ``timedelta`` or an age such as ``"30d"``, longer than 0
    and at most 100 years; else a one-line ``ConfigurationError`` naming ``source``.

    Example: ``check_period("archive", "30d") == timedelta(days=30)``
    """
    if isinstance(value, timedelta):
        if timedelta(0) < value <= MAX_AGE:
            return value
        shown = f"{value.total_seconds():g} seconds"
    elif isinstance(value, str):
        found = age_of(value)
        if found is not None:
            return found
        shown = repr(value[:40])
    else:
        shown = f"{type(value).__name__} {value!r:.40}"
    raise ConfigurationError(
        f"{source} {shown}: expected a positive age such as {_AGE_EXAMPLES} (at most 100 years)",
        field="retention",
    )


@dataclass(frozen=True, slots=True)
class QueueRetention:
    """A queue's own periods; None where the table's period applies."""

    archive: timedelta | None = None
    dead_letter: timedelta | None = None


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long finished jobs are kept: per table, and per queue where given (see the module's
    documentation for the keys). None leaves a table's rows in place.

    Example: ``RetentionPolicy.of({"archive": "30d", "queues": {"reports": {"archive": "7d"}}})``
    """

    #: Rows of archived_jobs older than this (by finished_at) go.
    archive: timedelta | None = None
    #: Rows of dead_letter older than this (by failed_at) go.
    dead_letter: timedelta | None = None
    #: Queues with periods of their own.
    queues: Mapping[str, QueueRetention] = field(default_factory=dict)
    #: A folder: what is removed is first copied there (partitions to <partition>.csv, rows
    #: deleted in batches appended to <table>.csv).
    export: Path | None = None
    #: csv or text; None: csv.
    export_format: str | None = None

    def __post_init__(self) -> None:
        for key in TABLES:
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, check_period(f"retention {key}", value))
        queues = {}
        for name, periods in self.queues.items():
            queue = check_queue(name)
            if not isinstance(periods, QueueRetention):
                raise ConfigurationError(
                    f"retention of queue {queue!r} must be a QueueRetention", field="retention"
                )
            for key in TABLES:
                value = getattr(periods, key)
                if value is not None:
                    check_period(f"retention queues.{queue}.{key}", value)
            queues[queue] = periods
        object.__setattr__(self, "queues", queues)
        if self.export_format is not None and self.export_format not in EXPORT_FORMATS:
            raise ConfigurationError(
                f"retention export_format {self.export_format!r}: choose "
                f"{' or '.join(EXPORT_FORMATS)}",
                field="retention",
            )
        if self.export is not None and not Path(self.export).is_dir():
            raise ConfigurationError(
                f"retention export {self.export}: not a folder (retention exports into a "
                "folder, a file per partition and per table)",
                field="retention",
            )

    @classmethod
    def of(cls, settings: Mapping[str, object], source: str = "retention") -> RetentionPolicy:
        """The policy a mapping of the keys of ``[tool.pgjobs.retention]`` gives; ``source``
        names it in errors (``[tool.pgjobs.retention] in /srv/shop/pyproject.toml``).

        Example: ``RetentionPolicy.of({"archive": "30d", "dead_letter": "90d"}).archive``
        is ``timedelta(days=30)``
        """
        if not isinstance(settings, Mapping):
            raise ConfigurationError(f"{source} must be a table of {', '.join(TABLES)}")
        unknown = sorted(set(settings) - set(_KEYS))
        if unknown:
            raise ConfigurationError(
                f"{source} has no setting {unknown[0]!r} (the settings are {', '.join(_KEYS)})",
                field="retention",
            )
        periods = {
            key: check_period(f"{source}, {key}", settings[key])
            for key in TABLES
            if settings.get(key) is not None
        }
        queues = settings.get("queues") or {}
        if not isinstance(queues, Mapping):
            raise ConfigurationError(
                f"{source} queues must be a table of queues, e.g. [tool.pgjobs.retention.queues."
                'reports] with archive = "7d"',
                field="retention",
            )
        own = {
            str(name): _queue_periods(f"{source}, queues.{name}", value)
            for name, value in queues.items()
        }
        export = settings.get("export")
        if export is not None and not isinstance(export, str | Path):
            raise ConfigurationError(f"{source} export must be a folder's path", field="retention")
        if export is not None and not Path(export).is_dir():
            raise ConfigurationError(
                f"{source} export {export}: not a folder (retention exports into a folder, a "
                "file per partition and per table)",
                field="retention",
            )
        export_format = settings.get("export_format")
        if export_format is not None and export_format not in EXPORT_FORMATS:
            raise ConfigurationError(
                f"{source} export_format {export_format!r}: choose {' or '.join(EXPORT_FORMATS)}",
                field="retention",
            )
        try:
            return cls(
                queues=own,
                export=Path(export) if export is not None else None,
                export_format=export_format,
                **periods,
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{source}: {exc}", field="retention") from None

    @property
    def active(self) -> bool:
        """Whether the policy removes anything."""
        return any(getattr(self, key) for key in TABLES) or any(
            getattr(periods, key) for periods in self.queues.values() for key in TABLES
        )

    @property
    def format(self) -> str:
        """``export_format`` with its default."""
        return self.export_format or "csv"

    def merged(self, over: RetentionPolicy | None) -> RetentionPolicy:
        """This policy with what ``over`` sets in place of its own: each table's period, each
        queue's periods, the export and its format.

        Example: ``file.merged(flags)`` for `pgjobs work --retain-archive 7d` over pyproject.toml
        """
        if over is None:
            return self
        queues = dict(self.queues)
        for name, periods in over.queues.items():
            mine = queues.get(name, QueueRetention())
            queues[name] = QueueRetention(
                periods.archive or mine.archive, periods.dead_letter or mine.dead_letter
            )
        return replace(
            self,
            archive=over.archive or self.archive,
            dead_letter=over.dead_letter or self.dead_letter,
            queues=queues,
            export=over.export or self.export,
            export_format=over.export_format or self.export_format,
        )


def _queue_periods(source: str, settings: object) -> QueueRetention:
    if not isinstance(settings, Mapping):
        raise ConfigurationError(f"{source} must be a table of {', '.join(TABLES)}")
    unknown = sorted(set(settings) - set(TABLES))
    if unknown:
        raise ConfigurationError(
            f"{source} has no setting {unknown[0]!r} (a queue's settings are {', '.join(TABLES)})",
            field="retention",
        )
    return QueueRetention(
        **{
            key: check_period(f"{source}, {key}", settings[key])
            for key in TABLES
            if settings.get(key) is not None
        }
    )


def retention_policy(value: object, source: str) -> RetentionPolicy | None:
    """``value`` (None, a ``RetentionPolicy`` or a mapping of its keys) as a policy, checked.

    Example: ``retention_policy({"archive": "30d"}, "App(retention=...)")``
    """
    if value is None or isinstance(value, RetentionPolicy):
        return value
    if isinstance(value, Mapping):
        return RetentionPolicy.of(value, source)
    raise ConfigurationError(
        f"{source} must be a dict such as {{'archive': '30d', 'dead_letter': '90d'}} or a "
        f"RetentionPolicy, got {type(value).__name__}",
        field="retention",
    )
