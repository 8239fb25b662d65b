"""Eviction: device LRU over device leaves, host LRU over host leaves, SWA tombstones,
subtree removal.

A *device leaf* holds valid device pages, is unlocked, not owned by a load, and no child
holds device pages. A *host leaf* is host-only (HOST), unlocked, unowned and childless.
Host eviction frees a node's pages on every pool at once: the anchor host pages (and with
them every kv-sidecar row) and its SWA host pages (and with them the state rows).
An *SWA tombstone* frees only the SWA device pages (and their state rows) of any unlocked
node, least recently used first, keeping its FULL pages: the SWA pool is the largest per
page, and a prefix boundary needs SWA data only in its trailing window.
"""
from __future__ import annotations

import numpy as np

from hicache_jax import validate
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.policy import DropReason, EvictResult, WritePolicy
from hicache_jax.tree.state import HOLDS_DEVICE, Event, Residency

_COMPACT_SLACK = 1024


class Eviction:
    def _device_evictable(self, node: Node) -> bool:
        return (node.state in (Residency.DEVICE, Residency.SYNCED) and node.lock_ref == 0
                and node.load_id is None and node.parent is not None
                and not any(c.state in HOLDS_DEVICE for c in node.children.values()))

    def _host_evictable(self, node: Node) -> bool:
        return (node.state is Residency.HOST and node.lock_ref == 0 and node.load_id is None
                and not node.children)

    def _swa_evictable(self, node: Node) -> bool:
        # not BACKING_UP: a queued backup still has to read its SWA pages
        return (node.state in (Residency.DEVICE, Residency.SYNCED) and node.lock_ref == 0
                and node.load_id is None and node.swa_device is not None
                and bool((node.swa_device != ABSENT).any()))

    def _offer_leaf(self, node: Node) -> None:
        """(Re)enter `node` into every LRU it is now a candidate of."""
        if node.parent is None or node.state is Residency.GONE:
            return
        if self._device_evictable(node):
            self.device_lru.push(node)
        elif self._host_evictable(node):
            self.host_lru.push(node)
        if self.swa is not None and self._swa_evictable(node):
            self.swa_lru.push(node)
        live = self.tree.num_nodes
        if len(self.device_lru) + len(self.host_lru) + len(self.swa_lru) > 6 * live + _COMPACT_SLACK:
            nodes = list(self.tree.nodes())
            self.device_lru.compact(n for n in nodes if self._device_evictable(n))
            self.host_lru.compact(n for n in nodes if self._host_evictable(n))
            self.swa_lru.compact(n for n in nodes if self.swa is not None and self._swa_evictable(n))

    # -- device tier -------------------------------------------------------------------------
    def evict_device(self, num_pages: int, swa_pages: int = 0) -> EvictResult:
        """Free at least `num_pages` anchor and `swa_pages` SWA device pages.

        Anchor pages come from LRU device leaves (with their SWA pages): a synced leaf just
        loses its device copy; an unbacked leaf is backed up and demoted under write-back
        (sets `needs_flush`), or else dropped and counted by reason. Any SWA pages still
        missing come from SWA tombstones, LRU first. Returns what was freed, which may be
        less when too little is evictable.
        """
        num_pages, swa_pages = validate.count("num_pages", num_pages), validate.count("swa_pages", swa_pages)
        freed = swa_freed = dropped = 0
        while freed < num_pages:
            node = self.device_lru.pop(self._device_evictable)
            if node is None:
                break
            parent = node.parent
            k, s = len(node.device), self._swa_count(node.swa_device)
            if node.state is Residency.DEVICE and not (
                    self.policy is WritePolicy.WRITE_BACK and self._commit_backup(node, lock=False)):
                reason = DropReason.HOST_PRESSURE if self.policy is WritePolicy.WRITE_BACK \
                    else DropReason.WRITE_THROUGH_UNBACKED_EVICTION
                dropped += len(node.tokens)
                self._count_drop(node, reason, s)
                self._remove_subtree(node)
            else:
                if node.state is Residency.BACKING_UP:   # write-back: committed just now, demoted now:
                    self.needs_flush = True              # dispatch before the pages are reused
                self._free_device_pages(node)
                node.apply(Event.EVICT_DEVICE)
                self._offer_leaf(node)
            self.events["device_evicted_tokens"] += k * self.page_size
            freed, swa_freed = freed + k, swa_freed + s
            self._offer_leaf(parent)
        while swa_freed < swa_pages:               # the rest of the SWA need: tombstones only
            node = self.swa_lru.pop(self._swa_evictable)
            if node is None:
                break
            swa_freed += self._tombstone_swa(node)
        return EvictResult(freed, swa_freed, dropped)

    def _tombstone_swa(self, node: Node) -> int:
        """Free `node`'s SWA device pages; its FULL pages and any SWA host copy stay."""
        present = node.swa_device != ABSENT
        self.device[self.swa].free(node.swa_device[present])
        node.swa_device[present] = ABSENT
        self.events["swa_tombstoned_pages"] += int(present.sum())
        self._offer_leaf(node)
        return int(present.sum())

    def _count_drop(self, node: Node, reason: str, swa_pages: int) -> None:
        self.dropped[reason] += len(node.tokens)
        if swa_pages:
            self.dropped_swa[reason] += swa_pages * self.page_size

    def _free_device_pages(self, node: Node) -> None:
        self.device[self.anchor].free(node.device)
        if node.swa_device is not None:
            present = node.swa_device[node.swa_device != ABSENT]
            if present.size:
                self.device[self.swa].free(present)
        node.device = node.swa_device = None

    @staticmethod
    def _swa_count(arr: np.ndarray | None) -> int:
        return 0 if arr is None else int((arr != ABSENT).sum())

    # -- host tier ---------------------------------------------------------------------------
    def evict_host(self, num_pages: int, swa_pages: int = 0) -> int:
        """Free at least `num_pages` anchor and `swa_pages` SWA host pages, LRU host leaves
        first, every pool of a node at once; returns anchor host pages freed."""
        num_pages, swa_pages = validate.count("num_pages", num_pages), validate.count("swa_pages", swa_pages)
        freed = swa_freed = 0
        while freed < num_pages or swa_freed < swa_pages:
            node = self.host_lru.pop(self._host_evictable)
            if node is None:
                break
            parent = node.parent
            freed += len(node.host)
            swa_freed += self._swa_count(node.swa_host)
            self.events["host_evicted_tokens"] += len(node.tokens)
            self._free_host_pages(node)
            node.apply(Event.EVICT_HOST)
            self._unlink(node)
            self._offer_leaf(parent)
        return freed

    # -- removal -----------------------------------------------------------------------------
    def _remove_subtree(self, node: Node) -> None:
        """Take `node` and everything below it out of the tree, freeing all their pages.

        Used when `node`'s data is gone (dropped or a failed demotion): what hangs below it
        is host-only and unreachable. Descendants' tokens count as host evictions; a
        descendant whose host copy is still in flight leaves its pages to that write.
        """
        parent = node.parent
        stack, order = [node], []
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):                         # children before parents
            if n.load_id is not None or n.state is Residency.BACKING_UP:
                raise AssertionError(f"bug: removing {n} with a transfer in flight")
            if n.write_id is not None:                    # its host copy is still being written:
                self._detach_write(n)                     # its pages are freed when that write ends
            if n is not node:
                self.events["host_evicted_tokens"] += len(n.tokens)
            if n.device is not None:
                self._free_device_pages(n)
            if n.host is not None:
                self._free_host_pages(n)
            n.apply(Event.DROP)
            self._unlink(n)
        self._offer_leaf(parent)

    def _unlink(self, node: Node) -> None:
        self.tree.remove(node)
        del self._by_id[node.id]
