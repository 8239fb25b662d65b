"""`SharedStore`: the storage tier (L3) every simulated instance shares, without the bytes.

It answers what `StorageTier` answers, with the same rules, over a record of which
pages are stored instead of an engine:

- Keys are the project's: page `i` of a prompt is its chained SHA-256 page hash
  (`storage.keys.page_hashes`), so "the first k pages exist" means "a k-page prefix was
  stored", whoever stored it. One entry stands for every object `KeySpace` names for that
  page and allocator (one per byte-holding pool that moves with it), which are written
  and read together.
- `usable_prefix` is `StorageTier.usable_prefix`: the leading pages whose anchor objects
  are stored, then the largest stop at or below that whose trailing window (the window
  allocator's objects) is stored too.
- A put skips pages already stored (or on their way). An entry becomes visible at `visible_at`, when the
  write that carries it has crossed the writer's storage link, so an instance never reads
  a page that is still on its way.
- Capacity is in pages per allocator; when full, the least recently written or read entry
  goes (Mooncake Store evicts by its own rules; nothing here depends on which).
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

from hicache_jax import validate
from hicache_jax.layout import PoolLayout
from hicache_jax.storage.keys import KeySpace, PageHash

_PROBE = PageHash(bytes(32))   # any page hash: to count the objects one page has


class SharedStore:
    """Which pages the shared storage tier holds, per allocator (see the module docstring)."""

    def __init__(self, layout: PoolLayout, capacity: Mapping[str, int], model_id: str = ""):
        self.layout = layout
        self.keys = KeySpace(layout, model_id)
        self.anchor = layout.anchor.name
        self.window = layout.swa_pool.name if layout.swa_pool is not None else None
        self.window_pages = layout.window_pages() if self.window else 0
        allocators = [a for a in (self.anchor, self.window) if a is not None]
        if layout.page_bytes_of(self.anchor) == 0:
            raise ValueError(f"layout {layout.model.name!r}: the anchor moves no bytes, so storage holds nothing of it")
        if sorted(capacity) != sorted(allocators):
            raise ValueError(f"storage capacity names {sorted(capacity)}; it must name the allocators {allocators}")
        self.capacity = {a: validate.count(f"storage pages of {a!r}", capacity[a]) for a in allocators}
        self.objects_per_page = {a: len(self.keys.page_keys(layout.moving_with(a), [_PROBE])) for a in allocators}
        self._entries: dict[str, OrderedDict[bytes, float]] = {a: OrderedDict() for a in allocators}
        self.written = Counter()    # allocator -> pages written
        self.skipped = Counter()    # allocator -> pages a put found stored already
        self.read = Counter()       # allocator -> pages read
        self.evicted = Counter()    # allocator -> pages dropped for room
        self.lookups = 0
        self.lookup_hits = 0

    def pages(self, allocator: str) -> int:
        """Entries held now (visible or still being written)."""
        return len(self._entries[allocator])

    def _has(self, allocator: str, page: bytes, now: float) -> bool:
        t = self._entries[allocator].get(page)
        return t is not None and t <= now

    def usable_prefix(self, pages: Sequence[PageHash], now: float) -> int:
        """The longest k-page prefix of `pages` the store serves whole at `now`: every
        anchor page, and the window before k (as `StorageTier.usable_prefix`)."""
        self.lookups += 1
        n = 0
        for p in pages:
            if not self._has(self.anchor, p, now):
                break
            n += 1
        if n and self.window is not None:
            wp = self.window_pages
            n = next((k for k in range(n, 0, -1)
                      if all(self._has(self.window, pages[i], now) for i in range(max(0, k - wp), k))), 0)
        self.lookup_hits += n > 0
        return n

    def get(self, allocator: str, pages: Sequence[PageHash], now: float) -> int:
        """Read `pages` of `allocator`: the leading run stored at `now` is served (and
        becomes most recently used); returns how many."""
        entries = self._entries[allocator]
        served = 0
        for p in pages:
            if not self._has(allocator, p, now):
                break
            entries.move_to_end(p)
            served += 1
        self.read[allocator] += served
        return served

    def missing(self, allocator: str, pages: Sequence[PageHash]) -> list[PageHash]:
        """The pages of `pages` a put must write: those not stored or on their way (the
        others are counted as skipped, as the real tier's `contains` before a put)."""
        entries = self._entries[allocator]
        out = [p for p in pages if p not in entries]
        if len(out) < len(pages):
            self.skipped[allocator] += len(pages) - len(out)
        return out

    def put(self, allocator: str, pages: Sequence[PageHash], visible_at: float) -> None:
        """Store `pages` of `allocator` (from `missing`), visible from `visible_at`,
        evicting the least recently used entries past capacity."""
        entries, cap = self._entries[allocator], self.capacity[allocator]
        for p in pages:
            if cap == 0 or p in entries:
                continue
            entries[p] = visible_at
            self.written[allocator] += 1
            if len(entries) > cap:
                entries.popitem(last=False)
                self.evicted[allocator] += 1

    def stats(self) -> dict:
        """Counters, per allocator where it applies (JSON-ready)."""
        return {"lookups": self.lookups, "lookup_hits": self.lookup_hits,
                "pages": {a: len(e) for a, e in self._entries.items()},
                "written_pages": dict(self.written), "skipped_pages": dict(self.skipped),
                "read_pages": dict(self.read), "evicted_pages": dict(self.evicted),
                "objects_per_page": dict(self.objects_per_page)}


__all__ = ["SharedStore"]
