"""`WindowPolicy`: which page boundaries of a request keep their sliding-window (SWA) state.

A later request can stop its match at page boundary b (reuse pages 0..b-1) only if the
window ending at b is cached: the SWA pages of logical pages b - window_pages ... b - 1,
fewer when b is closer to the root than that (the hit rule in `tree/match.py`). A page's
window state is large next to its kv (DeepSeek V4-Flash: 8.16 MB of SWA + state rows per
page beside 0.998 MB of kv), so keeping it for every page makes most of the host bytes
window state. A policy names the stop points whose windows a request keeps at insert:

    every           every page boundary: every page keeps its SWA page
    ends            the request's ends (by default its last whole page boundary, where a
                    preempted request resumes and the next turn of the conversation starts)
    ends+every_N    the ends, and every boundary that is a multiple of N pages (counted
                    from the root, so requests sharing a prefix agree on its stop points)

For example, a request of 10 whole pages whose first 3 were cached (matched) keeps, under
ends+every_4 with a window of 2 pages, the windows of stop points 4, 8 and 10:

    page            0  1  2  3  4  5  6  7  8  9
    cached          =  =  =                         in the tree, with their windows
    window of 4              3                      (page 2: cached)
    window of 8                       6  7
    window of 10                            8  9    (the request's end)
    keep            {3, 6, 7, 8, 9}

Pure Python: no jax, no tree. The serving loop frees the SWA pages it does not keep.
"""
from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Iterable

_EVERY_N = re.compile(r"ends\+every_(\d+)")
_DEFAULT_EVERY = 4           # pages; see BENCHMARKS.md, "Window policy", for the choice
DEFAULT_WINDOW_POLICY = f"ends+every_{_DEFAULT_EVERY}"


@dataclasses.dataclass(frozen=True)
class WindowPolicy:
    """Stop points at a request's ends, and every `every_pages` pages (1: every boundary,
    None: at the ends only). Build one from its name with `WindowPolicy.parse`."""

    every_pages: int | None = _DEFAULT_EVERY

    def __post_init__(self):
        n = self.every_pages
        if n is not None and (not _is_int(n) or n < 1):
            raise ValueError(f"every_pages must be an int >= 1 or None, got {n!r}")

    @classmethod
    def parse(cls, name: str) -> WindowPolicy:
        """'every', 'ends' or 'ends+every_N' (N >= 1; 'ends+every_1' is 'every')."""
        if name == "every":
            return cls(1)
        if name == "ends":
            return cls(None)
        m = _EVERY_N.fullmatch(name) if isinstance(name, str) else None
        if m is None or int(m.group(1)) < 1:
            raise ValueError(f"window policy {name!r}: expected 'every', 'ends' or 'ends+every_N' with N >= 1")
        return cls(int(m.group(1)))

    @property
    def name(self) -> str:
        if self.every_pages == 1:
            return "every"
        return "ends" if self.every_pages is None else f"ends+every_{self.every_pages}"

    def stop_points(self, num_tokens: int, page_size: int, cached_pages: int = 0,
                    ends: Iterable[int] | None = None) -> tuple[int, ...]:
        """Page boundaries b with cached_pages < b <= num_tokens // page_size whose window
        this request keeps, ascending. `ends`: token positions where a later request may
        resume (0..num_tokens; default: num_tokens alone), each rounded down to a page."""
        whole = self._whole(num_tokens, page_size, cached_pages)
        ends = (num_tokens,) if ends is None else tuple(ends)
        for e in ends:
            if not _is_int(e) or not 0 <= e <= num_tokens:
                raise ValueError(f"request end {e!r} is not a token position in 0..{num_tokens}")
        points = {e // page_size for e in ends}
        if self.every_pages is not None:
            n = self.every_pages
            points.update(range(-(-(cached_pages + 1) // n) * n, whole + 1, n))
        return tuple(sorted(b for b in points if cached_pages < b <= whole))

    def keep_pages(self, num_tokens: int, page_size: int, window_pages: int, cached_pages: int = 0,
                   ends: Iterable[int] | None = None) -> frozenset[int]:
        """Logical pages whose SWA page the request keeps at insert: the window of each stop
        point, less the pages below `cached_pages` (the tree's, not this request's).

        `num_tokens`: tokens the request inserts (its whole pages, num_tokens // page_size,
        are what the tree gets); `window_pages`: SWA pages a stop point needs (0: no
        sliding window, nothing to keep); `cached_pages`: leading pages already cached
        when the request started (its matched prefix)."""
        if not _is_int(window_pages) or window_pages < 0:
            raise ValueError(f"window_pages must be an int >= 0, got {window_pages!r}")
        points = self.stop_points(num_tokens, page_size, cached_pages, ends)
        if window_pages == 0:
            return frozenset()
        if self.every_pages == 1:     # every boundary: the windows tile every page
            return frozenset(range(cached_pages, self._whole(num_tokens, page_size, cached_pages)))
        return frozenset(q for b in points for q in range(max(cached_pages, b - window_pages), b))

    @staticmethod
    def _whole(num_tokens: int, page_size: int, cached_pages: int) -> int:
        if not _is_int(page_size) or page_size < 1:
            raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
        if not _is_int(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        whole = num_tokens // page_size
        if not _is_int(cached_pages) or not 0 <= cached_pages <= whole:
            raise ValueError(f"cached_pages must be an int in 0..{whole} (whole pages of {num_tokens} tokens), "
                             f"got {cached_pages!r}")
        return whole


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)
