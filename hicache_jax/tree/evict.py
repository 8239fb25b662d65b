"""Eviction from each tier: device leaves (and window tombstones), host leaves.

Device: anchor pages come from least recently used device leaves, with every component's
pages: a synced leaf just loses its device copy; an unbacked one is demoted under
write-back (its backup queued, see `WritePath.demote`) or else dropped and counted by
reason. Window pages still missing after that come from *tombstones*: a node gives up its
device pages of that window component (least recently used first) and keeps its anchor
pages, because a prefix boundary needs window pages only in its trailing window.

Host: host leaves go least recently used first, every component at once (anchor pages
and with them every kv-sidecar row, window pages and with them their state rows).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from hicache_jax import validate
from hicache_jax.tree.candidates import EvictionCandidates
from hicache_jax.tree.components import Components
from hicache_jax.tree.ledger import PageLedger
from hicache_jax.tree.node import Node
from hicache_jax.tree.policy import WritePolicy
from hicache_jax.tree.prune import Pruner
from hicache_jax.tree.results import EvictResult, TreeStats
from hicache_jax.tree.state import Event, Residency, Tier
from hicache_jax.tree.writes import WritePath


def checked_need(components: Components, need: Mapping[str, int]) -> dict[str, int]:
    """Pages per allocator, every count checked before anything changes."""
    if not hasattr(need, "items"):
        raise ValueError(f"pages per allocator must be a mapping {{allocator: pages}}, got {need!r}")
    return {components[name].name: validate.count(f"pages of {name!r}", n) for name, n in need.items()}


class HostEviction:
    def __init__(self, components: Components, ledger: PageLedger, candidates: EvictionCandidates, pruner: Pruner,
                 stats: TreeStats):
        self._components, self._ledger, self._candidates = components, ledger, candidates
        self._pruner, self._stats = pruner, stats
        self.before_evict: list[Callable[[Node], None]] = []   # told of each node before its pages go

    def evict(self, need: Mapping[str, int]) -> int:
        """Free at least `need[allocator]` host pages of each allocator, least recently used
        host leaves first, every component of a leaf at once; returns anchor pages freed."""
        need = checked_need(self._components, need)
        freed = dict.fromkeys(need, 0)
        anchor = self._components.anchor.name
        freed.setdefault(anchor, 0)
        while any(freed[a] < n for a, n in need.items()):
            node = self._candidates.pop_host()
            if node is None:
                break
            for c in self._components:
                if c.name in freed:
                    freed[c.name] += node.present(Tier.HOST, c.index)
            self._stats.evicted[Tier.HOST] += len(node.tokens)
            for hook in self.before_evict:
                hook(node)
            self._ledger.drop(node, Tier.HOST)
            node.apply(Event.EVICT_HOST)
            self._pruner.unlink(node)
        return freed[anchor]


class DeviceEviction:
    def __init__(self, components: Components, policy: WritePolicy, ledger: PageLedger,
                 candidates: EvictionCandidates, writes: WritePath, pruner: Pruner, stats: TreeStats, page_size: int):
        self._components, self._policy, self._ledger = components, policy, ledger
        self._candidates, self._writes, self._pruner, self._stats = candidates, writes, pruner, stats
        self._page_size = page_size

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
