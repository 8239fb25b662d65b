"""Tier sizes as a deployment states them (tokens, GiB, unlimited), turned into pages per allocator.

A tier of a layout with a sliding window has two page allocators: the anchor (`kv`: every
cached page holds its global KV, i.e. the kv-derived pools) and the window allocator
(`swa`: the SWA pages and their state rows, kept only at stop points, see
`WindowPolicy`). A size names the anchor's pages; the window allocator gets
`window_ratio` pages per anchor page. A size in bytes buys pages of both at once:

    bytes per anchor page  =  page_bytes(kv) + window_ratio * page_bytes(swa)
    V4-Flash, ratio 0.25:     998,208 B      + 0.25 * 8,160,000 B  = 3.04 MB per 256 tokens

so a 64 GiB host tier is 22,618 anchor pages (5.79 M tokens) and 5,654 window pages.
"""
from __future__ import annotations

import dataclasses
import math
import re

from hicache_jax.layout import PoolLayout

GIB = 1 << 30
_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>k|m|g|kib|mib|gib|tib|kb|mb|gb|tb)?", re.IGNORECASE)
_TOKEN_UNITS = {None: 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9}
_BYTE_UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
               "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


@dataclasses.dataclass(frozen=True)
class TierSize:
    """One tier's size: `tokens` of anchor capacity, or `bytes` of memory, or unlimited
    (both None: room for every page of the trace, so nothing is ever evicted)."""

    tokens: int | None = None
    bytes: int | None = None

    def __post_init__(self):
        if self.tokens is not None and self.bytes is not None:
            raise ValueError(f"a tier size is tokens or bytes, not both: {self.tokens} tokens, {self.bytes} bytes")
        for name in ("tokens", "bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"a tier size's {name} must be an int >= 0, got {v!r}")

    @property
    def unlimited(self) -> bool:
        return self.tokens is None and self.bytes is None

    @classmethod
    def parse(cls, text: str) -> "TierSize":
        """'unlimited', tokens ('2000000', '2M', '512k') or bytes ('64GiB', '1.5 TiB', '80GB')."""
        if not isinstance(text, str):
            raise ValueError(f"a tier size must be a string such as 2M (tokens) or 64GiB, got {text!r}")
        if text.strip().lower() in ("unlimited", "inf"):
            return cls()
        m = _SIZE.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"tier size {text!r}: expected tokens (2000000, 2M, 512k), bytes (64GiB, 80GB) "
                             f"or 'unlimited'")
        num, unit = float(m.group("num")), (m.group("unit") or "").lower() or None
        if unit in _BYTE_UNITS:
            return cls(bytes=int(num * _BYTE_UNITS[unit]))
        value = num * _TOKEN_UNITS[unit]
        if value != int(value):
            raise ValueError(f"tier size {text!r}: a token count must be whole")
        return cls(tokens=int(value))

    def __str__(self) -> str:
        if self.unlimited:
            return "unlimited"
        if self.bytes is not None:
            return f"{self.bytes / GIB:g}GiB"
        return f"{self.tokens}"


def page_bytes(layout: PoolLayout, window_ratio: float) -> float:
    """Bytes one anchor page of a tier costs, its share of window pages included."""
    window = layout.swa_pool
    return layout.page_bytes_of(layout.anchor.name) + (window_ratio * layout.page_bytes_of(window.name)
                                                       if window is not None else 0.0)


def tier_pages(layout: PoolLayout, size: TierSize, window_ratio: float, unlimited_pages: int) -> dict[str, int]:
    """Pages per allocator of a tier of `size`: anchor pages from the size, window pages
    `window_ratio` per anchor page (rounded down). Unlimited: `unlimited_pages` of each."""
    if not isinstance(size, TierSize):
        raise ValueError(f"size must be a TierSize, got {type(size).__name__}")
    anchor = layout.anchor.name
    window = layout.swa_pool.name if layout.swa_pool is not None else None
    if size.unlimited:
        pages = {anchor: unlimited_pages}
        if window is not None:
            pages[window] = unlimited_pages
        return pages
    if size.bytes is not None:
        per_page = page_bytes(layout, window_ratio)
        n = int(size.bytes // per_page) if per_page else 0
    else:
        n = size.tokens // layout.page_size
    pages = {anchor: n}
    if window is not None:
        pages[window] = math.floor(n * window_ratio)
    return pages


def pages_bytes(layout: PoolLayout, pages: dict[str, int]) -> int:
    """The memory `pages` per allocator take, every pool that moves with each allocator counted."""
    return sum(n * layout.page_bytes_of(a) for a, n in pages.items())


__all__ = ["GIB", "TierSize", "page_bytes", "pages_bytes", "tier_pages"]
