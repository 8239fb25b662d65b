"""The write path (device -> host): hit-driven and eviction-driven backups, acks, failures.

A backup is *committed* (host pages allocated, node BACKING_UP, a device lock taken, an ack
id stamped) long before its bytes exist on the host: commits are queued so that every
backup of one step merges into one transfer (`take_backup_batch`). The ack id is cleared
only by `ack_backup` / `fail_backup` with that id, also on the halves of a node split
after the commit. Write-back demotes an evicted node at once (HOST_PENDING, device pages
freed): its queued gather must be dispatched before those pages are written again, which
`needs_flush` signals to the caller.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hicache_jax.plan import Direction, make_plan
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.policy import BackupBatch, DropReason, LockId, WritePolicy
from hicache_jax.tree.state import Event, Residency


@dataclasses.dataclass(frozen=True)
class _Copy:
    """One queued node copy, per page of the node: anchor pages and SWA pages (ABSENT where none)."""

    device: np.ndarray        # i32[k]
    host: np.ndarray          # i32[k]
    swa_device: np.ndarray    # i32[k]
    swa_host: np.ndarray      # i32[k]

    def split(self, k: int) -> tuple["_Copy", "_Copy"]:
        head = _Copy(*(a[:k] for a in dataclasses.astuple(self)))
        return head, _Copy(*(a[k:] for a in dataclasses.astuple(self)))


@dataclasses.dataclass
class _Write:
    """One in-flight (or queued) backup batch."""

    nodes: set[Node]                # nodes stamped with this ack id (split halves included)
    locks: list[LockId]             # one device lock per committed node, released at the end
    zombie_host: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # freed at the end


class WritePath:
    def _init_write_path(self) -> None:
        self._open_ack = 1
        self._writes: dict[int, _Write] = {}
        # the open batch: per committed node, the pages its copy reads and writes, captured at
        # commit (a write-back demotion frees the device pages before the batch is taken)
        self._queue: dict[Node, _Copy] = {}
        self.needs_flush = False

    # -- committing ------------------------------------------------------------------------
    def _on_hit(self, node: Node) -> None:
        t = self.write_threshold
        if t is not None and node.state is Residency.DEVICE and node.hit_count >= t:
            self.backup(node)

    def backup(self, node: Node) -> bool:
        """Commit a backup of `node`; under write-through first of its unbacked ancestors,
        root side first, so the backed-up set stays closed under "parent". False (and the
        node stays unbacked) when the host has no room even after one reclaim."""
        chain = [node] if self.policy is WritePolicy.WRITE_BACK else list(node.path_to_root())[::-1]
        for n in chain:
            if n.state is Residency.DEVICE and not self._commit_backup(n):
                return False
        return True

    def _commit_backup(self, node: Node, lock: bool = True) -> bool:
        """Allocate host pages for `node` on every pool and queue its copy; False if no room.

        `lock`: pin the node on device until the ack (its pages must survive until the
        queued gather is dispatched); a write-back demotion frees them at once instead.
        """
        k = len(node.device)
        swa_dev = node.swa_device if node.swa_device is not None else np.full(k, ABSENT, np.int32)
        has_swa = swa_dev != ABSENT
        need = {self.anchor: k}
        if self.swa is not None:
            need[self.swa] = int(has_swa.sum())
        got = self.host.resolve(need, reclaim=self._reclaim_host)
        if got is None:
            self.events["backup_no_host_space"] += 1
            return False
        node.host = got.get(self.anchor)
        swa_host = np.full(k, ABSENT, np.int32)
        if self.swa is not None:
            swa_host[has_swa] = got.get(self.swa)
            node.swa_host = swa_host.copy()
        node.apply(Event.COMMIT_BACKUP)
        node.write_id = self._open_ack
        write = self._writes.setdefault(self._open_ack, _Write(set(), []))
        write.nodes.add(node)
        if lock:
            write.locks.append(self._lock(node))
        self._queue[node] = _Copy(node.device.copy(), node.host.copy(), swa_dev.copy(), swa_host)
        return True

    def _split_queued(self, head: Node, node: Node, k: int) -> None:
        """A queued node was split after `k` pages: each half keeps its share of the copy."""
        copy = self._queue.pop(node, None)
        if copy is not None:
            self._queue[head], self._queue[node] = copy.split(k)

    def _reclaim_host(self, short: dict[str, int]) -> None:
        self.evict_host(short.get(self.anchor, 0), short.get(self.swa, 0) if self.swa else 0)

    def take_backup_batch(self) -> BackupBatch | None:
        """Close the queued commits into one transfer (None when nothing is queued)."""
        if not self._queue:
            write = self._writes.get(self._open_ack)
            if write is not None and not write.nodes:   # every copy was dropped before dispatch:
                del self._writes[self._open_ack]        # release the locks they held
                for lock in write.locks:
                    self.unlock(lock)
            return None
        dev, host, sdev, shost = (np.concatenate(parts) for parts in zip(*map(dataclasses.astuple, self._queue.values())))
        pages = {self.anchor: (dev, host)}
        if (sdev != ABSENT).any():
            pages[self.swa] = (sdev[sdev != ABSENT], shost[sdev != ABSENT])
        plan = make_plan(self.layout, Direction.BACKUP, pages)
        batch = BackupBatch(self._open_ack, plan, int(dev.size) * self.page_size)
        self._queue.clear()
        self._open_ack += 1
        self.needs_flush = False
        return batch

    def pending_acks(self) -> list[int]:
        """Ack ids of dispatched batches not yet acknowledged or failed."""
        return sorted(a for a in self._writes if a != self._open_ack)

    # -- completion --------------------------------------------------------------------------
    def ack_backup(self, ack_id: int) -> None:
        """The host copy of batch `ack_id` is durable."""
        write = self._pop_write(ack_id)
        for node in write.nodes:
            node.write_id = None
            node.apply(Event.ACK)
        self._end_write(write)

    def fail_backup(self, ack_id: int) -> None:
        """Batch `ack_id` raised: its host pages are freed; write-back nodes already demoted
        lost their only copy and leave the tree (counted as dropped, reason backup_failed)."""
        write = self._pop_write(ack_id)
        failed = []
        nodes = sorted(write.nodes, key=self.tree.prefix_len)   # parents first
        for node in nodes:
            node.write_id = None
        for node in nodes:
            if node.state is Residency.GONE:      # went with an ancestor's subtree
                continue
            if node.state is Residency.HOST_PENDING:
                self._count_drop(node, DropReason.BACKUP_FAILED, self._swa_count(node.swa_host))
                self._remove_subtree(node)
            else:
                self._free_host_pages(node)
                node.apply(Event.BACKUP_FAILED)
                failed.append(node)
        if self.policy is not WritePolicy.WRITE_BACK:
            for node in failed:
                for child in list(node.children.values()):
                    self._unback_subtree(child)
        self.events["backup_failed"] += 1
        self._end_write(write)

    def _pop_write(self, ack_id: int) -> _Write:
        if ack_id == self._open_ack or ack_id not in self._writes:
            raise ValueError(f"no backup in flight with ack id {ack_id} (in flight: {self.pending_acks()})")
        return self._writes.pop(ack_id)

    def _end_write(self, write: _Write) -> None:
        for allocator, pages in write.zombie_host.items():
            self.host[allocator].free(np.asarray(pages))
        for lock in write.locks:
            self.unlock(lock)
        for node in write.nodes:
            if node.state is not Residency.GONE:
                self._offer_leaf(node)

    def _detach_write(self, node: Node) -> None:
        """`node` leaves its pending write: its queued copy is dropped, or, once dispatched,
        its host pages are freed when the write ends."""
        write = self._writes[node.write_id]
        write.nodes.discard(node)
        dispatched = self._queue.pop(node, None) is None
        for allocator, pages in self._host_pages(node).items():
            if dispatched:             # its DMA may still land there: free when the write ends
                write.zombie_host.setdefault(allocator, []).extend(pages.tolist())
            else:                      # never dispatched: nothing will touch them
                self.host[allocator].free(pages)
        node.host = node.swa_host = None
        node.write_id = None

    def _unback_subtree(self, node: Node) -> None:
        """Write-through closure after an ancestor's backup failed: no host copy below it."""
        st = node.state
        if st is Residency.DEVICE:
            pass
        elif st is Residency.BACKING_UP:             # its own DMA is in flight: free at its end
            self._detach_write(node)
            node.apply(Event.BACKUP_FAILED)
        elif st is Residency.SYNCED:
            self._free_host_pages(node)
            node.apply(Event.DROP_HOST)
        elif st is Residency.LOADING:                # being read: drop the host copy when it lands
            self._loads[node.load_id].drop_host.add(node)
        elif st is Residency.HOST:                   # host-only below an unbacked node: drop it
            self._remove_subtree(node)
            return
        for child in list(node.children.values()):
            self._unback_subtree(child)

    def _host_pages(self, node: Node) -> dict[str, np.ndarray]:
        out = {self.anchor: node.host}
        if self.swa is not None and node.swa_host is not None:
            out[self.swa] = node.swa_host[node.swa_host != ABSENT]
        return out

    def _free_host_pages(self, node: Node) -> None:
        for allocator, pages in self._host_pages(node).items():
            self.host[allocator].free(pages)
        node.host = node.swa_host = None
