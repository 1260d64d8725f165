"""The bind parameters of the worker's statements, each one typed object: ``ClaimParams``
(``JOB_CLAIM``, ``JOB_CLAIM_LIMITED`` and the claim of ``JOB_SUCCEED_AND_CLAIM``) with the
``ClaimStatus`` a claim answers, ``ExtendParams`` (``JOB_EXTEND_LEASES``) and ``SettleParams``
(``JOB_SETTLE_MANY``), used by the worker and the tests alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from pgjobs.completer.arrays import float_array, int_array, text_array
from pgjobs.context import JobContext
from pgjobs.submission import DEFAULT_LEASE
from pgjobs.tasks import Task

#: Seconds before a claim tries again a limit that another worker's claim held, and the shortest
#: wait for a rate's next token.
LOCKED_OUT_RETRY = 0.02


@dataclass(frozen=True, slots=True)
class ClaimParams:
    """Bind parameters of ``queries.JOB_CLAIM`` (and of the claim in ``JOB_SUCCEED_AND_CLAIM``)
    but the number of jobs, which each trip gives to ``bind``."""

    owner: str
    queues: list[str]
    #: Lease in seconds of a task not named in ``lease_tasks``.
    lease: float = DEFAULT_LEASE
    #: Tasks with a lease of their own, and those leases (seconds), as parallel arrays.
    lease_tasks: list[str] = field(default_factory=list)
    lease_seconds: list[float] = field(default_factory=list)
    #: Tasks whose jobs go to dead_letter, not back to the queue, when their lease expires.
    at_most_once_tasks: list[str] = field(default_factory=list)
    #: Tasks this worker delivers to a downstream (external tasks): the claim records the
    #: attempt it starts as the one a report may settle.
    external_tasks: list[str] = field(default_factory=list)
    #: Tasks with a concurrency limit or a rate, and those limits as parallel arrays (None where
    #: a task has no such limit): ``JOB_CLAIM_LIMITED``'s ``limit_*`` parameters.
    limit_tasks: list[str] = field(default_factory=list)
    limit_concurrency: list[int | None] = field(default_factory=list)
    limit_rate_jobs: list[int | None] = field(default_factory=list)
    limit_rate_seconds: list[float | None] = field(default_factory=list)
    #: Tasks that limit the running jobs of each group, and those limits (parallel arrays).
    group_tasks: list[str] = field(default_factory=list)
    group_limits: list[int] = field(default_factory=list)
    #: Tasks with a group rate, and its jobs and seconds (parallel arrays).
    group_rate_tasks: list[str] = field(default_factory=list)
    group_rate_jobs: list[int] = field(default_factory=list)
    group_rate_seconds: list[float] = field(default_factory=list)
    #: Ordered tasks (one job of a group at a time, in enqueue order), and those of them whose
    #: dead jobs hold their group (``ordered="hold"``).
    ordered_tasks: list[str] = field(default_factory=list)
    hold_tasks: list[str] = field(default_factory=list)
    # The parameters but ``limit``, rendered by the first ``bind``.
    _fixed: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def for_tasks(cls, owner: str, queues: Sequence[str], tasks: Iterable[Task]) -> ClaimParams:
        """The claim of a worker that runs ``tasks`` on ``queues``."""
        tasks = list(tasks)
        limited = [t for t in tasks if t.limited]
        return cls(
            owner,
            list(queues),
            # Only the leases that differ from the default: with none, the claim reads none.
            lease_tasks=[t.name for t in tasks if t.lease != DEFAULT_LEASE],
            lease_seconds=[t.lease for t in tasks if t.lease != DEFAULT_LEASE],
            at_most_once_tasks=[t.name for t in tasks if t.at_most_once],
            external_tasks=[t.name for t in tasks if t.external is not None],
            limit_tasks=[t.name for t in limited],
            limit_concurrency=[t.concurrency for t in limited],
            limit_rate_jobs=[t.rate.jobs if t.rate else None for t in limited],
            limit_rate_seconds=[t.rate.seconds if t.rate else None for t in limited],
            group_tasks=[t.name for t in tasks if t.group_concurrency is not None],
            group_limits=[t.group_concurrency for t in tasks if t.group_concurrency is not None],
            group_rate_tasks=[t.name for t in tasks if t.group_rate is not None],
            group_rate_jobs=[t.group_rate.jobs for t in tasks if t.group_rate is not None],
            group_rate_seconds=[
                float(t.group_rate.seconds) for t in tasks if t.group_rate is not None
            ],
            ordered_tasks=[t.name for t in tasks if t.ordered is not False],
            hold_tasks=[t.name for t in tasks if t.ordered == "hold"],
        )

    def bind(
        self, limit: int, *, limited: bool = False, slots: int | None = None
    ) -> dict[str, Any]:
        """The statement's parameters, claiming at most ``limit`` jobs, of which those beyond
        ``slots`` (default: none) are claimed ahead of free slots: ``JOB_CLAIM``'s, or with
        ``limited`` ``JOB_CLAIM_LIMITED``'s (which claims no job ahead). The arrays go as array
        literals (the statement casts them), rendered once: they are the same at every trip."""
        fixed = self._fixed
        if fixed is None:
            fixed = {
                "owner": self.owner,
                "queues": text_array(self.queues),
                "lease": self.lease,
                "lease_tasks": text_array(self.lease_tasks),
                "lease_seconds": float_array(self.lease_seconds),
                "at_most_once_tasks": text_array(self.at_most_once_tasks),
                "external_tasks": text_array(self.external_tasks),
                # JOB_CLAIM leaves these tasks' jobs; JOB_CLAIM_LIMITED takes them under limits.
                "limit_tasks": text_array(self.limit_tasks),
            }
            object.__setattr__(self, "_fixed", fixed)
        if not limited:
            return {**fixed, "limit": limit, "slots": limit if slots is None else slots}
        return {
            **fixed,
            "limit": limit,
            "limit_concurrency": float_array(self.limit_concurrency),
            "limit_rate_jobs": float_array(self.limit_rate_jobs),
            "limit_rate_seconds": float_array(self.limit_rate_seconds),
            "group_tasks": text_array(self.group_tasks),
            "group_limits": int_array(self.group_limits),
            "group_rate_tasks": text_array(self.group_rate_tasks),
            "group_rate_jobs": int_array(self.group_rate_jobs),
            "group_rate_seconds": float_array(self.group_rate_seconds),
            "ordered_tasks": text_array(self.ordered_tasks),
            "hold_tasks": text_array(self.hold_tasks),
        }


class ClaimStatus(NamedTuple):
    """What a claim said besides the jobs it took (its status row; see ``JOB_CLAIM_LIMITED``)."""

    #: Jobs of limited tasks it held back (out of their queue's range), and groups whose whole
    #: share it claimed (they may hold more): claim again at once.
    held: int = 0
    #: Another worker was claiming under one of the limits: try again soon.
    locked_out: bool = False
    #: Seconds until a rate limit's bucket holds a token again, or a group held by its group
    #: rate may start a job again (None: no bucket is empty, no group is held by its rate).
    retry_in: float | None = None
    #: Some of the worker's queues have a concurrency limit or a rate.
    queue_limits: bool = False

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> ClaimStatus:
        """A claim's status, from the JSON object of its status row (in the payload column)."""
        retry_in = status.get("retry_in")
        return cls(
            int(status.get("held", 0)),
            bool(status.get("locked_out", False)),
            None if retry_in is None else float(retry_in),
            bool(status.get("queue_limits", False)),
        )

    @classmethod
    def take(cls, rows: list[tuple[Any, ...]]) -> ClaimStatus | None:
        """The claim's status, popped from the end of its ``rows`` when it gave one (the status
        row comes last; its id is NULL)."""
        return cls.of(rows.pop()[3]) if rows and rows[-1][0] is None else None

    def retry_after(self) -> float | None:
        """Seconds after which a claim under the limits may take what this one could not: soon
        when another worker was claiming under one of them, when a rate's bucket holds a token
        again; None when neither held it back."""
        waits = [LOCKED_OUT_RETRY] if self.locked_out else []
        if self.retry_in is not None:
            waits.append(max(self.retry_in, LOCKED_OUT_RETRY))
        return min(waits, default=None)


