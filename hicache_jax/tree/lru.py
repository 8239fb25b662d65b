"""Least-recently-used order over a changing set of candidates, as a lazy heap.

Each `push(node)` records `(node.last_access, node)`; `pop(eligible)` discards entries
that are stale (the node was touched again since) or whose node is not eligible now, and
returns the least recently used eligible node. A node that becomes eligible again later
(unlocked, became a leaf) must be pushed again by whoever made it so. Push and pop are
O(log n), independent of the tree's size; stale entries are dropped when the heap has
grown past twice the live count.
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
            if stamp == node.last_access and eligible(node):
                return node
        return None

    def entries(self) -> Iterable[tuple[int, Node]]:
        return ((stamp, node) for stamp, _, node in self._heap)

    def compact(self, live: Iterable[Node]) -> None:
        """Rebuild from the nodes that may be eligible, dropping every stale entry."""
        self._heap = [(n.last_access, next(self._order), n) for n in live]
        heapq.heapify(self._heap)
