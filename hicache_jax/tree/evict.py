"""Eviction from the host tier: host leaves go least recently used first, every component
at once (anchor pages and with them every kv-sidecar row, window pages and with them their
state rows). Device eviction: device_evict.py.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping


from hicache_jax import validate
from hicache_jax.tree.components import Components
from hicache_jax.tree.node import Node
from hicache_jax.tree.state import Event, Tier
from hicache_jax.tree.parts import TreeParts


def checked_need(components: Components, need: Mapping[str, int]) -> dict[str, int]:
    """Pages per allocator, every count checked before anything changes."""
    if not hasattr(need, "items"):
        raise ValueError(f"pages per allocator must be a mapping {{allocator: pages}}, got {need!r}")
    return {components[name].name: validate.count(f"pages of {name!r}", n) for name, n in need.items()}


class HostEviction:
    def __init__(self, parts: TreeParts):
        self._components, self._ledger, self._candidates = parts.components, parts.ledger, parts.candidates
        self._pruner, self._stats = parts.pruner, parts.stats
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