@dataclass(frozen=True, slots=True)
class ExtendParams:
    """Bind parameters of ``queries.JOB_EXTEND_LEASES``: hold each job's lease ``seconds`` from
    now, while ``owner`` still holds it for that attempt."""

    owner: str
    ids: list[int]
    attempts: list[int]
    seconds: list[float]

    @classmethod
    def of(cls, owner: str, requests: Iterable[tuple[JobContext, float]]) -> ExtendParams:
        pairs = list(requests)
        return cls(
            owner,
            [c.job.id for c, _ in pairs],
            [c.job.attempts for c, _ in pairs],
            [seconds for _, seconds in pairs],
        )

    def bind(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "ids": self.ids,
            "attempts": self.attempts,
            "seconds": self.seconds,
        }


@dataclass(frozen=True, slots=True)
class ProgressParams:
    """Bind parameters of ``queries.JOB_SET_PROGRESS``: each job's latest progress (JSON text),
    written while ``owner`` still holds its lease for that attempt."""

    owner: str
    ids: list[int]
    attempts: list[int]
    progress: list[str | None]

    @classmethod
    def of(cls, owner: str, contexts: Iterable[JobContext]) -> ProgressParams:
        taken = [(c, c.take_progress()) for c in contexts]
        return cls(
            owner,
            [c.job.id for c, _ in taken],
            [c.job.attempts for c, _ in taken],
            [value for _, value in taken],
        )

    def bind(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "ids": self.ids,
            "attempts": self.attempts,
            "progress": self.progress,
        }


