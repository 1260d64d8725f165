"""The insert of jobs enqueued ``after`` others (``Shape.WAITING``): they run once every job they
name has succeeded.

A job with dependencies goes in by this plan, in one transaction with the dependencies' check
(the door runs it atomically):

1. ids are reserved for every job of the call, so a job may name another of the same
   ``enqueue_many`` by ``Ref(position)`` (only one listed before it: a graph has no cycle);
2. the dependencies still in ``queued_jobs`` are locked by marking them ``watched``
   (``queries.DEPENDENCY_LOCK``): a worker that ends one of them meanwhile waits for the enqueue's
   commit, and its move then runs the trigger ``pgjobs_job_ended``, which sees the new edges;
3. the others are looked up where jobs end: succeeded is met at once, dead, cancelled or expired
   is refused (``DependencyFailed``), nowhere is refused (``UnknownDependency``); nothing is
   written then;
4. the jobs are inserted; one with dependencies not met yet sits at run_at 'infinity' with a
   ``pgjobs_waiting`` row until the trigger releases it (or sends it to ``dead_letter`` with reason
   ``dependency_failed`` when one of them does not succeed).

The jobs of the call with an idempotency key, a group or a unique key go in first, by the keyed
insert, which writes those columns: a ``Ref`` to one of them then names the job it
got (for a key already held, the holder's), a dependency like any other, locked and looked up in
steps 2 and 3. Those of them that wait go in by the keyed statement, which says which jobs it
created: each created one then takes its edges, run_at 'infinity' and its ``pgjobs_waiting`` row
in the last step (``queries.DEPENDENCY_ATTACH``); a key already held returns its holder as it is,
without the call's dependencies (as a second enqueue of a key returns the first job). A waiting
job has not started: it holds its unique key while it waits, and a second enqueue that replaces
it leaves it waiting, with the new run time for its release.

On the caller's connection the steps after the first statement (the reservation, or, with such
jobs, the read of the transaction's isolation) run in a savepoint, so a refused call leaves the
caller's transaction as it was. The jobs may be members of a batch (``batch_id``): each is then
written with the batch's id, and counted by its seal like any other member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pgjobs import queries, tags, uniqueness
from pgjobs.enqueue import statements
from pgjobs.enqueue.connections import Statement
from pgjobs.enqueue.rows import PreparedJob
from pgjobs.enqueue.statements import InsertPlan
from pgjobs.errors import ConfigurationError, DependencyFailed, UnknownDependency
from pgjobs.models import JobStatus
from pgjobs.submission import Ref

#: A keyed job the call created with dependencies: its position, its targets and their names.
Attached = tuple[int, tuple[int | Ref, ...], dict[int | Ref, str]]


def plan(
    rows: Sequence[PreparedJob],
    many: bool,
    *,
    in_callers_transaction: bool,
    batch_id: int | None = None,
) -> InsertPlan:
    """Check the rows' dependencies among themselves (before any statement), then insert the
    rows with keys or groups, reserve ids for the others, lock and look up the dependencies,
    insert the others, and attach their dependencies to the keyed jobs just created."""
    for position, row in enumerate(rows):
        _check(row, position, many)
    keyed = [position for position, row in enumerate(rows) if row.shape.keyed]
    found: dict[int, int] = {}
    created: set[int] = set()
    if keyed:
        keyed_rows = [rows[position] for position in keyed]
        if in_callers_transaction:
            # The first statement opens the caller's transaction (the others run in a savepoint);
            # on pgjobs' own connection the whole plan is one transaction, and nothing to read.
            ((level,),) = yield statements.isolation()
            if statements.needs_isolation(keyed_rows):
                uniqueness.check_isolation(level, keyed_rows)
        free = [position for position in keyed if not rows[position].after]
        if free:
            got = yield from statements.keyed([rows[position] for position in free], batch_id)
            found.update(zip(free, got, strict=True))
        held = [position for position in keyed if rows[position].after]
        if held:
            # The keyed statement says which jobs it created: only those take the call's
            # dependencies (a key already held returns its holder as it is).
            got = yield from statements.keyed(
                [rows[position] for position in held], batch_id, fresh=created
            )
            found.update(zip(held, got, strict=True))
    positions = [position for position in range(len(rows)) if position not in found]
    among = {position: n for n, position in enumerate(positions)}
    others = _resolved([rows[position] for position in positions], positions, found)
    ids: list[int] = []
    if others:
        ((reserved,),) = yield Statement(queries.DEPENDENCY_RESERVE_IDS, {"count": len(others)})
        ids = [int(job_id) for job_id in reserved]
    attached = _attached(rows, keyed, found, created, among)
    named = sorted(
        {d for row in others for d in row.after or () if isinstance(d, int)}
        | {d for _, targets, _ in attached.values() for d in targets if isinstance(d, int)}
    )
    queued: set[int] = set()
    if named:
        queued = {
            job_id for (job_id,) in (yield Statement(queries.DEPENDENCY_LOCK, {"ids": named}))
        }
    gone = {job_id for job_id in named if job_id not in queued}
    if gone:
        ended: dict[int, str] = dict(
            (yield Statement(queries.DEPENDENCY_ENDED, {"ids": sorted(gone)}))
        )
        waits = [(p, row.after or ()) for p, row in zip(positions, others, strict=True)]
        waits += [(position, targets) for position, targets, _ in attached.values()]
        for position, after in waits:
            for job_id in after:
                if job_id in gone and ended.get(job_id) != JobStatus.SUCCEEDED:
                    _refuse(job_id, ended.get(job_id), position, many)
    watched_by_keyed = {
        d.position for _, ts, _ in attached.values() for d in ts if isinstance(d, Ref)
    }
    if others:
        params = _insert_params(others, ids, queued, watched_by_keyed) | {"batch_id": batch_id}
        yield Statement(queries.DEPENDENCY_INSERT, params)
    if attached:
        yield Statement(queries.DEPENDENCY_ATTACH, _attach_params(attached, ids, queued))
    found.update(zip(positions, ids, strict=True))
    return [found[position] for position in range(len(rows))]


def _attached(
    rows: Sequence[PreparedJob],
    keyed: list[int],
    found: dict[int, int],
    created: set[int],
    among: dict[int, int],
) -> dict[int, Attached]:
    """The keyed jobs the call created with dependencies, each once (rows merged by a key share
    a job): their id to their position and targets, a ``Ref`` naming one of the call's other
    jobs by its index ``among`` them, another job by its id."""
    attached: dict[int, Attached] = {}

    def target(d: int | Ref) -> int | Ref:
        if not isinstance(d, Ref):
            return d
        return found[d.position] if d.position in found else Ref(among[d.position])

    for position in keyed:
        job_id = found[position]
        after = rows[position].after
        if after and job_id in created and job_id not in attached:
            names = _names(rows[position], target, position)
            attached[job_id] = (position, tuple(dict.fromkeys(map(target, after))), names)
    return attached


def _names(
    row: PreparedJob, target: Callable[[int | Ref], int | Ref], position: int
) -> dict[int | Ref, str]:
    """The names ``row`` gave its dependencies, by target as ``target`` maps them (a ``Ref`` to
    a job already inserted becomes its id). Two names that come to name one job (two jobs of the
    call that one key made one) are refused: the job could not read both."""
    names: dict[int | Ref, str] = {}
    for name, given in row.after_names or ():
        mapped = target(given)
        if mapped in names:
            raise ConfigurationError(
                f"job #{position}: after names one job twice ({names[mapped]!r} and {name!r}: "
                "the jobs they name share a key); give it one name",
                field=f"jobs[{position}].after",
            )
        names[mapped] = name
    return names


def _attach_params(
    attached: dict[int, Attached], ids: list[int], queued: set[int]
) -> dict[str, Any]:
    """DEPENDENCY_ATTACH's arrays for the keyed jobs created with dependencies (their id to
    their position and targets: a ``Ref`` names one of the call's other jobs by its index)."""
    job_ids: list[int] = []
    waiting_on: list[int] = []
    edge_jobs: list[int] = []
    edge_targets: list[int] = []
    edge_names: list[str | None] = []
    for job_id, (_, targets, names) in attached.items():
        unmet = 0
        for target in targets:
            if isinstance(target, Ref):
                target_id = ids[target.position]
                unmet += 1
            else:
                target_id = target
                unmet += target in queued
            edge_jobs.append(job_id)
            edge_targets.append(target_id)
            edge_names.append(names.get(target))
        job_ids.append(job_id)
        waiting_on.append(unmet)
    return {
        "ids": job_ids,
        "waiting_on": waiting_on,
        "watched": [unmet > 0 for unmet in waiting_on],
        "edge_jobs": edge_jobs,
        "edge_targets": edge_targets,
        "edge_names": edge_names,
    }


