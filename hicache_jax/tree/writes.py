"""`WritePath` (device -> host): hit-driven and eviction-driven backups, acks, failures.

A backup is *committed* (host pages allocated, node BACKING_UP, an ack id stamped) long
before its bytes exist on the host: commits are queued in the `TransferBook` so that every
backup of one step merges into one transfer (`take_backup_batch`). A committed node stays
locked on device until its batch is dispatched (`backup_read`: the programs that read its
pages are then ahead of any later device work), and may be evicted after that, before the
ack (it waits on the host as HOST_PENDING). A write-back *demotion* frees the device pages
at once (HOST_PENDING), so its queued copy must be dispatched before those pages are
written again, which `needs_flush` signals to the caller.
"""
from __future__ import annotations


import numpy as np

from hicache_jax.plan import Direction, make_plan
from hicache_jax.tree.book import Copy
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.results import AckId, BackupBatch, DropReason
from hicache_jax.tree.evict import HostEviction
from hicache_jax.tree.parts import TreeParts
from hicache_jax.tree.state import HOLDS_HOST, Event, Residency, Tier, TreeStateError


class WritePath:
    def __init__(self, parts: TreeParts, host_eviction: HostEviction):
        self._layout, self._components, self._policy, self._tree = parts.layout, parts.components, parts.policy, parts.tree
        self._ledger, self._book, self._locks, self._candidates = parts.ledger, parts.book, parts.locks, parts.candidates
        self._pruner, self._stats, self._reclaim_host = parts.pruner, parts.stats, host_eviction.evict
        self.needs_flush = False      # a demotion is queued: dispatch before its device pages are reused

    # -- committing ------------------------------------------------------------------------
    def on_hit(self, node: Node) -> None:
        if node.state is Residency.DEVICE and self._policy.backs_up_on_hit(node.hit_count):
            self.backup(node)

    def backup(self, node: Node) -> bool:
        """Commit a backup of `node`; under write-through first of its unbacked ancestors,
        root side first, so the backed-up set stays closed under "parent". False (and the
        node stays unbacked) when the host has no room even after one reclaim."""
        chain = list(node.path_to_root())[::-1] if self._policy.closed_under_parent else [node]
        return all(n.state is not Residency.DEVICE or self._commit(n, lock=True) for n in chain)

    def demote(self, node: Node) -> bool:
        """Write-back eviction of an unbacked leaf: commit its backup without a lock (the
        caller frees its device pages right after); False when the host has no room."""
        if not self._commit(node, lock=False):
            return False
        self.needs_flush = True
        return True

    def _commit(self, node: Node, lock: bool) -> bool:
        """Allocate host pages for `node` on every component and queue its copy."""
        device = node.pages[Tier.DEVICE]
        need = {self._components.anchor.name: device[0].size}
        masks = {}
        for c in self._components.windows:
            masks[c.index] = device[c.index] != ABSENT
            need[c.name] = int(np.count_nonzero(masks[c.index]))
        got = self._ledger.take(Tier.HOST, need, reclaim=self._reclaim_host)
        if got is None:
            self._stats.backups_without_room += 1
            return False
        self._ledger.attach(node, Tier.HOST, got[self._components.anchor.name])
        host = node.pages[Tier.HOST]
        for c in self._components.windows:
            host[c.index][masks[c.index]] = got[c.name]
        node.apply(Event.COMMIT_BACKUP)
        copy = Copy(tuple(a.copy() for a in device), tuple(a.copy() for a in host))
        self._book.queue_write(node, copy, self._locks.lock(node) if lock else None)
        return True

    def take_backup_batch(self) -> BackupBatch | None:
        """Close the queued commits into one transfer (None when nothing is queued)."""
        taken = self._book.take_queue()
        if taken is None:
            for lock in self._book.discard_empty_open():   # every copy was dropped before dispatch
                self._locks.unlock(lock)
            return None
        ack, queued = taken
        copies = [cp for _, cp in queued]
        pages, starts = {}, {}
        for c in self._components:
            dev = np.concatenate([cp.device[c.index] for cp in copies])
            host = np.concatenate([cp.host[c.index] for cp in copies])
            if c.is_window:
                keep = dev != ABSENT
                dev, host = dev[keep], host[keep]
            if dev.size or not c.is_window:
                pages[c.name], starts[c.name] = (dev, host), _block_starts(queued, c)
        self.needs_flush = False
        full = pages[self._components.anchor.name][0].size
        plan = make_plan(self._layout, Direction.BACKUP, pages, validate=False, run_starts=starts)
        return BackupBatch(ack, plan, full * self._layout.page_size)

    # -- completion --------------------------------------------------------------------------
    def backup_read(self, ack: AckId) -> None:
        """Batch `ack`'s copies have read their device pages: release its locks, so that its
        nodes may be evicted (`EvictionCandidates.settled`)."""
        for lock in self._book.mark_read(ack):
            self._locks.unlock(lock)      # (the nodes it unpins are offered as candidates)

    def ack_backup(self, ack: AckId) -> list[Node]:
        """The host copy of batch `ack` is durable; returns the nodes whose copy it wrote."""
        record = self._book.end_write(ack)
        for node in record.nodes:
            node.apply(Event.ACK)
        self._end(record)
        return [n for n in record.nodes if n.state is not Residency.GONE]

    def fail_backup(self, ack: AckId) -> None:
        """Batch `ack` raised: its host pages are freed; write-back nodes already demoted
        lost their only copy and leave the tree (counted as dropped, reason backup_failed)."""
        record = self._book.end_write(ack)
        failed = []
        for node in sorted(record.nodes, key=self._tree.prefix_len):   # parents first
            if node.state is Residency.GONE:      # went with an ancestor's subtree
                continue
            if node.state is Residency.HOST_PENDING:
                self.count_drop(node, DropReason.BACKUP_FAILED, Tier.HOST)
                self._pruner.remove_subtree(node)
            else:
                self._ledger.drop(node, Tier.HOST)
                node.apply(Event.BACKUP_FAILED)
                failed.append(node)
        if self._policy.closed_under_parent:
            for node in failed:
                for child in list(node.children.values()):
                    self._unback_subtree(child)
        self._stats.backups_failed += 1
        self._end(record)

    def count_drop(self, node: Node, reason: DropReason, tier: Tier) -> None:
        """`node`'s data is destroyed without another copy: its tokens, per component (window
        components count the tokens of their pages present on `tier`)."""
        page = self._layout.page_size
        for c in self._components:
            tokens = len(node.tokens) if c.index == 0 else node.present(tier, c.index) * page
            if tokens:
                self._stats.dropped[(c.name, reason)] += tokens

    def _end(self, record) -> None:
        for allocator, pages in record.retired.items():
            self._ledger.free(Tier.HOST, allocator, np.asarray(pages))
        for lock in record.locks:
            self._locks.unlock(lock)
        for node in record.nodes:
            if node.state is not Residency.GONE:
                self._candidates.offer(node)

    def _unback_subtree(self, node: Node) -> None:
        """Write-through closure after an ancestor's backup failed: no host copy below it."""
        st = node.state
        if st is Residency.BACKING_UP:               # its own copy is in flight
            self._pruner.leave_write(node)
            node.apply(Event.BACKUP_FAILED)
        elif st is Residency.SYNCED:
            self._ledger.drop(node, Tier.HOST)
            node.apply(Event.DROP_HOST)
        elif st is Residency.LOADING:                # being read: drop the host copy when it lands
            self._book.load(node.load_id).drop_host.add(node)
        elif st in (Residency.HOST, Residency.HOST_PENDING):   # host-only below an unbacked node: unreachable
            self._pruner.remove_subtree(node)
            return
        for child in list(node.children.values()):
            self._unback_subtree(child)

    def check(self, nodes: list[Node]) -> None:
        """Write-through policies: every node with a durable host copy has a parent with one."""
        if not self._policy.closed_under_parent:
            return
        for n in nodes:
            parent = n.parent
            if (n.state in HOLDS_HOST and n.load_id is None and parent.parent is not None
                    and parent.state not in HOLDS_HOST):
                raise TreeStateError(f"invariant violated: write-through closure: {n} is backed up, "
                                     f"its parent {parent} is not")


def _block_starts(queued, component) -> np.ndarray:
    """The host pages where a backup batch's host blocks must start (`make_plan`'s
    `run_starts`): the first page of each node whose pages follow, on the host, those of a
    node that is neither its parent nor its child. Prompts evicted together so keep blocks of
    their own (a later hit on one moves whole blocks), while a conversation's turns demoted
    together stay one block (the next turn's hit moves it whole)."""
    spans = []
    for node, cp in queued:
        host = cp.host[component.index]
        mine = host[cp.device[component.index] != ABSENT] if component.is_window else host
        if mine.size:
            spans.append((int(mine.min()), int(mine.max()), node))
    spans.sort(key=lambda s: s[0])
    return np.array([lo for (_, hi_prev, prev), (lo, _, node) in zip(spans, spans[1:])
                     if lo == hi_prev + 1 and node.parent is not prev and prev.parent is not node], np.int64)