@dataclass(slots=True)
class SettleParams:
    """Bind parameters of ``queries.JOB_SETTLE_MANY``: outcomes as parallel arrays, one group
    per move (archive, retry, dead_letter, release)."""

    owner: str
    ok_ids: list[int] = field(default_factory=list)
    ok_attempts: list[int] = field(default_factory=list)
    ok_results: list[str | None] = field(default_factory=list)
    retry_ids: list[int] = field(default_factory=list)
    retry_attempts: list[int] = field(default_factory=list)
    retry_delays: list[float] = field(default_factory=list)
    retry_errors: list[str] = field(default_factory=list)
    dead_ids: list[int] = field(default_factory=list)
    dead_attempts: list[int] = field(default_factory=list)
    dead_reasons: list[str] = field(default_factory=list)
    dead_types: list[str | None] = field(default_factory=list)
    dead_errors: list[str] = field(default_factory=list)
    dead_tracebacks: list[str | None] = field(default_factory=list)
    release_ids: list[int] = field(default_factory=list)
    release_attempts: list[int] = field(default_factory=list)
    release_refunds: list[bool] = field(default_factory=list)
    #: Seconds before a released job may be claimed again (0: at once).
    release_holds: list[float] = field(default_factory=list)
    #: The release is the handler's snooze (counted against its task's ``max_snoozes``).
    release_snoozes: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ok_ids) + len(self.retry_ids) + len(self.dead_ids) + len(self.release_ids)

    @property
    def ids(self) -> list[int]:
        """The ids these outcomes settle, in the statement's order."""
        return self.ok_ids + self.retry_ids + self.dead_ids + self.release_ids

    @property
    def only_successes(self) -> bool:
        return not (self.retry_ids or self.dead_ids or self.release_ids)

    def bind(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in _SETTLE_FIELDS}

    def bind_dead(self) -> dict[str, Any]:
        """``queries.JOB_BURY_MANY``'s parameters: the owner and the dead_letter moves."""
        return {"owner": self.owner, **{f.name: getattr(self, f.name) for f in _SETTLE_GROUPS[2]}}

    def extend(self, newer: SettleParams) -> None:
        """Append ``newer``'s outcomes after these."""
        for f in _SETTLE_ARRAYS:
            getattr(self, f.name).extend(getattr(newer, f.name))

    @classmethod
    def merged(cls, owner: str, parts: Sequence[SettleParams]) -> SettleParams:
        """``parts``' outcomes, in their order, as one ``SettleParams``."""
        whole = cls(owner)
        for part in parts:
            whole.extend(part)
        return whole

    def singles(self) -> list[SettleParams]:
        """One ``SettleParams`` per outcome, in the statement's order (to find the outcome the
        database refuses, after it refused the batch)."""
        parts = []
        for group in _SETTLE_GROUPS:
            for i in range(len(getattr(self, group[0].name))):
                part = SettleParams(self.owner)
                for f in group:
                    getattr(part, f.name).append(getattr(self, f.name)[i])
                parts.append(part)
        return parts


_SETTLE_FIELDS = fields(SettleParams)
_SETTLE_ARRAYS = [f for f in _SETTLE_FIELDS if f.name != "owner"]
# The arrays of each move, by their prefix: ok_, retry_, dead_, release_.
_SETTLE_GROUPS = [
    [f for f in _SETTLE_ARRAYS if f.name.startswith(prefix)]
    for prefix in ("ok_", "retry_", "dead_", "release_")
]
