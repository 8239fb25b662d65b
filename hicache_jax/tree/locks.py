"""`LockTable`: path locks that pin prefixes on the device.

A lock on a node pins it and every ancestor: `node.lock_ref` counts the locks held on it
or below it, so "may this node be evicted" is one field read. Requests hold locks on the
prefixes they use; the tree's own transfers hold them on what they read or fill. When a
node's count drops to zero it may be evictable again: `on_unpinned` is told.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from hicache_jax.tree.node import Node
from hicache_jax.tree.results import LockId
from hicache_jax.tree.state import TreeStateError


class LockTable:
    def __init__(self, on_unpinned: Callable[[Node], None]):
        self._locks: dict[int, Node] = {}
        self._next = 1
        self._on_unpinned = on_unpinned

    def lock(self, node: Node) -> LockId:
        """Pin `node` and its ancestors until `unlock` (the caller decides whether it may)."""
        lock = LockId(self._next)
        self._next += 1
        self._locks[lock.value] = node
        for n in node.path_to_root():
            n.lock_ref += 1
        return lock

    def unlock(self, lock: LockId) -> None:
        node = self._locks.pop(lock.value, None) if isinstance(lock, LockId) else None
        if node is None:
            raise ValueError(f"{lock!r} is not a held lock")
        for n in node.path_to_root():
            n.lock_ref -= 1
            if n.lock_ref < 0:
                raise TreeStateError(f"bug: negative lock count on {n}")
            if n.lock_ref == 0:
                self._on_unpinned(n)

    def __len__(self) -> int:
        return len(self._locks)

    def pinned(self) -> Iterator[Node]:
        """Every node some lock pins, once each."""
        seen: set[int] = set()
        for holder in self._locks.values():
            for n in holder.path_to_root():
                if n.id in seen:
                    break            # its ancestors were counted with it
                seen.add(n.id)
                yield n

    def check(self, nodes: Iterable[Node]) -> None:
        """Each node's count equals the locks held on it or below it."""
        expected = Counter(n.id for holder in self._locks.values() for n in holder.path_to_root())
        for n in nodes:
            if n.lock_ref != expected[n.id]:
                raise TreeStateError(f"invariant violated: {n}: lock count {n.lock_ref}, "
                                     f"locks held below it {expected[n.id]}")
