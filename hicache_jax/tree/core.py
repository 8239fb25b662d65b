"""`TreeCore`: the control plane of one cache, as a coordinator of collaborators.

Pure Python + numpy; never imports jax. It decides which pages move and records every
page's owner; the data plane only ever sees the `TransferPlan`s it hands out. Each
concept owns its state and its invariants:

    RadixTree            nodes by token prefix and by id; splits (radix.py)
    PageLedger           every page of every allocator on every tier (ledger.py)
    LockTable            path locks pinning prefixes on device (locks.py)
    TransferBook         backups and load-backs in flight, the backup queue (book.py)
    EvictionCandidates   LRU orders of evictable nodes (candidates.py)
    Matcher / Inserter   the read and write of token prefixes (matcher.py, insert.py)
    WritePath / ReadPath device -> host backups, host -> device loads (writes.py, loads.py)
    DeviceEviction / HostEviction, Pruner   making room, removing nodes (evict.py, prune.py)

Components (one per allocator, from the layout) and tiers (device, host) are sequences
those loop over. All methods are synchronous and cheap; a transfer's end is applied by
`ack_backup` / `fail_backup` / `finish_load` / `fail_load`, the one place where in-flight
state ends.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hicache_jax.layout import PoolLayout
from hicache_jax.tree.book import TransferBook
from hicache_jax.tree.candidates import EvictionCandidates
from hicache_jax.tree.components import Components
from hicache_jax.tree.device_evict import DeviceEviction
from hicache_jax.tree.evict import HostEviction, checked_need
from hicache_jax.tree.insert import Inserter
from hicache_jax.tree.invariants import check_nodes
from hicache_jax.tree.ledger import PageLedger
from hicache_jax.tree.loads import LoadCost, ReadPath
from hicache_jax.tree.locks import LockTable
from hicache_jax.tree.lru import LogicalClock
from hicache_jax.tree.match import MatchResult, as_tokens
from hicache_jax.tree.matcher import Matcher
from hicache_jax.tree.parts import TreeParts
from hicache_jax.tree.node import Node, NodeId
from hicache_jax.tree.policy import WritePolicy
from hicache_jax.tree.prefetch import PrefetchPath
from hicache_jax.tree.prune import Pruner
from hicache_jax.tree.radix import RadixTree
from hicache_jax.tree.results import (AckId, BackupBatch, EvictResult, HostCopy, InsertResult, LoadId, LoadJob, LockId,
                                      PrefetchId, PrefetchJob, PrefetchOutcome, Refusal, TransferId, TreeStats)
from hicache_jax.tree.state import HOLDS_DEVICE, Tier
from hicache_jax.tree.writes import WritePath


class TreeCore:
    """Radix tree + pages of one cache (see module docstring)."""

    def __init__(self, layout: PoolLayout, *, device_pages: Mapping[str, int], host_pages: Mapping[str, int],
                 write_policy: str = "write_through", write_threshold: int | None = None,
                 load_back_threshold: int = 10, load_cost: LoadCost = LoadCost(), prefetch_share: float = 0.5):
        self.layout = layout
        self.components = comps = Components.from_layout(layout)
        self.policy = WritePolicy.create(write_policy, write_threshold, host=any(host_pages.values()))
        self.stats = stats = TreeStats()
        self.tree = tree = RadixTree(layout.page_size, len(comps))
        self.ledger = ledger = PageLedger(layout, comps, {Tier.DEVICE: device_pages, Tier.HOST: host_pages})
        self.book = book = TransferBook()
        self.candidates = cands = EvictionCandidates(comps, lambda: tree.num_nodes, tree.nodes, book.copy_read)
        self.locks = locks = LockTable(on_unpinned=cands.offer)
        tree.on_split += [book.on_split, lambda head, node, k: cands.offer(head)]
        clock = LogicalClock()
        parts = TreeParts(layout, comps, self.policy, tree, ledger, book, locks, cands,
                          Pruner(tree, ledger, book, cands, stats), clock, stats)
        self._host_eviction = HostEviction(parts)
        self._writes = WritePath(parts, self._host_eviction)
        self._device_eviction = DeviceEviction(parts, self._writes)
        self._matcher = Matcher(tree, comps, clock)
        self._inserter = Inserter(parts, self._writes)
        self._reads = ReadPath(parts, self._matcher, self._device_eviction, load_back_threshold, load_cost)
        self._fill = PrefetchPath(parts, self._host_eviction, prefetch_share)

    @property
    def anchor(self) -> str:
        return self.components.anchor.name

    def node(self, node_id: NodeId) -> Node:
        return self.tree.node(node_id)

    # -- prefixes --------------------------------------------------------------------------
    def match_prefix(self, tokens, touch: bool = True) -> MatchResult:
        """Longest usable prefix of `tokens` on device, and how much more the host has (see
        matcher.py); `touch=False` leaves the LRU as it was."""
        return self._matcher.match(tokens, touch)

    def loads_along(self, tokens) -> set[LoadId]:
        """The loads in flight owning a node along `tokens`' path (whose landing would change
        its match); changes nothing."""
        return self._matcher.loads_along(tokens)

    def insert(self, tokens, device_pages, window_pages: Mapping[str, Mapping[int, int]] | None = None) -> InsertResult:
        """Give a request's computed pages to the tree (see `Inserter.insert`)."""
        return self._inserter.insert(tokens, device_pages, window_pages)

    def retract(self, tokens: np.ndarray, device_pages: np.ndarray, window: str | None,
                window_pages: Mapping[int, int]) -> int:
        """A request leaves mid-flight: its whole pages go to the tree (with the pages of
        `window` it holds for them, `window_pages` {logical page: device page}), its other
        held pages are freed; returns the length to resume from (`HiCache.retract`)."""
        whole = len(tokens) // self.layout.page_size
        keep = {k: v for k, v in window_pages.items() if k < whole}
        res = self.insert(tokens[: whole * self.layout.page_size], device_pages[:whole],
                          {window: keep} if window is not None and keep else None)
        if device_pages.size > whole:
            self.free_device(self.anchor, device_pages[whole:])
        extra = [v for k, v in window_pages.items() if k >= whole]
        if extra:
            self.free_device(window, extra)
        return res.cached_len

    # -- pages held by requests ------------------------------------------------------------
    def alloc_device(self, need: Mapping[str, int]) -> dict[str, np.ndarray] | None:
        """Device pages for a request, all or nothing, evicting LRU leaves once if short.

        The pages are *held* by the caller until given to `insert` or `free_device`. A
        request that eviction cannot satisfy (more than the free pages plus every page no
        lock pins) is refused before anything is evicted. Under write-back, eviction may
        queue backups whose device pages are already free: dispatch `take_backup_batch()`
        before the pages are written (see `needs_flush`). Bad counts raise ValueError with
        nothing taken.
        """
        got = self._device_eviction.take(checked_need(self.components, need))
        if got is not None:
            self.ledger.hold(got)
        return got

    def device_room(self) -> dict[str, int]:
        """Per allocator, the device pages a request could get now (see `PageLedger.room`)."""
        return self._device_eviction.room()

    def free_device(self, allocator: str, pages) -> None:
        """Return held device pages that never made it into the tree."""
        self.ledger.release(allocator, pages)

    def held_pages(self, allocator: str) -> int:
        return self.ledger.held_count(allocator)

    # -- locks -----------------------------------------------------------------------------
    def lock(self, node_id: NodeId) -> LockId:
        """Pin `node` and its ancestors on device (no eviction) until `unlock`. The node must
        hold device pages (or be the root, id 0: an empty prefix): a node that is host-only
        or gone raises ValueError, so a lock never vouches for pages that are not there."""
        node = self.tree.node(node_id)
        if node.parent is not None and node.state not in HOLDS_DEVICE:
            raise ValueError(f"lock of node {int(node_id)}: its pages are not on device (state {node.state.value})")
        return self.locks.lock(node)

    def unlock(self, lock: LockId) -> None:
        self.locks.unlock(lock)

    # -- eviction --------------------------------------------------------------------------
    def evict_device(self, need: Mapping[str, int]) -> EvictResult:
        """Free at least `need[allocator]` device pages (see evict.py)."""
        return self._device_eviction.evict(need)

    def evict_host(self, need: Mapping[str, int]) -> int:
        """Free at least `need[allocator]` host pages; returns anchor pages freed (see evict.py)."""
        return self._host_eviction.evict(need)

    # -- transfers -------------------------------------------------------------------------
    @property
    def needs_flush(self) -> bool:
        """A write-back demotion is queued: dispatch `take_backup_batch()` before any device
        page can be written again."""
        return self._writes.needs_flush

    def backup(self, node_id: NodeId) -> bool:
        """Commit a backup of the prefix ending at `node_id` now, whatever its hit count (under
        write-through, with its unbacked ancestors); False when the host has no room."""
        return self._writes.backup(self.tree.node(node_id))

    def take_backup_batch(self) -> BackupBatch | None:
        return self._writes.take_backup_batch()

    def backup_read(self, ack_id: AckId) -> None:
        """Batch `ack_id` is dispatched whole: every program reading its device pages went
        before any later device work, so they may be evicted and written again now (a node
        evicted before the ack waits on the host as HOST_PENDING)."""
        self._writes.backup_read(ack_id)

    def ack_backup(self, ack_id: AckId) -> list[NodeId]:
        """Batch `ack_id`'s host copies are durable; returns the nodes it wrote."""
        return [n.id for n in self._writes.ack_backup(ack_id)]

    def fail_backup(self, ack_id: AckId) -> None:
        self._writes.fail_backup(ack_id)

    def start_load(self, match: MatchResult) -> LoadJob | Refusal:
        """Start bringing `match`'s host part to the device, or say why not (see loads.py)."""
        return self._reads.start_load(match)

    def anchor_pages_ahead(self, tokens: np.ndarray) -> np.ndarray | None:
        """A look ahead at the anchor's host pages a load of `tokens` would move (see
        `Matcher.anchor_pages_ahead`); changes nothing."""
        return self._matcher.anchor_pages_ahead(tokens)

    def anchor_host_pages(self, match: MatchResult):
        """The anchor's host pages a load of `match` would move (i32 array), or None; changes nothing."""
        return self._reads.anchor_host_pages(match)

    def finish_load(self, load_id: LoadId) -> None:
        self._reads.finish_load(load_id)

    def fail_load(self, load_id: LoadId) -> None:
        self._reads.fail_load(load_id)

    # -- the tier below the host (see prefetch.py) -------------------------------------------
    def coverage(self, tokens) -> int:
        """Leading whole pages of `tokens` the tree holds in any state: where a prefetch starts."""
        return self._fill.coverage(tokens)

    def start_prefetch(self, tokens, start: int, pages: int) -> PrefetchJob | PrefetchOutcome:
        return self._fill.start_prefetch(tokens, start, pages)

    def finish_prefetch(self, prefetch_id: PrefetchId, served: int) -> tuple[int, int]:
        return self._fill.finish_prefetch(prefetch_id, served)

    def attach_host(self, tokens, start: int, host_pages: Mapping[str, np.ndarray],
                    logical_pages: Mapping[str, np.ndarray]) -> tuple[int, int]:
        """Give host pages already holding `tokens`' pages from `start` on to the tree (see
        `PrefetchPath.attach`); every page it does not attach is freed."""
        return self._fill.attach(as_tokens(tokens), start, dict(host_pages), dict(logical_pages))

    def take_host(self, need: Mapping[str, int]) -> dict[str, np.ndarray] | None:
        """Free host pages (evicting host leaves if short), for `attach_host`; None when there is no room."""
        return self.ledger.take(Tier.HOST, checked_need(self.components, need), reclaim=self._host_eviction.evict)

    def host_copy(self, node_id: NodeId) -> HostCopy | None:
        """The node's durable host copy, for the storage tier (None when it has none)."""
        node = self.tree.get(int(node_id))
        return None if node is None else self._fill.host_copy(node)

    def on_host_evict(self, hook) -> None:
        """`hook(HostCopy)` runs for every node the host tier evicts, before its pages are freed."""
        self._host_eviction.before_evict.append(lambda node: hook(self._fill.host_copy(node)))

    def host_copies(self) -> list[NodeId]:
        """Every node with a durable host copy reachable through host copies from the root,
        parents first (what a snapshot of the host tier keeps)."""
        out, stack = [], list(self.tree.root.children.values())
        while stack:
            n = stack.pop()
            if self._fill.has_host_copy(n):
                out.append(n.id)
                stack.extend(n.children.values())
        return out

    def in_flight(self) -> set[TransferId]:
        """Every committed transfer not yet acknowledged or failed: the one registry of
        transfers in flight (`attach` / `carrier`)."""
        return self.book.in_flight()

    def is_in_flight(self, tid: TransferId) -> bool:
        """`tid in in_flight()`, without building the set."""
        return self.book.is_in_flight(tid)

    def attach(self, tid: TransferId, carrier: object) -> None:
        """Keep what the data plane holds while it moves `tid` with the tree's record of it."""
        self.book.attach(tid, carrier)

    def carrier(self, tid: TransferId) -> object:
        """What the data plane attached to `tid` (None: nothing yet); ValueError when `tid` is not in flight."""
        return self.book.carrier(tid)

    def pending_acks(self) -> list[AckId]:
        return self.book.pending_acks()

    def loads_in_flight(self) -> list[LoadId]:
        return self.book.loads_in_flight()

    def check_invariants(self) -> None:
        """Recompute every law from scratch, each from the collaborator that guarantees it."""
        nodes = list(self.tree.nodes())
        self.tree.check()
        check_nodes(self.components, nodes)
        self.locks.check(nodes)
        self.book.check(nodes)
        self._writes.check(nodes)
        self.ledger.check(nodes, self.book.retired(), self.book.filled_by_load)
        self.candidates.check(nodes)


__all__ = ["TreeCore", "TreeStats"]
