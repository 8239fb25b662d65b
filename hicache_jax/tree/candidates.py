"""`EvictionCandidates`: which nodes may give up pages now, least recently used first.

    device leaf    holds valid device pages, settled, unlocked, not owned by a load, and
                   no child holds device pages (device coverage stays a prefix)
    host leaf      host-only (HOST), unlocked, unowned, childless
    window holder  per window component: holds some of its device pages, settled, unlocked
                   and unowned; such a node may lose just those pages (an SWA
                   *tombstone*), keeping its anchor

*Settled*: no copy still has to read the node's device pages: DEVICE or SYNCED, or
BACKING_UP once its batch is dispatched (`copy_read`: every program reading them went
before any later device work). A BACKING_UP node evicted then becomes HOST_PENDING.

Whoever makes a node a candidate (a new node, an unlock, a child leaving, a completed
transfer) offers it here; `lru.py` keeps each order exact and lazy.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from hicache_jax.tree.components import Components
from hicache_jax.tree.lru import LeafLRU
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.state import DEVICE, HOLDS_DEVICE, Residency, TreeStateError

_SETTLED = frozenset({Residency.DEVICE, Residency.SYNCED})
_COMPACT_SLACK = 1024


class EvictionCandidates:
    def __init__(self, components: Components, num_nodes: Callable[[], int], all_nodes: Callable[[], Iterable[Node]],
                 copy_read: Callable[[Node], bool]):
        self._copy_read = copy_read       # its pending backup has read its device pages
        self._windows = components.windows
        self._num_nodes, self._all_nodes = num_nodes, all_nodes
        self._device, self._host = LeafLRU(), LeafLRU()
        self._window = {c.index: LeafLRU() for c in self._windows}
        self._window_lrus = [(c.index, self._window[c.index]) for c in self._windows]
        self._pushed = 0     # entries in the heaps, at most (pops are not counted: an upper bound)

    # -- who qualifies ---------------------------------------------------------------------
    def settled(self, node: Node) -> bool:
        return node.state in _SETTLED or (node.state is Residency.BACKING_UP and self._copy_read(node))

    def device_leaf(self, node: Node) -> bool:
        return (node.lock_ref == 0 and node.load_id is None and node.parent is not None and self.settled(node)
                and not any(c.state in HOLDS_DEVICE for c in node.children.values()))

    @staticmethod
    def host_leaf(node: Node) -> bool:
        return node.state is Residency.HOST and node.lock_ref == 0 and node.load_id is None and not node.children

    def window_holder(self, node: Node, component: int) -> bool:
        if node.lock_ref or node.load_id is not None or not self.settled(node):
            return False
        arr = node.pages[DEVICE][component]
        return arr is not None and bool((arr != ABSENT).any())

    # -- offering and taking ---------------------------------------------------------------
    def offer(self, node: Node) -> None:
        """(Re)enter `node` into every order it now qualifies for."""
        if node.parent is None or node.state is Residency.GONE:
            return
        if self.device_leaf(node):
            self._device.push(node)
            self._pushed += 1
        elif self.host_leaf(node):
            self._host.push(node)
            self._pushed += 1
        for index, lru in self._window_lrus:
            if self.window_holder(node, index):
                lru.push(node)
                self._pushed += 1
        if self._pushed > 6 * self._num_nodes() + _COMPACT_SLACK:   # mostly stale entries: rebuild
            self._compact()

    def pop_device(self) -> Node | None:
        return self._device.pop(self.device_leaf)

    def pop_host(self) -> Node | None:
        return self._host.pop(self.host_leaf)

    def pop_window(self, component: int) -> Node | None:
        return self._window[component].pop(lambda n: self.window_holder(n, component))

    def _compact(self) -> None:
        nodes = list(self._all_nodes())
        self._device.compact(n for n in nodes if self.device_leaf(n))
        self._host.compact(n for n in nodes if self.host_leaf(n))
        for index, lru in self._window_lrus:
            lru.compact(n for n in nodes if self.window_holder(n, index))
        self._pushed = len(self._device) + len(self._host) + sum(len(lru) for _, lru in self._window_lrus)

    def check(self, nodes: list[Node]) -> None:
        """Every candidate has an entry stamped no later than its last access (lru.py re-files)."""
        orders = [("device", self._device, self.device_leaf), ("host", self._host, self.host_leaf)]
        orders += [(c.name, self._window[c.index], lambda n, i=c.index: self.window_holder(n, i)) for c in self._windows]
        for what, lru, qualifies in orders:
            stamps = {n.id: s for s, n in sorted(lru.entries(), key=lambda e: e[0])}
            for n in nodes:
                if qualifies(n) and stamps.get(n.id, n.last_access + 1) > n.last_access:
                    raise TreeStateError(f"invariant violated: {n} is a {what} eviction candidate missing from its LRU")
