"""Least-recently-used order over a changing set of candidates, as a lazy heap.

`push(node)` records `(node.last_access, node)` when a node becomes a candidate. Touching
a node only raises its `last_access`: nothing is pushed, so a match costs no heap work.
`pop(eligible)` drops entries of nodes that are not eligible now, re-files an entry whose
node was touched since (its stamp is older than `last_access`) under the newer stamp, and
returns the least recently used eligible node: exact LRU order, O(log n) per step,
independent of the tree's size. A node that becomes eligible again later (unlocked,
became a leaf) must be pushed again by whoever made it so.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from hicache_jax.tree.node import Node


class LeafLRU:
    def __init__(self):
        self._heap: list[tuple[int, int, Node]] = []  # (last_access, push order, node)
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, node: Node) -> None:
        heapq.heappush(self._heap, (node.last_access, next(self._order), node))

    def pop(self, eligible: Callable[[Node], bool]) -> Node | None:
        while self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if not eligible(node):
                continue
            if stamp != node.last_access:          # touched since: file it under its new time
                heapq.heappush(self._heap, (node.last_access, next(self._order), node))
                continue
            return node
        return None

    def entries(self) -> Iterable[tuple[int, Node]]:
        return ((stamp, node) for stamp, _, node in self._heap)

    def compact(self, live: Iterable[Node]) -> None:
        """Rebuild from the nodes that may be eligible, dropping every stale entry."""
        self._heap = [(n.last_access, next(self._order), n) for n in live]
        heapq.heapify(self._heap)


class LogicalClock:
    """Access times for LRU order: a counter, so equal work gives equal order on every TP rank."""

    def __init__(self):
        self._now = 0

    def tick(self) -> int:
        self._now += 1
        return self._now