def _resolved(
    rows: list[PreparedJob], positions: list[int], found: dict[int, int]
) -> list[PreparedJob]:
    """``rows`` (at ``positions`` in the call) with each ``Ref`` to a job already inserted
    (``found``: its position to its id) replaced by that id, and each other ``Ref`` counted
    among ``rows``. A job named twice so (two jobs of one key are one job) is named once."""
    if not found:
        return rows
    among = {position: n for n, position in enumerate(positions)}

    def target(d: int | Ref) -> int | Ref:
        if not isinstance(d, Ref):
            return d
        return found[d.position] if d.position in found else Ref(among[d.position])

    return [
        row._replace(
            after=tuple(dict.fromkeys(map(target, row.after))),
            after_names=tuple((name, d) for d, name in _names(row, target, position).items())
            or None,
        )
        if row.after
        else row
        for row, position in zip(rows, positions, strict=True)
    ]


def _check(row: PreparedJob, position: int, many: bool) -> None:
    """Refuse what a job with dependencies cannot be: a ``Ref`` to itself or to a job not listed
    before it (or in ``enqueue``, any ``Ref``)."""
    where = f"job #{position}: " if many else ""
    field = f"jobs[{position}].after" if many else "after"
    for ref in row.after or ():
        if not isinstance(ref, Ref):
            continue
        if not many:
            raise ConfigurationError(
                f"after holds {ref!r}, which names a job of the same enqueue_many call; "
                "enqueue takes job ids",
                field=field,
            )
        if ref.position == position:
            raise ConfigurationError(f"{where}a job may not depend on itself", field=field)
        if ref.position > position:
            raise ConfigurationError(
                f"{where}after holds {ref!r}, a job listed after it: a job may wait only for "
                "jobs listed before it (so that no cycle can be made)",
                field=field,
            )


