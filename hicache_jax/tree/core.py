"""`TreeCore`: the control plane of one cache — radix tree, per-tier allocators, transfer bookkeeping.

Pure Python + numpy; never imports jax. It decides which pages move and records every
page's owner; the data plane only ever sees the `TransferPlan`s it hands out. All methods
are synchronous and cheap; a transfer's completion is applied by `ack_backup` /
`fail_backup` / `finish_load` / `fail_load`, the one place where in-flight state ends.

Page ownership, per allocator and tier (checked by `check_invariants`):
    free (allocator) + cached (tree nodes) + in flight (transfers) + held (requests) = capacity
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from hicache_jax import validate
from hicache_jax.alloc import TierAllocators
from hicache_jax.layout import PoolLayout
from hicache_jax.tree.evict import Eviction
from hicache_jax.tree.insert import InsertPath
from hicache_jax.tree.loads import ReadPath
from hicache_jax.tree.lru import LeafLRU
from hicache_jax.tree.match import MatchResult, as_tokens, best_boundary, cap_tokens
from hicache_jax.tree.node import ABSENT, Node, NodeId
from hicache_jax.tree.policy import LockId, WritePolicy
from hicache_jax.tree.radix import RadixTree
from hicache_jax.tree.state import DEVICE_VALID, HOLDS_DEVICE, HOST_DURABLE, Residency
from hicache_jax.tree.writes import WritePath


class TreeCore(InsertPath, WritePath, ReadPath, Eviction):
    """Radix tree + allocators of one cache (see module docstring)."""

    def __init__(
        self,
        layout: PoolLayout,
        *,
        device_pages: Mapping[str, int],
        host_pages: Mapping[str, int],
        write_policy: str = "write_through",
        write_threshold: int | None = None,
        load_back_threshold: int = 10,
    ):
        self.layout = layout
        self.page_size = layout.page_size
        self.anchor = layout.anchor.name
        swa = layout.swa_pool
        self.swa = swa.name if swa is not None else None
        self.window_pages = layout.window_pages()
        try:
            self.policy = WritePolicy(write_policy)
        except ValueError:
            raise ValueError(f"unknown write_policy {write_policy!r}; one of {[p.value for p in WritePolicy]}") from None
        self.write_threshold = write_threshold if write_threshold is not None else self.policy.default_threshold
        if self.write_threshold is not None and self.write_threshold < 1:
            raise ValueError(f"write_threshold must be >= 1, got {self.write_threshold}")
        self.load_back_threshold = load_back_threshold
        self.device = TierAllocators(layout, "device", device_pages)
        self.host = TierAllocators(layout, "host", host_pages)
        self.tree = RadixTree(self.page_size)
        self._by_id: dict[int, Node] = {0: self.tree.root}
        self._clock = 0
        self.device_lru, self.host_lru, self.swa_lru = LeafLRU(), LeafLRU(), LeafLRU()
        self._held: dict[str, set[int]] = {name: set() for name in self.device.order}
        self._locks: dict[int, Node] = {}
        self._next_lock = 1
        self.dropped: Counter[str] = Counter()      # anchor tokens destroyed without a host copy, by reason
        self.dropped_swa: Counter[str] = Counter()  # SWA-window tokens destroyed with them, by reason
        self.events: Counter[str] = Counter()    # evictions, refusals, failures: for metrics
        self._init_write_path()
        self._init_read_path()

    # -- ids, clock, held pages ------------------------------------------------------------
    def node(self, node_id: NodeId) -> Node:
        try:
            return self._by_id[validate.count("node id", node_id)]
        except KeyError:
            raise ValueError(f"node {node_id} is not in the tree (evicted or never existed)") from None

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def alloc_device(self, need: Mapping[str, int]) -> dict[str, np.ndarray] | None:
        """Device pages for a request, all or nothing, evicting LRU leaves once if short.

        The pages are *held* by the caller until given to `insert` or `free_device`.
        A request that eviction cannot satisfy (more than the free pages plus every page
        no lock pins) is refused before anything is evicted. Under write-back, eviction may
        queue backups whose device pages are already free: dispatch `take_backup_batch()`
        before the pages are written (see `needs_flush`). Bad counts raise ValueError
        with nothing taken.
        """
        need = self._checked_need(need)
        got = self._resolve_device(need)
        if got is None:
            return None
        for name, pages in got.pages.items():
            self._held[name].update(pages.tolist())
        return {name: got.get(name) for name in need}

    def _checked_need(self, need: Mapping[str, int]) -> dict[str, int]:
        """Every count checked before anything is taken (a bad one raises, nothing changes)."""
        out = {}
        for name, n in need.items():
            if name not in self._held:
                raise ValueError(f"no device allocator {name!r} (allocators: {list(self._held)})")
            out[name] = validate.count(f"pages of {name!r}", n)
        return out

    def _resolve_device(self, need: Mapping[str, int]):
        """Take `need` device pages, evicting only when that can succeed (else None, nothing evicted)."""
        if any(n > self.device[a].num_free for a, n in need.items()):
            room = self.device_room()
            if any(n > room[a] for a, n in need.items()):
                return None
        return self.device.resolve(need, reclaim=lambda short: self.evict_device(
            short.get(self.anchor, 0), short.get(self.swa, 0) if self.swa else 0))

    def device_room(self) -> dict[str, int]:
        """Per allocator, the device pages a request could get now: free pages plus the tree's
        pages that no lock pins (eviction can free every one of those; it cannot free held
        pages, nor pages of a locked path: requests in use, backups and loads in flight)."""
        pinned = self._pinned_device_pages()
        return {a: self.device[a].capacity - len(self._held[a]) - pinned[a] for a in self._held}

    def _pinned_device_pages(self) -> dict[str, int]:
        pinned = dict.fromkeys(self._held, 0)
        seen: set[int] = set()
        for holder in self._locks.values():
            for n in holder.path_to_root():     # a lock pins its node and every ancestor
                if n.id in seen:
                    break                       # ... which an earlier lock already counted
                seen.add(n.id)
                if n.device is not None:
                    pinned[self.anchor] += len(n.device)
                    if self.swa is not None:
                        pinned[self.swa] += self._swa_count(n.swa_device)
        return pinned

    def free_device(self, allocator: str, pages) -> None:
        """Return held device pages that never made it into the tree."""
        held = self._held.get(allocator) if isinstance(allocator, str) else None
        if held is None:
            raise ValueError(f"no device allocator {allocator!r} (allocators: {list(self._held)})")
        pages = validate.page_ids(f"pages freed to {allocator!r}", pages)
        not_held = [int(p) for p in pages if int(p) not in held]
        if not_held or len(set(pages.tolist())) != pages.size:
            raise ValueError(f"free of {allocator} device pages {not_held or pages.tolist()}: not held by a request")
        held.difference_update(pages.tolist())
        self.device[allocator].free(pages)

    def held_pages(self, allocator: str) -> int:
        return len(self._held[allocator])

    # -- locks ---------------------------------------------------------------------------
    def lock(self, node_id: NodeId) -> LockId:
        """Pin `node` and its ancestors on device (no eviction) until `unlock`.

        The node must hold device pages (or be the root, id 0: an empty prefix): a node
        that is host-only or gone raises ValueError, so a lock never vouches for pages
        that are not there.
        """
        node = self.node(node_id)
        if node.parent is not None and node.state not in HOLDS_DEVICE:
            raise ValueError(f"lock of node {int(node_id)}: its pages are not on device (state {node.state.value})")
        return self._lock(node)

    def _lock(self, node: Node) -> LockId:
        lock = LockId(self._next_lock)
        self._next_lock += 1
        self._locks[lock.value] = node
        self._lock_path(node, +1)
        return lock

    def unlock(self, lock: LockId) -> None:
        node = self._locks.pop(lock.value, None) if isinstance(lock, LockId) else None
        if node is None:
            raise ValueError(f"{lock!r} is not a held lock")
        self._lock_path(node, -1)

    def _lock_path(self, node: Node, delta: int) -> None:
        for n in node.path_to_root():
            n.lock_ref += delta
            if n.lock_ref < 0:
                raise AssertionError(f"bug: negative lock count on {n}")
            if n.lock_ref == 0:
                self._offer_leaf(n)

    # -- match -----------------------------------------------------------------------------
    def match_prefix(self, tokens) -> MatchResult:
        """Longest usable prefix of `tokens` on device, and how much more the host has.

        Splits the node a boundary falls in (so boundaries are node ends) and refreshes the
        LRU position of every matched node. Never allocates or frees.
        """
        tokens = as_tokens(tokens)
        page = self.page_size
        path = [(n, m) for n, m in self.tree.walk(tokens[:cap_tokens(len(tokens), page)]) if m]
        dev_cov = any_cov = pending = 0
        for i, (node, matched) in enumerate(path):
            valid = node.state in DEVICE_VALID
            if not (valid or node.state in (Residency.HOST, Residency.LOADING)):
                for n, m in path[i:]:
                    if n.state is not Residency.HOST_PENDING:
                        break
                    pending += m // page * page
                del path[i:]
                break
            if valid and dev_cov == any_cov:
                dev_cov += matched // page
            any_cov += matched // page
        if self.swa is not None:
            dev_b = best_boundary(self._swa_desc(path, dev_cov, host=False), dev_cov, self.window_pages)
            all_b = dev_b if dev_b == any_cov else max(      # all on device: no second scan
                dev_b, best_boundary(self._swa_desc(path, any_cov, host=True), any_cov, self.window_pages))
        else:
            dev_b, all_b = dev_cov, any_cov
        chain = self._cut(path, [dev_b * page, all_b * page])
        dev_chain = chain[:self._count_until(chain, dev_b * page)]
        now = self._tick()
        for n in chain:             # LRU heaps re-file touched nodes lazily (see lru.py)
            n.last_access = now
        root = self.tree.root
        dev_pages, swa_pages = self._device_tables(dev_chain)
        return MatchResult(dev_b * page, (all_b - dev_b) * page, dev_pages, swa_pages,
                           (dev_chain[-1] if dev_chain else root).id, (chain[-1] if chain else root).id, pending)

    def _swa_desc(self, path: list[tuple[Node, int]], limit: int, host: bool):
        """SWA presence of pages limit-1 ... 0 along `path`, on device (or on either tier)."""
        page, start = self.page_size, sum(m for _, m in path) // self.page_size
        for node, matched in reversed(path):
            start -= matched // page
            dev_ok = node.state in DEVICE_VALID and node.load_id is None
            host_ok = host and node.state in HOST_DURABLE
            for i in range(matched // page - 1, -1, -1):
                if start + i < limit:
                    yield bool((dev_ok and node.swa_device[i] != ABSENT) or (host_ok and node.swa_host[i] != ABSENT))

    def _cut(self, path: list[tuple[Node, int]], cuts: list[int]) -> list[Node]:
        """Nodes from the root to the deepest cut, split so every cut (tokens, ascending) ends a node."""
        chain, pos = [], 0
        cuts = [c for c in cuts if c > 0]
        for node, _ in path:
            if not cuts:
                break
            end = pos + len(node.tokens)
            while cuts and cuts[0] < end:           # a cut inside this node: split its head off
                chain.append(self._split(node, cuts[0] - pos))
                pos = cuts.pop(0)
                while cuts and cuts[0] == pos:
                    cuts.pop(0)
            if cuts:
                chain.append(node)
                pos = end
                while cuts and cuts[0] == pos:
                    cuts.pop(0)
        return chain

    @staticmethod
    def _count_until(chain: list[Node], length: int) -> int:
        """How many leading nodes of `chain` make up `length` tokens."""
        total = i = 0
        while total < length:
            total += len(chain[i].tokens)
            i += 1
        return i

    def _device_tables(self, chain: list[Node]) -> tuple[np.ndarray, np.ndarray]:
        """(anchor device pages of `chain`, SWA device pages of its trailing window)."""
        empty = np.zeros((0,), np.int32)
        if not chain:
            return empty, empty
        dev = np.concatenate([n.device for n in chain]).astype(np.int32, copy=False)
        if self.swa is None:
            return dev, empty
        swa, need = [], self.window_pages          # the window's pages, walking back from the end
        for n in reversed(chain):
            swa[:0] = n.swa_device[-need:].tolist()
            need = self.window_pages - len(swa)
            if need <= 0:
                break
        swa = np.asarray(swa[-self.window_pages:], np.int32)
        if np.any(swa == ABSENT):
            raise AssertionError(f"bug: matched window of {chain[-1]} lacks SWA device pages: {swa.tolist()}")
        return dev, swa.astype(np.int32)

    def _split(self, node: Node, num_tokens: int) -> Node:
        """Split `node`; the new head joins every in-flight transfer `node` belongs to."""
        head = self.tree.split(node, num_tokens)
        self._by_id[head.id] = head
        if head.write_id is not None:
            self._writes[head.write_id].nodes.add(head)
            self._split_queued(head, node, num_tokens // self.page_size)
        if head.load_id is not None:
            self._loads[head.load_id].nodes.add(head)
        self._offer_leaf(head)      # a new node: may hold SWA pages
        return head

    def check_invariants(self) -> None:
        from hicache_jax.tree.invariants import check_invariants
        check_invariants(self)
