"""`Inserter`: a request gives its computed pages to the tree.

Walks the tree along the tokens once, validates everything before changing anything (a
caller mistake raises ValueError with the tree untouched), then: pages the tree already
has are freed as duplicates, a host-only node on the path adopts the request's pages, a
new node takes the rest, and every node on the path counts a hit (which may commit a
write-through backup). Window pages given for a page are adopted where the node lacks one.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hicache_jax import validate
from hicache_jax.tree.match import as_tokens
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.results import InsertResult
from hicache_jax.tree.state import DEVICE, DEVICE_VALID, HOLDS_DEVICE, Event, Residency, Tier
from hicache_jax.tree.parts import TreeParts
from hicache_jax.tree.writes import WritePath

_NONE = np.zeros(0, np.int64)


class Inserter:
    def __init__(self, parts: TreeParts, writes: WritePath):
        self._components, self._tree, self._ledger = parts.components, parts.tree, parts.ledger
        self._candidates, self._writes, self._clock = parts.candidates, writes, parts.clock
        self._page = parts.page_size
        self._anchor = parts.components.anchor.name
        self._window_index = {c.name: c.index for c in parts.components.windows}

    def insert(self, tokens, device_pages, window_pages: Mapping[str, Mapping[int, int]] | None = None) -> InsertResult:
        """Give a request's computed pages to the tree.

        `tokens`: i32[n] whole pages; `device_pages`: i32[n / page] the request's anchor page
        of each logical page (held pages, or the tree's own pages where the request reused
        them); `window_pages`: {window allocator: {logical page: held device page}} for the
        pages whose window data the tree should keep (typically the trailing window). Pages
        the tree already has are freed as duplicates; a host-only node on the path adopts
        the request's pages. Insertion stops at a node whose transfer is in flight (the rest
        is freed). Every node on the path counts a hit; write-through policies back up what
        reaches the threshold. A caller mistake raises ValueError with nothing changed.
        """
        tokens = as_tokens(tokens)
        page, anchor = self._page, self._anchor
        dev = validate.page_ids("device_pages", device_pages)
        windows = self._checked_windows(window_pages)
        if len(tokens) % page:
            raise ValueError(f"insert of {len(tokens)} tokens: must be whole pages of {page}")
        path = self._tree.walk(tokens)
        ours = self._check(tokens, dev, windows, path)
        now = self._clock.tick()
        pos, valid_pages, stopped, touched = 0, 0, False, []
        for node, matched in path:
            if matched < len(node.tokens):
                node = self._tree.split(node, matched)
            first, k = pos // page, matched // page
            if node.state in DEVICE_VALID:
                valid_pages += k if valid_pages == first else 0
            elif node.state is Residency.HOST:       # a host-only node adopts the request's pages
                self._adopt(node, dev[first:first + k])
                node.apply(Event.ADOPT_DEVICE)
            else:                                     # LOADING / HOST_PENDING: in flight, leave it be
                stopped = True
                break
            if windows:
                self._merge_windows(node, first, windows)
            node.hit_count += 1
            node.last_access = now
            touched.append(node)
            pos += matched
        new_len = 0
        if not stopped and pos < len(tokens):
            node = self._tree.add(touched[-1] if touched else self._tree.root, tokens[pos:], Residency.DEVICE)
            self._adopt(node, dev[pos // page:])
            self._merge_windows(node, pos // page, windows)
            node.hit_count, node.last_access = 1, now
            touched.append(node)
            new_len = len(tokens) - pos
            pos = len(tokens)
        # what the tree already had, and whatever it did not take, goes back to the allocators
        self._ledger.release_held_among(anchor, dev[:valid_pages][dev[:valid_pages] != ours[:valid_pages]])
        self._ledger.release_held_among(anchor, dev[pos // page:])
        for name, given in windows.items():
            if given:
                self._ledger.release_held_among(name, np.fromiter(given.values(), np.int64, len(given)))
        for node in touched if self._components.windows else touched[-1:]:
            self._candidates.offer(node)     # without window pages only the last can be a leaf
        for node in touched:
            self._writes.on_hit(node)
        last = touched[-1] if touched else self._tree.root
        return InsertResult(last.id, pos, new_len)

    def _adopt(self, node: Node, given: np.ndarray) -> None:
        self._ledger.adopt(self._components.anchor.name, given)
        self._ledger.attach(node, Tier.DEVICE, given)

    def _checked_windows(self, window_pages) -> dict[str, dict[int, int]]:
        if window_pages is None:
            return {}
        if not hasattr(window_pages, "items"):
            raise ValueError(f"window_pages must be a mapping {{allocator: {{logical page: page}}}}, got {window_pages!r}")
        out = {}
        for name, given in window_pages.items():
            c = self._components[name] if isinstance(name, str) else None
            if c is None or not c.is_window:
                raise ValueError(f"window_pages names {name!r}, not a window allocator "
                                 f"(window allocators: {[w.name for w in self._components.windows]})")
            given = validate.page_map(f"{name} pages", given)
            if given:
                out[c.name] = given
        return out

    def _check(self, tokens: np.ndarray, dev: np.ndarray, windows: dict[str, dict[int, int]], path) -> np.ndarray:
        """Validate an insert before anything changes; return the tree's anchor pages along it.
        A given page must be held by a request or be the tree's own page for those tokens."""
        n_pages = len(tokens) // self._page
        if dev.size != n_pages:
            raise ValueError(f"insert of {n_pages} pages given {dev.size} device pages")
        ours = self._tree_pages_along(path, 0)
        if len(set(dev.tolist())) != dev.size:
            raise ValueError(f"insert gives {self._anchor} device pages twice: {dev.tolist()}")
        differ = np.flatnonzero(dev[: ours.size] != ours).tolist() + list(range(ours.size, dev.size))
        if differ:   # where the request gives other pages than the tree's, they must be its own
            self._foreign(self._anchor, {k: int(dev[k]) for k in differ}, lambda: _NONE)
        for name, given in windows.items():
            bad = [k for k in given if not 0 <= k < n_pages]
            if bad:
                raise ValueError(f"{name} pages name logical pages {bad} outside 0..{n_pages - 1}")
            pages = list(given.values())
            if len(set(pages)) != len(pages):
                raise ValueError(f"insert gives {name} device pages twice: {pages}")
            self._foreign(name, given, lambda k=self._window_index[name]: self._tree_pages_along(path, k))
        return ours

    def _foreign(self, allocator: str, given: Mapping[int, int], tree_own) -> None:
        """Raise for pages of `given` ({logical page: device page}) neither held by a request
        nor the tree's own page at that same logical page (`tree_own()`, in logical order,
        computed only if needed). Another page of the path is not the caller's to give: a
        lock of another request pins it, and the tree would own it twice."""
        loose = [(k, p) for k, p in given.items() if not self._ledger.is_held(allocator, p)]
        if loose:
            own = tree_own()
            foreign = [p for k, p in loose if not (k < own.size and own[k] == p)]
            if foreign:
                raise ValueError(f"insert gives {allocator} device pages {foreign} that are neither held "
                                 f"by a request nor the tree's own pages at those logical pages of these tokens")

    def _tree_pages_along(self, path, component: int) -> np.ndarray:
        """The tree's device pages of `component` along a walk (in order)."""
        parts = []
        for node, matched in path:
            if node.state not in HOLDS_DEVICE:          # LOADING pages are the tree's too
                break
            parts.append(node.pages[DEVICE][component][:matched // self._page])
        return np.concatenate(parts).astype(np.int64) if parts else _NONE

    def _merge_windows(self, node: Node, first: int, windows: dict[str, dict[int, int]]) -> None:
        """Adopt given window pages where `node` lacks them; consumed entries leave `windows`."""
        for name, given in windows.items():
            if not given:
                continue
            k = self._window_index[name]
            arr = node.pages[DEVICE][k]
            for i in range(len(node.tokens) // self._page):
                p = given.get(first + i)
                if p is None:
                    continue
                if arr[i] == ABSENT and node.load_id is None:
                    self._ledger.adopt(name, np.asarray([p]))
                    self._ledger.set_window(node, Tier.DEVICE, k, i, p)
                    del given[first + i]
                elif arr[i] == p:
                    del given[first + i]