def _refuse(job_id: int, status: str | None, position: int, many: bool) -> None:
    where = f"job #{position}: " if many else ""
    field = f"jobs[{position}].after" if many else "after"
    if status is None:
        raise UnknownDependency(
            f"{where}no job {job_id} to wait for in any pgjobs table "
            "(purged, pruned, or never enqueued)",
            field=field,
        )
    raise DependencyFailed(
        f"{where}job {job_id} already ended {status}: a job waiting for it would never run",
        field=field,
    )


def _insert_params(
    rows: Sequence[PreparedJob], ids: list[int], queued: set[int], waited_for: set[int]
) -> dict[str, Any]:
    """DEPENDENCY_INSERT's arrays: the jobs, how many dependencies each still waits for, which
    are watched (``waited_for``: those a keyed job of the call waits for, by index), and the
    edges."""
    waiting_on: list[int] = []
    watched = [index in waited_for for index in range(len(rows))]
    edge_jobs: list[int] = []
    edge_targets: list[int] = []
    edge_names: list[str | None] = []
    for position, row in enumerate(rows):
        unmet = 0
        names = {target: name for name, target in row.after_names or ()}
        for target in row.after or ():
            if isinstance(target, Ref):
                watched[target.position] = True
                target_id = ids[target.position]
                unmet += 1
            else:
                target_id = target
                unmet += target in queued
            edge_jobs.append(ids[position])
            edge_targets.append(target_id)
            edge_names.append(names.get(target))
        waiting_on.append(unmet)
        if unmet:
            watched[position] = True
    return {
        "ids": ids,
        "queues": [row.queue for row in rows],
        "tasks": [row.task for row in rows],
        "payloads": [row.payload for row in rows],
        "priorities": [row.priority for row in rows],
        "run_ats": [row.run_at for row in rows],
        "run_ins": [row.run_in for row in rows],
        "max_attempts": [row.max_attempts for row in rows],
        "expires_ats": [row.expires_at for row in rows],
        "expires_ins": [row.expires_in for row in rows],
        "tags": tags.column(rows),
        "payload_versions": [row.payload_version for row in rows],
        "trace_contexts": [row.trace_context for row in rows],
        "waiting_on": waiting_on,
        "watched": watched,
        "edge_jobs": edge_jobs,
        "edge_targets": edge_targets,
        "edge_names": edge_names,
    }
