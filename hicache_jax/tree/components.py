"""Components: what the tree tracks per node and tier, derived from the layout.

A component is one page allocator of the layout: the anchor, and every independent pool.
Each node records, per tier, which pages of each component hold its data; pools that
follow an allocator (kv sidecars, swa-state pools) are not components, they move with
their allocator's pages. A component's hit rule comes from its pool's hit policy:

    full   (all_pages)       every page of a prefix must be present: the anchor, always;
                             its pages exist whenever the node holds the tier at all
    window (trailing_pages)  only the last `window_pages` pages before a prefix boundary
                             must be present; any other page may lack it (ABSENT), which
                             is how sliding-window KV stays small

Components are ordered anchor first, then by name: the order every TP rank allocates in.
"""
from __future__ import annotations

import dataclasses

from hicache_jax.layout import HitPolicy, PoolLayout

ALL = 1 << 62   # a window that spans every page: an independent pool whose hit policy is all_pages


@dataclasses.dataclass(frozen=True)
class Component:
    name: str            # the allocator pool's name
    index: int           # position in `node.pages[tier]`
    window_pages: int    # pages before a boundary that must be present (ALL for the anchor)

    @property
    def is_window(self) -> bool:
        """Pages of this component may be ABSENT outside a prefix's trailing window."""
        return self.index > 0


@dataclasses.dataclass(frozen=True)
class Components:
    all: tuple[Component, ...]

    @classmethod
    def from_layout(cls, layout: PoolLayout) -> "Components":
        anchor = layout.anchor
        others = sorted((p for p in layout.pools if p.has_allocator and p.name != anchor.name), key=lambda p: p.name)
        comps = [Component(anchor.name, 0, ALL)]
        for p in others:
            window = layout.window_pages() if p.hit_policy is HitPolicy.TRAILING_PAGES else ALL
            comps.append(Component(p.name, len(comps), window or ALL))
        return cls(tuple(comps))

    @property
    def anchor(self) -> Component:
        return self.all[0]

    @property
    def windows(self) -> tuple[Component, ...]:
        return self.all[1:]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.all)

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self):
        return iter(self.all)

    def __getitem__(self, name: str) -> Component:
        for c in self.all:
            if c.name == name:
                return c
        raise ValueError(f"no allocator {name!r} (allocators: {list(self.names)})")
