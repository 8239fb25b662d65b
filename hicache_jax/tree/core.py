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

from hicache_jax.alloc import TierAllocators
from hicache_jax.layout import PoolLayout
from hicache_jax.tree.evict import Eviction
from hicache_jax.tree.loads import ReadPath
from hicache_jax.tree.lru import LeafLRU
from hicache_jax.tree.match import MatchResult, best_boundary, cap_tokens
from hicache_jax.tree.node import ABSENT, Node, NodeId
from hicache_jax.tree.policy import InsertResult, LockId, WritePolicy
from hicache_jax.tree.radix import RadixTree
from hicache_jax.tree.state import DEVICE_VALID, HOLDS_DEVICE, HOST_DURABLE, Event, Residency
from hicache_jax.tree.writes import WritePath


class TreeCore(WritePath, ReadPath, Eviction):
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
            return self._by_id[int(node_id)]
        except KeyError:
            raise ValueError(f"node {node_id} is not in the tree (evicted or never existed)") from None

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def alloc_device(self, need: Mapping[str, int]) -> dict[str, np.ndarray] | None:
        """Device pages for a request, all or nothing, evicting LRU leaves once if short.

        The pages are *held* by the caller until given to `insert` or `free_device`.
        Under write-back, eviction may queue backups whose device pages are already free:
        dispatch `take_backup_batch()` before the pages are written (see `needs_flush`).
        """
        for name in need:
            if name not in self._held:
                raise ValueError(f"no device allocator {name!r} (allocators: {list(self._held)})")
        got = self.device.resolve(need, reclaim=lambda short: self.evict_device(short.get(self.anchor, 0),
                                                                              short.get(self.swa, 0) if self.swa else 0))
        if got is None:
            return None
        for name, pages in got.pages.items():
            self._held[name].update(pages.tolist())
        return {name: got.get(name) for name in need}

    def free_device(self, allocator: str, pages) -> None:
        """Return held device pages that never made it into the tree."""
        pages = np.asarray(pages, dtype=np.int64).reshape(-1)
        held = self._held.get(allocator)
        if held is None:
            raise ValueError(f"no device allocator {allocator!r}")
        not_held = [int(p) for p in pages if int(p) not in held]
        if not_held or len(set(pages.tolist())) != pages.size:
            raise ValueError(f"free of {allocator} device pages {not_held or pages.tolist()}: not held by a request")
        held.difference_update(pages.tolist())
        self.device[allocator].free(pages)

    def held_pages(self, allocator: str) -> int:
        return len(self._held[allocator])

    # -- locks ---------------------------------------------------------------------------
    def lock(self, node_id: NodeId) -> LockId:
        """Pin `node` and its ancestors on device (no eviction) until `unlock`."""
        node = self.node(node_id)
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
        dev_cov = any_cov = 0
        for i, (node, matched) in enumerate(path):
            valid = node.state in DEVICE_VALID
            if not (valid or node.state in (Residency.HOST, Residency.LOADING)):
                del path[i:]
                break
            if valid and dev_cov == any_cov:
                dev_cov += matched // page
            any_cov += matched // page
        if self.swa is not None:
            dev_b = best_boundary(self._swa_desc(path, dev_cov, host=False), dev_cov, self.window_pages)
            all_b = max(dev_b, best_boundary(self._swa_desc(path, any_cov, host=True), any_cov, self.window_pages))
        else:
            dev_b, all_b = dev_cov, any_cov
        chain = self._cut(path, [dev_b * page, all_b * page])
        dev_chain = chain[:self._count_until(chain, dev_b * page)]
        now = self._tick()
        for n in chain:
            n.last_access = now
        # only the deepest device node and the deepest node can be leaves of an LRU; any
        # node may hold SWA pages, so with an SWA pool every touched node is re-offered
        last_dev = next((n for n in reversed(chain) if n.state in DEVICE_VALID), None)
        offer = chain if self.swa is not None else [last_dev, chain[-1] if chain else None]
        for n in dict.fromkeys(n for n in offer if n is not None):
            self._offer_leaf(n)
        root = self.tree.root
        dev_pages, swa_pages = self._device_tables(dev_chain)
        return MatchResult(dev_b * page, (all_b - dev_b) * page, dev_pages, swa_pages,
                           (dev_chain[-1] if dev_chain else root).id, (chain[-1] if chain else root).id)

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
        swa = np.concatenate([n.swa_device for n in chain[-self.window_pages:]])[-self.window_pages:]
        if np.any(swa == ABSENT):
            raise AssertionError(f"bug: matched window of {chain[-1]} lacks SWA device pages: {swa.tolist()}")
        return dev, swa.astype(np.int32)

    def _split(self, node: Node, num_tokens: int) -> Node:
        """Split `node`; the new head joins every in-flight transfer `node` belongs to."""
        head = self.tree.split(node, num_tokens)
        self._by_id[head.id] = head
        if head.write_id is not None:
            self._writes[head.write_id].nodes.add(head)
        if head.load_id is not None:
            self._loads[head.load_id].nodes.add(head)
        return head

    # -- insert ----------------------------------------------------------------------------
    def insert(self, tokens, device_pages, swa_pages: Mapping[int, int] | None = None) -> InsertResult:
        """Give a request's computed pages to the tree.

        `tokens`: i32[n] whole pages; `device_pages`: i32[n / page] the request's anchor page
        of each logical page (held pages, or the tree's own pages where the request reused
        them); `swa_pages`: {logical page: held SWA device page} for the pages whose SWA
        data the tree should keep (typically the trailing window). Pages the tree already
        has are freed as duplicates; a host-only node on the path adopts the request's
        pages. Insertion stops at a node whose transfer is in flight (the rest is freed).
        Every node on the path counts a hit; write-through policies back up what reaches
        the threshold. A caller mistake raises ValueError with nothing changed.
        """
        tokens = as_tokens(tokens)
        page = self.page_size
        dev = np.asarray(device_pages, dtype=np.int64).reshape(-1)
        swa = {int(k): int(v) for k, v in (swa_pages or {}).items()}
        if len(tokens) % page:
            raise ValueError(f"insert of {len(tokens)} tokens: must be whole pages of {page}")
        path = self.tree.walk(tokens)
        ours = self._check_insert(tokens, dev, swa, path)
        now = self._tick()
        pos, valid_pages, stopped, touched = 0, 0, False, []
        for node, matched in path:
            if matched < len(node.tokens):
                node = self._split(node, matched)
            first, k = pos // page, matched // page
            if node.state in DEVICE_VALID:
                valid_pages += k if valid_pages == first else 0
            elif node.state is Residency.HOST:       # a host-only node adopts the request's pages
                given = dev[first:first + k]
                self._take_held(self.anchor, given)
                node.device = given.astype(np.int32)
                if self.swa is not None:
                    node.swa_device = np.full(k, ABSENT, np.int32)
                node.apply(Event.ADOPT_DEVICE)
            else:                                     # LOADING / HOST_PENDING: in flight, leave it be
                stopped = True
                break
            if self.swa is not None:
                self._merge_swa(node, first, swa)
            node.hit_count += 1
            node.last_access = now
            touched.append(node)
            pos += matched
        new_len = 0
        if not stopped and pos < len(tokens):
            node = self.tree.add(touched[-1] if touched else self.tree.root, tokens[pos:], Residency.DEVICE)
            self._by_id[node.id] = node
            given = dev[pos // page:]
            self._take_held(self.anchor, given)
            node.device = given.astype(np.int32)
            if self.swa is not None:
                node.swa_device = np.full(len(given), ABSENT, np.int32)
                self._merge_swa(node, pos // page, swa)
            node.hit_count, node.last_access = 1, now
            touched.append(node)
            new_len = len(tokens) - pos
            pos = len(tokens)
        # what the tree already had, and whatever it did not take, goes back to the allocators
        self._free_duplicates(self.anchor, dev[:valid_pages], ours[:valid_pages])
        self._free_duplicates(self.anchor, dev[pos // page:], None)
        if swa:
            self._free_duplicates(self.swa, np.asarray(list(swa.values())), None)
        for node in touched if self.swa is not None else touched[-1:]:
            self._offer_leaf(node)           # without SWA only the last can be a leaf
        for node in touched:
            self._on_hit(node)
        last = touched[-1] if touched else self.tree.root
        return InsertResult(last.id, pos, new_len)

    def _check_insert(self, tokens: np.ndarray, dev: np.ndarray, swa: dict[int, int], path) -> np.ndarray:
        """Validate an insert before anything changes; return the tree's anchor pages along it."""
        n_pages = len(tokens) // self.page_size
        if dev.size != n_pages:
            raise ValueError(f"insert of {n_pages} pages given {dev.size} device pages")
        if swa and self.swa is None:
            raise ValueError("swa_pages given, but this layout has no SWA pool")
        bad = [k for k in swa if not 0 <= k < n_pages]
        if bad:
            raise ValueError(f"swa_pages names logical pages {bad} outside 0..{n_pages - 1}")
        tree_dev, tree_swa = self._tree_pages_along(path)
        for allocator, given, ours in ((self.anchor, dev, tree_dev),
                                       (self.swa, np.asarray(list(swa.values()), np.int64), tree_swa)):
            if allocator is None or given.size == 0:
                continue
            if len(set(given.tolist())) != given.size:
                raise ValueError(f"insert gives {allocator} device pages twice: {given.tolist()}")
            if allocator == self.anchor:   # the tree's page at the same position, or held
                differ = np.flatnonzero(given[: ours.size] != ours).tolist() + list(range(ours.size, given.size))
                candidates = given[differ].tolist()
            else:
                candidates = given[~np.isin(given, ours)].tolist()
            held = self._held[allocator]
            foreign = [p for p in candidates if p not in held]
            if foreign:
                raise ValueError(f"insert gives {allocator} device pages {foreign} that are neither held "
                                 f"by a request nor the tree's own pages for these tokens")
        return tree_dev

    def _tree_pages_along(self, path) -> tuple[np.ndarray, np.ndarray]:
        """The tree's device pages along a walk: anchor pages in order, and its SWA pages."""
        dev, swa = [], []
        for node, matched in path:
            if node.state not in HOLDS_DEVICE:          # LOADING pages are the tree's too
                break
            k = matched // self.page_size
            dev.append(node.device[:k])
            if node.swa_device is not None:
                swa.append(node.swa_device[:k])
        cat = lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return cat(dev), cat(swa)

    def _merge_swa(self, node: Node, first: int, swa: dict[int, int]) -> None:
        """Adopt given SWA pages where `node` lacks them; consumed entries leave `swa`."""
        if not swa:
            return
        for i in range(len(node.tokens) // self.page_size):
            p = swa.get(first + i)
            if p is None:
                continue
            if node.swa_device[i] == ABSENT and node.load_id is None:
                self._take_held(self.swa, np.asarray([p]))
                node.swa_device[i] = p
                del swa[first + i]
            elif node.swa_device[i] == p:
                del swa[first + i]

    def _take_held(self, allocator: str, pages: np.ndarray) -> None:
        self._held[allocator].difference_update(pages.tolist())

    def _free_duplicates(self, allocator: str, given: np.ndarray, ours: np.ndarray | None) -> None:
        """Free the held pages of `given` that are not the tree's own `ours`."""
        dup = given if ours is None else given[given != ours]
        dup = [int(p) for p in dup if int(p) in self._held[allocator]]
        if dup:
            self._held[allocator].difference_update(dup)
            self.device[allocator].free(np.asarray(dup))

    def check_invariants(self) -> None:
        from hicache_jax.tree.invariants import check_invariants
        check_invariants(self)


def as_tokens(tokens) -> np.ndarray:
    """Token ids as i32[n]; anything else raises ValueError naming what was given."""
    arr = np.asarray(tokens)
    if arr.dtype == np.int32 and arr.ndim == 1:    # the hot path: nothing to convert
        return arr
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"tokens must be a 1-D sequence of integers, got {arr.dtype} of shape {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
        raise ValueError(f"token ids must be in 0..2**31-1, got min {arr.min()} max {arr.max()}")
    return arr.astype(np.int32)
