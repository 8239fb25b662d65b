"""`Pruner`: taking nodes out of the tree, with every page they hold.

A node leaves the tree when its data is gone: evicted from the last tier, dropped, or
its only copy failed. What hangs below a removed node is host-only and unreachable, so
the whole subtree goes; a descendant whose host copy is still being written leaves its
host pages to that write (retired until it ends).
"""
from __future__ import annotations

from hicache_jax.tree.book import TransferBook
from hicache_jax.tree.candidates import EvictionCandidates
from hicache_jax.tree.ledger import PageLedger
from hicache_jax.tree.node import Node
from hicache_jax.tree.radix import RadixTree
from hicache_jax.tree.results import TreeStats
from hicache_jax.tree.state import Event, Residency, Tier, TreeStateError


class Pruner:
    def __init__(self, tree: RadixTree, ledger: PageLedger, book: TransferBook, candidates: EvictionCandidates,
                 stats: TreeStats):
        self._tree, self._ledger, self._book, self._candidates, self._stats = tree, ledger, book, candidates, stats

    def leave_write(self, node: Node) -> None:
        """`node` gives up its host copy while a write to it is pending (see `TransferBook.leave_write`)."""
        retired = self._book.leave_write(node)
        if retired is None:
            self._ledger.drop(node, Tier.HOST)
        else:
            self._ledger.retire(node, Tier.HOST, retired)

    def remove_subtree(self, node: Node) -> None:
        """Take `node` and everything below it out of the tree, freeing all their pages.
        Descendants' tokens count as host evictions."""
        parent = node.parent
        stack, order = [node], []
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):                         # children before parents
            if n.load_id is not None or n.state is Residency.BACKING_UP:
                raise TreeStateError(f"bug: removing {n} with a transfer in flight")
            if n.write_id is not None:                    # its host copy is still being written
                self.leave_write(n)
            if n is not node:
                self._stats.evicted[Tier.HOST] += len(n.tokens)
            for tier in Tier:
                self._ledger.drop(n, tier)
            n.apply(Event.DROP)
            self._tree.remove(n)
        self._candidates.offer(parent)

    def unlink(self, node: Node) -> None:
        """Remove a node that holds no pages any more (evicted from its last tier)."""
        parent = node.parent
        self._tree.remove(node)
        self._candidates.offer(parent)
