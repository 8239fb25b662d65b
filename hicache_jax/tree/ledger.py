"""`PageLedger`: every page of every allocator on every tier, and who holds it.

At any time a page is exactly one of

    free      in its allocator
    held      by a request (device pages from `alloc`, not yet given to the tree)
    a node's  cached, or being filled by a transfer in flight
    retired   host pages a node left behind while a write to them was still in flight;
              freed when that write ends

so, per tier and allocator, free + held + nodes' + retired == capacity. Every change to a
node's pages goes through the ledger, and `check` recomputes the law from scratch.
`host_freed(allocator, pages)`, when set, hears of every host page freed, as it is freed
(the host tier then forgets where those pages' bytes were).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from hicache_jax import validate
from hicache_jax.alloc import TierAllocators
from hicache_jax.layout import PoolLayout
from hicache_jax.tree.components import Components
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.state import WRITE_PENDING, Residency, Tier, TreeStateError

Pages = dict[str, np.ndarray]   # allocator -> i32 page ids


class PageLedger:
    def __init__(self, layout: PoolLayout, components: Components, capacity: Mapping[Tier, Mapping[str, int]]):
        self.components = components
        self._tiers = tuple(TierAllocators(layout, tier.name.lower(), capacity[tier]) for tier in Tier)
        self._held: dict[str, set[int]] = {c.name: set() for c in components}
        self.host_freed: Callable[[str, np.ndarray], None] | None = None

    def allocators(self, tier: Tier) -> TierAllocators:
        return self._tiers[tier]

    # -- taking and freeing ----------------------------------------------------------------
    def take(self, tier: Tier, need: Mapping[str, int], reclaim: Callable[[dict[str, int]], None] | None = None
             ) -> Pages | None:
        """`need[allocator]` free pages of every allocator, all or nothing (see `TierAllocators.resolve`)."""
        got = self._tiers[tier].resolve(need, reclaim)
        return None if got is None else {name: got.get(name) for name in need}

    def free(self, tier: Tier, allocator: str, pages: np.ndarray) -> None:
        if len(pages):
            self._tiers[tier][allocator].free(pages)
            if tier is Tier.HOST and self.host_freed is not None:
                self.host_freed(allocator, pages)

    # -- pages held by requests (device tier) ------------------------------------------------
    def hold(self, pages: Pages) -> None:
        for name, p in pages.items():
            self._held[name].update(p.tolist())

    def held_count(self, allocator: str) -> int:
        return len(self._held[allocator])

    def is_held(self, allocator: str, page: int) -> bool:
        return page in self._held[allocator]

    def release(self, allocator: str, pages) -> None:
        """A request gives back held pages that never made it into the tree."""
        held = self._held.get(allocator) if isinstance(allocator, str) else None
        if held is None:
            raise ValueError(f"no device allocator {allocator!r} (allocators: {list(self._held)})")
        pages = validate.page_ids(f"pages freed to {allocator!r}", pages)
        not_held = [int(p) for p in pages if int(p) not in held]
        if not_held or len(set(pages.tolist())) != pages.size:
            raise ValueError(f"free of {allocator} device pages {not_held or pages.tolist()}: not held by a request")
        held.difference_update(pages.tolist())
        self.free(Tier.DEVICE, allocator, pages)

    def adopt(self, allocator: str, pages: np.ndarray) -> None:
        """Held pages become a node's (the caller attaches them)."""
        self._held[allocator].difference_update(pages.tolist())

    def release_held_among(self, allocator: str, pages: np.ndarray) -> None:
        """Free the pages of `pages` that are held (duplicates of what the tree already has)."""
        held = self._held[allocator]
        dup = [int(p) for p in pages if int(p) in held]
        if dup:
            held.difference_update(dup)
            self.free(Tier.DEVICE, allocator, np.asarray(dup))

    # -- a node's pages ---------------------------------------------------------------------
    def attach(self, node: Node, tier: Tier, full: np.ndarray) -> None:
        """`node` now holds `full` (its anchor pages) on `tier`; window components start ABSENT."""
        row = node.pages[tier]
        row[0] = full.astype(np.int32, copy=False)
        for c in self.components.windows:
            row[c.index] = np.full(full.size, ABSENT, np.int32)

    def set_window(self, node: Node, tier: Tier, component: int, page_index: int, page: int) -> None:
        node.pages[tier][component][page_index] = page

    def drop(self, node: Node, tier: Tier) -> None:
        """Free every page `node` holds on `tier`, every component."""
        row = node.pages[tier]
        for c in self.components:
            arr = row[c.index]
            if arr is not None:
                self.free(tier, c.name, arr if c.index == 0 else arr[arr != ABSENT])
                row[c.index] = None

    def retire(self, node: Node, tier: Tier, into: dict[str, list[int]]) -> None:
        """`node` gives up its pages on `tier` without freeing them: they go to `into`
        (a write's retired pages, freed when that write ends)."""
        row = node.pages[tier]
        for c in self.components:
            arr = row[c.index]
            if arr is not None:
                into.setdefault(c.name, []).extend((arr if c.index == 0 else arr[arr != ABSENT]).tolist())
                row[c.index] = None

    def drop_window(self, node: Node, tier: Tier, component: int, mask: np.ndarray | None = None) -> int:
        """Free `node`'s pages of a window component on `tier` (those in `mask`); returns how many."""
        arr = node.pages[tier][component]
        take = arr != ABSENT if mask is None else mask & (arr != ABSENT)
        n = int(np.count_nonzero(take))
        if n:
            self.free(tier, self.components.all[component].name, arr[take])
            arr[take] = ABSENT
        return n

    def room(self, pinned: Iterable[Node]) -> dict[str, int]:
        """Per allocator, the device pages a request could get now: free pages plus the tree's
        pages that no lock pins (eviction can free every one of those; it cannot free held
        pages, nor pages of a locked path: requests in use, backups and loads in flight)."""
        room = {c.name: self._tiers[Tier.DEVICE][c.name].capacity - len(self._held[c.name]) for c in self.components}
        for n in pinned:
            for c in self.components:
                room[c.name] -= n.present(Tier.DEVICE, c.index)
        return room

    # -- the law ----------------------------------------------------------------------------
    def check(self, nodes: Iterable[Node], retired: Mapping[tuple[Tier, str], list[int]],
              loading_windows: Callable[[Node, int], np.ndarray]) -> None:
        """free + held + nodes' + retired == capacity per tier and allocator, no page twice.
        `loading_windows(node, component)`: the node's window pages a load is filling."""
        owned: dict[tuple[Tier, str], dict[str, list]] = {}

        def own(tier, allocator, category, pages):
            owned.setdefault((tier, allocator), {}).setdefault(category, []).extend(np.asarray(pages).tolist())

        for n in nodes:
            for tier in Tier:
                in_flight = n.state is Residency.LOADING if tier is Tier.DEVICE else n.state in WRITE_PENDING
                for c in self.components:
                    arr = n.pages[tier][c.index]
                    if arr is None:
                        continue
                    present = arr if c.index == 0 else arr[arr != ABSENT]
                    if tier is Tier.DEVICE and c.index and n.load_id is not None:
                        filling = np.isin(present, loading_windows(n, c.index))
                        own(tier, c.name, "in_flight", present[filling])
                        own(tier, c.name, "cached", present[~filling])
                    else:
                        own(tier, c.name, "in_flight" if in_flight else "cached", present)
        for (tier, allocator), pages in retired.items():
            own(tier, allocator, "retired", pages)
        for allocator, held in self._held.items():
            own(Tier.DEVICE, allocator, "held", sorted(held))
        for tier, allocs in zip(Tier, self._tiers):
            for alloc in allocs:
                cats = owned.get((tier, alloc.name), {})
                free = alloc.free_pages().tolist()
                everything = free + [p for pages in cats.values() for p in pages]
                if len(everything) != alloc.capacity or len(set(everything)) != alloc.capacity:
                    dup = [p for p, k in Counter(everything).items() if k > 1][:8]
                    counts = {k: len(v) for k, v in cats.items()}
                    raise TreeStateError(f"invariant violated: {tier.name.lower()} {alloc.name}: free {len(free)} + "
                                         f"{counts} != capacity {alloc.capacity}"
                                         + (f"; pages owned twice: {dup}" if dup else ""))
