"""Insert: a request gives its computed pages to the tree.

Walks the tree along the tokens once, validates everything before changing anything (a
caller mistake raises ValueError with the tree untouched), then: pages the tree already
has are freed as duplicates, a host-only node on the path adopts the request's pages, a
new node takes the rest, and every node on the path counts a hit (which may commit a
write-through backup). SWA pages given for a page adopt where the node lacks one.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hicache_jax import validate
from hicache_jax.tree.match import as_tokens
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.policy import InsertResult
from hicache_jax.tree.state import DEVICE_VALID, HOLDS_DEVICE, Event, Residency


class InsertPath:
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
        dev = validate.page_ids("device_pages", device_pages)
        swa = validate.page_map("swa_pages", swa_pages)
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
