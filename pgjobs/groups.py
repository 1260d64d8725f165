"""The groups of each queue, as `pgjobs stats`, the dashboard's queue page and the
``pgjobs_groups_at_limit`` gauge show them: the groups with the most ready jobs, how many groups
a queue has and how many are at their limit (their running jobs reached the queue's
``group_concurrency`` or, when the caller has the app, a task's), and what holds each top group's
ready jobs back: its running jobs at its limit, an ordered task's oldest job that is not ready, a
dead job of an ``ordered="hold"`` task (ordered tasks known only with the app), a group rate (the
queue's or a task's) that allows no more starts for now, and until when.

One read, ``load``, bounded whatever the queue holds (see ``queries.GROUPS_LOAD``): a group's
ready jobs are counted up to ``READY_CAP``, a queue's groups up to ``MAX_GROUPS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.models import GroupHold, GroupLoad, HoldReason, QueueGroups
from pgjobs.rates import rate_text
from pgjobs.tasks import Task

#: Groups shown per queue by stats and the dashboard.
TOP_GROUPS = 5
#: A group's ready jobs are counted up to this many ("1,000+" beyond).
READY_CAP = 1000
#: A queue's groups with waiting jobs are read up to this many (the count shows "1,000+").
MAX_GROUPS = 1000
#: A group held by its running jobs names this many of them (the oldest; the count says all).
HOLDERS = 3


def task_limits(tasks: Iterable[Task]) -> dict[str, int]:
    """The most running jobs of one group that each task allows: its ``group_concurrency``, 1
    for an ordered task; tasks that do not limit their groups are left out.

    Example: ``task_limits(app.tasks.values())`` is ``{"crm.sync": 2}``
    """
    limits = {}
    for task in tasks:
        if task.ordered is not False:
            limits[task.name] = 1
        elif task.group_concurrency is not None:
            limits[task.name] = task.group_concurrency
    return limits


def ordered_tasks(tasks: Iterable[Task]) -> dict[str, bool | str]:
    """The ordered tasks, by name, with their ``ordered`` (True, or ``"hold"``: a dead job holds
    its group): what holds their groups' jobs back is shown only when the caller knows them.

    Example: ``ordered_tasks(app.tasks.values())`` is ``{"ledger.post": "hold"}``
    """
    return {task.name: task.ordered for task in tasks if task.ordered is not False}


def load(
    conn: psycopg.Connection[Any],
    *,
    limits: Mapping[str, int] | None = None,
    ordered: Mapping[str, bool | str] | None = None,
    queue: str | None = None,
    top: int = TOP_GROUPS,
    ready_cap: int = READY_CAP,
    max_groups: int = MAX_GROUPS,
) -> list[QueueGroups]:
    """Every queue that holds grouped jobs (waiting or running), by name: its ``top`` groups by
    ready jobs with what holds each one's ready jobs back (``GroupLoad.held_by``), its count of
    groups and of groups at their limit. ``limits``: the tasks' own group limits
    (``task_limits(app.tasks.values())``), when the caller has the app; without them only the
    queue's ``group_concurrency`` counts. ``ordered``: the ordered tasks
    (``ordered_tasks(app.tasks.values())``), with the app too; without them nothing is said of
    what holds an ordered task's groups. ``queue``: that queue only. ``top`` 0 reads the counts
    alone (cheaper: no group's ready jobs are counted, no hold is read).

    Example: ``[(q.queue, q.at_limit) for q in load(conn, top=0)]``
    """
    chosen = dict(limits or {})
    in_order = dict(ordered or {})
    params = {
        "tasks": list(chosen),
        "limits": list(chosen.values()),
        "ordered_tasks": list(in_order),
        "hold_tasks": [task for task, how in in_order.items() if how == "hold"],
        "holders": HOLDERS,
        "queue": queue,
        "top": top,
        "ready_cap": ready_cap,
        "max_groups": max_groups,
    }
    with db.translate_errors():
        rows = db.fetch_all(conn, queries.GROUPS_LOAD, params)
    found: dict[str, QueueGroups] = {}
    shown: dict[str, dict[str, GroupLoad]] = {}
    for name, limit, groups, capped, at_limit, key, ready, running, held, *hold in rows:
        if name not in found:
            found[name] = QueueGroups(name, limit, groups, capped, at_limit, ())
            shown[name] = {}
        if key is None:
            continue
        group = shown[name].get(key)
        if group is None:
            group = GroupLoad(key, min(ready, ready_cap), ready > ready_cap, running, bool(held))
        if hold[0] is not None:
            group = dataclasses.replace(group, held_by=(*group.held_by, _hold(*hold)))
        shown[name][key] = group
    return [dataclasses.replace(found[name], top=tuple(shown[name].values())) for name in found]


def _hold(
    reason: str,
    task: str | None,
    ids: list[int],
    jobs: int,
    until: Any,
    rate_jobs: int | None,
    rate_seconds: float | None,
) -> GroupHold:
    rate = rate_text(rate_jobs, rate_seconds)
    return GroupHold(HoldReason(reason), task, tuple(ids), jobs, until, rate)
