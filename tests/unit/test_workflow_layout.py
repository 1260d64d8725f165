"""The workflow graph's layered layout (pgjobs.web.dashboard.graph), without a database: ranks
by longest path, crossings cut by the barycentre passes, and a drawing in which every edge runs
left to right and no two boxes overlap."""

from __future__ import annotations

import random

from pgjobs.web.dashboard import graph


def test_a_job_is_ranked_by_its_longest_path_from_a_job_with_no_dependency() -> None:
    # 1 -> 2 -> 4, 1 -> 3 -> 4, 1 -> 4 (a long edge), 5 alone after 4.
    edges = [(1, 2), (1, 3), (2, 4), (3, 4), (1, 4), (4, 5)]
    assert graph.ranks_of([1, 2, 3, 4, 5], edges) == {1: 0, 2: 1, 3: 1, 4: 2, 5: 3}
    # Nothing before them: rank 0, whatever the order given.
    assert graph.ranks_of([5, 4, 3], [(4, 5)]) == {3: 0, 4: 0, 5: 1}


def test_the_barycentre_passes_uncross_a_crossed_pair_of_ranks() -> None:
    edges = [(1, 6), (2, 5), (3, 4)]  # 1, 2, 3 over 4, 5, 6: every pair crosses
    ids = [1, 2, 3, 4, 5, 6]
    rank = graph.ranks_of(ids, edges)
    unordered = graph.order_ranks(ids, edges, rank, passes=0)
    assert graph.crossings(unordered, edges) == 3
    assert graph.crossings(graph.order_ranks(ids, edges, rank), edges) == 0


def _random_dag(nodes: int, seed: int) -> tuple[list[int], list[tuple[int, int]]]:
    rng = random.Random(seed)
    ids = list(range(1, nodes + 1))
    edges = set()
    for job in ids[1:]:
        for before in rng.sample(ids[: job - 1], min(job - 1, rng.randint(1, 2))):
            if job - before <= 12:  # workflows are local: steps after the steps just before
                edges.add((before, job))
    return ids, sorted(edges)


def test_at_200_jobs_the_passes_cut_the_crossings_of_the_order_found() -> None:
    for seed in range(3):
        ids, edges = _random_dag(200, seed)
        shuffled = ids[:]
        random.Random(seed).shuffle(shuffled)
        rank = graph.ranks_of(shuffled, edges)
        before = graph.crossings(graph.order_ranks(shuffled, edges, rank, passes=0), edges)
        after = graph.crossings(graph.order_ranks(shuffled, edges, rank), edges)
        assert after < before / 2, (seed, before, after)


def test_the_drawing_runs_left_to_right_without_overlapping_boxes() -> None:
    ids, edges = _random_dag(200, 7)
    found = {i: ("succeeded" if i % 2 else "waiting", f"etl.step_{i}") for i in ids[:-1]}
    drawn = graph.lay_out(ids, edges, found, current=ids[0], more=12)
    assert len(drawn.nodes) == 200 and len(drawn.edges) == len(edges) and drawn.more == 12
    boxes = {(n.x, n.y) for n in drawn.nodes}
    assert len(boxes) == 200  # one place per job
    for n in drawn.nodes:
        assert n.x >= 0 and n.x + graph.NODE_WIDTH <= drawn.width
        assert n.y >= 0 and n.y + graph.NODE_HEIGHT <= drawn.height
    assert all(e.x2 > e.x1 for e in drawn.edges)
    last = next(n for n in drawn.nodes if n.id == ids[-1])
    assert last.status is None and last.colour == "gone" and "pruned" in last.title
    assert [n.current for n in drawn.nodes].count(True) == 1
    label = next(n for n in drawn.nodes if n.id == 150).label
    assert label.startswith("#150 etl.step_") and len(label) <= len("#150 ") + graph.LABEL_TASK
