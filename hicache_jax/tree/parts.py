"""`TreeParts`: the state every path of the tree works on, handed to each as one object.

The tree core builds these once; the read, write, prefetch, insert and eviction paths each
take the parts they share through this instead of a dozen constructor arguments. Each part
still owns its own state and invariants (core.py lists them).
"""
from __future__ import annotations

import dataclasses

from hicache_jax.layout import PoolLayout
from hicache_jax.tree.book import TransferBook
from hicache_jax.tree.candidates import EvictionCandidates
from hicache_jax.tree.components import Components
from hicache_jax.tree.ledger import PageLedger
from hicache_jax.tree.locks import LockTable
from hicache_jax.tree.lru import LogicalClock
from hicache_jax.tree.policy import WritePolicy
from hicache_jax.tree.prune import Pruner
from hicache_jax.tree.radix import RadixTree
from hicache_jax.tree.results import TreeStats


@dataclasses.dataclass(frozen=True)
class TreeParts:
    layout: PoolLayout
    components: Components
    policy: WritePolicy
    tree: RadixTree
    ledger: PageLedger          # every page of every allocator on every tier
    book: TransferBook          # transfers in flight and the backup queue
    locks: LockTable
    candidates: EvictionCandidates
    pruner: Pruner
    clock: LogicalClock
    stats: TreeStats

    @property
    def page_size(self) -> int:
        return self.layout.page_size
