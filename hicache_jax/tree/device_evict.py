"""Eviction from the device tier: device leaves (and window tombstones).

Anchor pages come from least recently used device leaves, with every component's pages: a
synced leaf just loses its device copy; an unbacked one is demoted under write-back (its
backup queued, see `WritePath.demote`) or else dropped and counted by reason. Window pages
still missing after that come from *tombstones*: a node gives up its device pages of that
window component (least recently used first) and keeps its anchor pages, because a prefix
boundary needs window pages only in its trailing window.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hicache_jax.tree.evict import checked_need
from hicache_jax.tree.results import EvictResult
from hicache_jax.tree.state import Event, Residency, Tier
from hicache_jax.tree.parts import TreeParts
from hicache_jax.tree.writes import WritePath


class DeviceEviction:
    def __init__(self, parts: TreeParts, writes: WritePath):
        self._components, self._policy, self._ledger = parts.components, parts.policy, parts.ledger
        self._candidates, self._writes, self._pruner, self._stats = parts.candidates, writes, parts.pruner, parts.stats
        self._locks = parts.locks
        self._page_size = parts.page_size

    def room(self) -> dict[str, int]:
        """Per allocator, the device pages a request could get now (see `PageLedger.room`)."""
        return self._ledger.room(self._locks.pinned())

    def take(self, need: dict[str, int]) -> dict[str, np.ndarray] | None:
        """`need` free device pages, evicting only when that can succeed (else None, nothing evicted)."""
        free = self._ledger.allocators(Tier.DEVICE)
        if any(n > free[a].num_free for a, n in need.items()):
            room = self.room()
            if any(n > room[a] for a, n in need.items()):
                return None
        return self._ledger.take(Tier.DEVICE, need, reclaim=self.evict)

    def evict(self, need: Mapping[str, int]) -> EvictResult:
        """Free at least `need[allocator]` device pages of each allocator (see the module
        docstring). Returns what was freed, which may be less when too little is evictable."""
        need = checked_need(self._components, need)
        freed = {c.index: 0 for c in self._components}
        anchor = self._components.anchor
        dropped = 0
        while freed[0] < need.get(anchor.name, 0):
            node = self._candidates.pop_device()
            if node is None:
                break
            parent = node.parent
            for c in self._components:
                freed[c.index] += node.present(Tier.DEVICE, c.index)
            self._stats.evicted[Tier.DEVICE] += len(node.tokens)
            if node.state is Residency.DEVICE and not (self._policy.backs_up_on_eviction and self._writes.demote(node)):
                dropped += len(node.tokens)
                self._writes.count_drop(node, self._policy.drop_reason, Tier.DEVICE)
                self._pruner.remove_subtree(node)
            else:
                self._ledger.drop(node, Tier.DEVICE)
                node.apply(Event.EVICT_DEVICE)
                self._candidates.offer(node)
            self._candidates.offer(parent)
        for c in self._components.windows:    # the rest of each window need: tombstones only
            while freed[c.index] < need.get(c.name, 0):
                node = self._candidates.pop_window(c.index)
                if node is None:
                    break
                n = self._ledger.drop_window(node, Tier.DEVICE, c.index)
                self._stats.tombstoned[c.name] += n
                freed[c.index] += n
                self._candidates.offer(node)
        return EvictResult(freed[0], sum(freed[c.index] for c in self._components.windows), dropped)
