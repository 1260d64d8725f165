"""The workflow a job belongs to, as the job page draws it: the jobs its dependency edges reach in
either direction, laid out in layers and drawn as an SVG by the server (no script, no library:
it works offline and with JavaScript off).

The layout is the layered one: each job's rank is the longest path to it from a job with no
dependency among those drawn (so every edge points to a later rank, left to right), and the
jobs of a rank are ordered to cut crossings by barycentre passes (each job moved to the mean
place of its neighbours in the ranks before it, then after it). At most ``DRAWN`` jobs are drawn,
the nearest to the job first; the page says how many more the workflow has (counted up to
``REACHED``).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.text import printable

#: Jobs drawn at most: the nearest to the job, breadth first.
DRAWN = 200
#: Jobs of the workflow read at most (the rest is "more than" this); bounds the page's work.
REACHED = 2000
#: Barycentre passes (each one down the ranks, then up).
PASSES = 2

#: Geometry, in SVG user units (CSS pixels at 100%).
NODE_WIDTH = 168
NODE_HEIGHT = 26
RANK_GAP = 56
ROW_GAP = 8
MARGIN = 8
#: Characters of a task's name shown in its box (the whole name is in its title).
LABEL_TASK = 16

#: Job statuses by the colour the graph gives them (a CSS class ``wf-<colour>``).
COLOURS = {
    "ready": "queued",
    "scheduled": "queued",
    "waiting": "waiting",
    "running": "running",
    "succeeded": "succeeded",
    "dead": "dead",
    "cancelled": "cancelled",
    "expired": "cancelled",
}


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    #: A JobStatus value, or None: the job is in no table any longer (pruned).
    status: str | None
    task: str | None
    x: int
    y: int
    #: Whether it is the job whose page this is.
    current: bool

    @property
    def colour(self) -> str:
        return COLOURS.get(self.status or "", "gone")

    @property
    def label(self) -> str:
        task = printable(self.task or "")
        if len(task) > LABEL_TASK:
            task = task[: LABEL_TASK - 1] + "…"
        return f"#{self.id} {task}".rstrip()

    @property
    def title(self) -> str:
        if self.status is None:
            return f"Job {self.id}: no longer kept (pruned)"
        return f"Job {self.id} ({printable(self.task or '')}): {self.status}"


@dataclass(frozen=True, slots=True)
class Edge:
    """A dependency drawn from the job depended on (left) to the job that waits for it."""

    x1: int
    y1: int
    x2: int
    y2: int

    @property
    def path(self) -> str:
        bend = max(RANK_GAP // 2, (self.x2 - self.x1) // 3)
        return (
            f"M{self.x1},{self.y1} C{self.x1 + bend},{self.y1} "
            f"{self.x2 - bend},{self.y2} {self.x2},{self.y2}"
        )


@dataclass(frozen=True, slots=True)
class Workflow:
    """What the job page draws; empty (no ``nodes``) for a job without dependency edges."""

    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    #: Jobs of the workflow not drawn (at least that many when ``more_at_least``).
    more: int
    more_at_least: bool
    ranks: int
    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT


def workflow(conn: psycopg.Connection[Any], job_id: int) -> Workflow:
    """Job ``job_id``'s workflow, read in two statements (``queries.DEPENDENCY_GRAPH``, then the
    status of the jobs drawn) and laid out."""
    rows = db.fetch_all(conn, queries.DEPENDENCY_GRAPH, {"id": job_id, "cap": REACHED})
    reached = [int(a) for a, b in rows if b is None]
    if len(reached) <= 1:
        return Workflow([], [], 0, 0, 0, False, 0)
    drawn = reached[:DRAWN]
    shown = set(drawn)
    edges = [(int(b), int(a)) for a, b in rows if b is not None and a in shown and b in shown]
    found = {
        int(i): (status, task)
        for i, status, task in db.fetch_all(conn, queries.DEPENDENCY_GRAPH_JOBS, {"ids": drawn})
    }
    more = len(reached) - len(drawn)
    return lay_out(drawn, edges, found, job_id, more, more_at_least=len(reached) >= REACHED)


def ranks_of(ids: list[int], edges: list[tuple[int, int]]) -> dict[int, int]:
    """Each job's rank: the longest path to it along ``edges`` (before, after), 0 for a job
    with nothing before it. A cycle (which pgjobs never writes) leaves its jobs at rank 0."""
    after: dict[int, list[int]] = defaultdict(list)
    waiting = dict.fromkeys(ids, 0)
    for before, then in edges:
        after[before].append(then)
        waiting[then] += 1
    rank = dict.fromkeys(ids, 0)
    ready = deque(i for i in ids if waiting[i] == 0)
    while ready:
        job = ready.popleft()
        for then in after[job]:
            rank[then] = max(rank[then], rank[job] + 1)
            waiting[then] -= 1
            if waiting[then] == 0:
                ready.append(then)
    return rank


def order_ranks(
    ids: list[int], edges: list[tuple[int, int]], rank: dict[int, int], passes: int = PASSES
) -> list[list[int]]:
    """The jobs of each rank, top to bottom: first as ``ids`` has them, then by barycentre
    passes over the neighbours in the ranks before (going down) and after (going up)."""
    layers: list[list[int]] = [[] for _ in range(max(rank.values(), default=0) + 1)]
    for job in ids:
        layers[rank[job]].append(job)
    before: dict[int, list[int]] = defaultdict(list)
    after: dict[int, list[int]] = defaultdict(list)
    for a, b in edges:
        after[a].append(b)
        before[b].append(a)

    def place() -> dict[int, float]:
        # A job's place as a fraction of its rank's height, so that ranks of different sizes
        # compare.
        return {job: (row + 0.5) / len(layer) for layer in layers for row, job in enumerate(layer)}

    def sweep(layer_indexes: range, neighbours: dict[int, list[int]]) -> None:
        for index in layer_indexes:
            where = place()
            layer = layers[index]

            def key(job: int, where: dict[int, float] = where) -> float:
                near = neighbours.get(job)
                if not near:
                    return where[job]  # no neighbour that side: it keeps its place
                return sum(where[n] for n in near) / len(near)

            keyed = sorted((key(job), row, job) for row, job in enumerate(layer))
            layers[index] = [job for _, _, job in keyed]

    for _ in range(passes):
        sweep(range(1, len(layers)), before)
        sweep(range(len(layers) - 2, -1, -1), after)
    return layers


def crossings(layers: list[list[int]], edges: list[tuple[int, int]]) -> int:
    """How many pairs of edges cross (edges between the same two ranks, by their rows; an edge
    over several ranks is counted by its ends' rows)."""
    row = {job: (index, r) for index, layer in enumerate(layers) for r, job in enumerate(layer)}
    spans = [(row[a], row[b]) for a, b in edges]
    count = 0
    for i, ((la, ra), (lb, rb)) in enumerate(spans):
        for (lc, rc), (ld, rd) in spans[i + 1 :]:
            if la == lc and lb == ld and (ra - rc) * (rb - rd) < 0:
                count += 1
    return count


def lay_out(
    ids: list[int],
    edges: list[tuple[int, int]],
    found: dict[int, tuple[str, str]],
    current: int,
    more: int = 0,
    *,
    more_at_least: bool = False,
) -> Workflow:
    """The drawing of ``ids`` and ``edges`` (before, after); ``found``: each job's status and
    task (a job missing from it is drawn as pruned)."""
    rank = ranks_of(ids, edges)
    layers = order_ranks(ids, edges, rank)
    tallest = max(len(layer) for layer in layers)
    height = 2 * MARGIN + tallest * (NODE_HEIGHT + ROW_GAP) - ROW_GAP
    where: dict[int, tuple[int, int]] = {}
    nodes = []
    for index, layer in enumerate(layers):
        x = MARGIN + index * (NODE_WIDTH + RANK_GAP)
        # Each rank centred on the tallest.
        top = MARGIN + (tallest - len(layer)) * (NODE_HEIGHT + ROW_GAP) // 2
        for row, job in enumerate(layer):
            y = top + row * (NODE_HEIGHT + ROW_GAP)
            where[job] = (x, y)
            status, task = found.get(job, (None, None))
            nodes.append(Node(job, status, task, x, y, job == current))
    lines = [
        Edge(
            where[a][0] + NODE_WIDTH,
            where[a][1] + NODE_HEIGHT // 2,
            where[b][0],
            where[b][1] + NODE_HEIGHT // 2,
        )
        for a, b in edges
    ]
    width = 2 * MARGIN + len(layers) * (NODE_WIDTH + RANK_GAP) - RANK_GAP
    return Workflow(nodes, lines, width, height, more, more_at_least, len(layers))
