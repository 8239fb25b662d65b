"""`StorageTier`: L3 pages of one layout over one backend, moved to and from host rows.

The cache asks three things of L3, each a bounded call that never raises into the loop:

- `usable_prefix(pages)`: how many leading pages of a prompt L3 can serve. A page counts
  only when every kv-derived object of it is stored (every pool, every TP rank), and a
  stop point only when its trailing window (SWA + state pools) is stored too. A miss costs
  one `exists` round trip; a hit a few more (the window).
- `get_pages(allocator, pages, rows, row_ids)`: read pages into host rows, in place.
  Only the leading `served` pages of the result hold data; rows past them are garbage.
- `put_pages(allocator, pages, rows, row_ids)`: write pages from host rows, skipping
  objects already stored (one `contains` round trip per batch).

`pages` are chained page hashes (`page_hashes(tokens)`); `rows` is an allocator's host
buffer as a numpy array `[host_pages, row_elems]` (any dtype), `row_ids` the row of each
page. Reads and writes run in the background and return a `StorageOp`: the rows of a call
must stay reserved (not reused, not freed) until its `done()`, also after the caller
stopped waiting for it. Batches hold at most `MAX_BATCH_PAGES` pages.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hicache_jax.config import StorageConfig
from hicache_jax.layout import PoolLayout
from hicache_jax.storage.backend import MAX_BATCH_PAGES, StorageBackend, as_bytes
from hicache_jax.storage.guard import Guard, StorageOp
from hicache_jax.storage.keys import KeySpace, PageHash, page_hashes
from hicache_jax.storage.objects import HEADER_BYTES, MissReason, make_header, verify
from hicache_jax.storage.rows import PageObjects, byte_allocators
from hicache_jax.storage.stats import StorageCounters, StorageStats

FIRST_BATCH_PAGES = 8   # pages of a lookup's first `exists` call


@dataclasses.dataclass(frozen=True)
class GetResult:
    pages: int                     # pages asked for
    served: int                    # leading pages whose every object verified: only their rows hold data
    misses: Mapping[str, int]      # reason -> objects not served (a failed call: all of them)


@dataclasses.dataclass(frozen=True)
class PutResult:
    pages: int
    written: int                   # objects written
    skipped: int                   # objects already stored
    failed: int                    # objects not written (refused by the store, or the call failed)
    reason: MissReason | None = None   # why the whole call failed, if it did


class StorageTier:
    """L3 for one layout and TP size over `backend` (see the module docstring)."""

    def __init__(self, layout: PoolLayout, backend: StorageBackend, config: StorageConfig = StorageConfig(), *,
                 tp: int = 1, clock: Callable[[], float] = time.monotonic):
        if not isinstance(config, StorageConfig):
            raise ValueError(f"config must be a StorageConfig, got {type(config).__name__}")
        self.layout, self.backend, self.config = layout, backend, config
        self.keys = KeySpace(layout, config.model_id, tp)
        self.rows = {a: PageObjects.create(self.keys, a) for a in byte_allocators(layout)}
        self.anchor = layout.anchor.name
        self.window = layout.swa_pool.name if layout.swa_pool is not None else None
        self.counters = StorageCounters([p.name for p in layout.byte_pools])
        self.guard = Guard(self.counters, config.io_threads, config.call_timeout_s, config.retry_after_s, clock)

    def page_hashes(self, tokens, prior: PageHash | None = None) -> list[PageHash]:
        return page_hashes(tokens, self.layout.page_size, prior)

    def exists_prefix(self, pages: Sequence[PageHash]) -> int:
        """Leading pages whose every kv-derived object is stored (a miss: one `exists` call)."""
        pages = _checked(pages)
        return self.guard.call("exists", lambda: self._leading(self.anchor, pages), lambda _: 0)

    def window_present(self, pages: Sequence[PageHash], stop: int) -> bool:
        """Whether the window before `stop` (pages `[stop - window_pages, stop)`) is stored."""
        pages = _checked(pages)
        if not isinstance(stop, int) or not 0 <= stop <= len(pages):
            raise ValueError(f"stop must be an int in 0..{len(pages)}, got {stop!r}")
        if self.window is None:
            return True
        window = pages[max(0, stop - self.layout.window_pages()):stop]
        return self.guard.call("exists", lambda: self._leading(self.window, window) == len(window), lambda _: False)

    def usable_prefix(self, pages: Sequence[PageHash]) -> int:
        """The longest k-page prefix L3 can serve whole: kv-derived pages and the window at k."""
        pages = _checked(pages)
        def lookup() -> int:
            n = self._leading(self.anchor, pages)
            return self._window_stop(pages, n) if n and self.window is not None else n
        found = self.guard.call("lookup", lookup, lambda _: 0)
        self.counters.lookup(found)
        return found

    def get_pages(self, allocator: str, pages: Sequence[PageHash], rows: np.ndarray,
                  row_ids: Sequence[int]) -> StorageOp[GetResult]:
        """Read `pages` of `allocator` into `rows[row_ids]` in the background."""
        layout, pages = self._row_layout(allocator), _checked(pages)
        view, ids = self._row_view(layout, rows, row_ids, len(pages), write=True)
        objects = len(pages) * len(layout.spans)
        return self.guard.submit("get", lambda: self._get(layout, pages, view, ids),
                                 lambda reason: GetResult(len(pages), 0, {str(reason): objects}))

    def put_pages(self, allocator: str, pages: Sequence[PageHash], rows: np.ndarray,
                  row_ids: Sequence[int]) -> StorageOp[PutResult]:
        """Write `pages` of `allocator` from `rows[row_ids]` in the background."""
        layout, pages = self._row_layout(allocator), _checked(pages)
        view, ids = self._row_view(layout, rows, row_ids, len(pages), write=False)
        objects = len(pages) * len(layout.spans)
        return self.guard.submit("put", lambda: self._put(layout, pages, view, ids),
                                 lambda reason: PutResult(len(pages), 0, 0, objects, reason))

    def register(self, rows: np.ndarray) -> None:
        """Tell the backend a host buffer will be moved often (Mooncake registers it once)."""
        self.guard.call("register", lambda: self.backend.register(rows), lambda _: None)

    def stats(self) -> StorageStats:
        return self.counters.snapshot(self.guard.degraded)

    def close(self) -> None:
        self.guard.close()
        self.backend.close()

    # -- on the I/O threads -------------------------------------------------------------

    def _leading(self, allocator: str, pages: Sequence[PageHash]) -> int:
        layout = self.rows[allocator]
        found = 0
        # The first call asks for FIRST_BATCH_PAGES pages only: most lookups of a new prompt
        # miss at page 0, and an engine's cost grows with the keys it is asked about
        # (ocdbt: one B-tree lookup each). A hit pays one more round trip.
        for start, stop in _batch_bounds(len(pages)):
            batch = pages[start:stop]
            self.counters.call("exists")
            whole = self.backend.exists(self._texts(layout, batch)) // len(layout.spans)
            found += whole
            if whole < len(batch):
                break
        return found

    def _window_stop(self, pages: Sequence[PageHash], n: int) -> int:
        """The largest stop k <= n whose window is stored (0: none). The SWA pool's flags
        come in one `contains` per 128 pages, from the end; each candidate is then checked
        over every window pool (state pools too) with one `exists`."""
        wp = self.layout.window_pages()
        swa = (self.layout.pool(self.window),)
        flags: list[bool] = []        # SWA object present, pages [lo, n)
        lo = n
        for k in range(n, 0, -1):
            while lo > max(0, k - wp):
                start = max(0, lo - MAX_BATCH_PAGES)
                keys = self.keys.page_keys(swa, pages[start:lo])
                self.counters.call("contains")
                present = self.backend.contains([key.text for key in keys])
                per_page = len(present) // (lo - start)
                flags = [all(present[i:i + per_page]) for i in range(0, len(present), per_page)] + flags
                lo = start
            window = range(max(0, k - wp), k)
            if all(flags[i - lo] for i in window) and self._leading(self.window, pages[window.start:k]) == len(window):
                return k
        return 0

    def _get(self, layout: PageObjects, pages: list[PageHash], view: np.ndarray, ids: np.ndarray) -> GetResult:
        misses: Counter = Counter()
        served = 0
        per_page = len(layout.spans)
        headers = np.empty((min(len(pages), MAX_BATCH_PAGES) * per_page, HEADER_BYTES), np.uint8)
        for start in range(0, len(pages), MAX_BATCH_PAGES):
            batch = pages[start:start + MAX_BATCH_PAGES]
            texts = self._texts(layout, batch)
            into = [(headers[i * per_page + j], _payload(view, ids[start + i], seg))
                    for i in range(len(batch)) for j, seg in enumerate(layout.spans)]
            self.counters.call("get")
            sizes = self.backend.get(texts, into)
            good = []
            for text, size, (header, payload), seg in zip(texts, sizes, into, layout.spans * len(batch), strict=True):
                reason = size if isinstance(size, MissReason) else verify(text, size, header, payload)
                if reason is None:
                    self.counters.pool(seg.pool, read_objects=1, read_bytes=seg.nbytes)
                else:
                    misses[str(reason)] += 1
                    self.counters.miss(seg.pool, reason)
                good.append(reason is None)
            whole = next((i for i in range(len(batch)) if not all(good[i * per_page:(i + 1) * per_page])), len(batch))
            served += whole
            if whole < len(batch):
                break
        return GetResult(len(pages), served, dict(misses))

    def _put(self, layout: PageObjects, pages: list[PageHash], view: np.ndarray, ids: np.ndarray) -> PutResult:
        written = skipped = failed = 0
        per_page = len(layout.spans)
        for start in range(0, len(pages), MAX_BATCH_PAGES):
            texts = self._texts(layout, pages[start:start + MAX_BATCH_PAGES])
            self.counters.call("contains")
            present = self.backend.contains(texts)
            todo = [i for i, p in enumerate(present) if not p]
            for i, p in enumerate(present):
                if p:
                    self.counters.pool(layout.spans[i % per_page].pool, skipped_objects=1)
            skipped += len(present) - len(todo)
            if not todo:
                continue
            payloads = [_payload(view, ids[start + i // per_page], layout.spans[i % per_page]) for i in todo]
            objects = [(make_header(texts[i], p), p) for i, p in zip(todo, payloads)]
            self.counters.call("put")
            ok = self.backend.put([texts[i] for i in todo], objects)
            for i, done in zip(todo, ok, strict=True):
                seg = layout.spans[i % per_page]
                if done:
                    self.counters.pool(seg.pool, written_objects=1, written_bytes=seg.nbytes)
                else:
                    self.counters.pool(seg.pool, write_failures=1)
            written += sum(ok)
            failed += len(ok) - sum(ok)
        return PutResult(len(pages), written, skipped, failed)

    # -- helpers ------------------------------------------------------------------------

    def _texts(self, layout: PageObjects, pages: Sequence[PageHash]) -> list[str]:
        return [k.text for k in self.keys.page_keys(layout.pools, pages)]

    def _row_layout(self, allocator: str) -> PageObjects:
        if allocator not in self.rows:
            raise ValueError(f"no L3 objects for allocator {allocator!r} (allocators with bytes: {sorted(self.rows)})")
        return self.rows[allocator]

    def _row_view(self, layout: PageObjects, rows: np.ndarray, row_ids: Sequence[int], n: int,
                  write: bool) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(rows, np.ndarray) or rows.ndim != 2:
            raise ValueError(f"rows must be a 2-D numpy array [host_pages, row_elems], got {type(rows).__name__} "
                             f"of shape {getattr(rows, 'shape', None)}")
        view = as_bytes(rows).reshape(rows.shape[0], -1)
        if view.shape[1] != layout.row_bytes:
            raise ValueError(f"a host row of allocator {layout.allocator!r} is {layout.row_bytes} bytes, "
                             f"got rows of {view.shape[1]} bytes")
        if write and not rows.flags.writeable:
            raise ValueError("rows to read pages into must be writeable")
        ids = np.asarray(row_ids, dtype=np.int64)
        if ids.shape != (n,):
            raise ValueError(f"row_ids must hold one row per page ({n}), got shape {ids.shape}")
        if n and (ids.min() < 0 or ids.max() >= rows.shape[0]):
            raise ValueError(f"row_ids must be in 0..{rows.shape[0] - 1}, got {ids.min()}..{ids.max()}")
        if write and len(set(ids.tolist())) != n:
            raise ValueError("row_ids to read pages into must be distinct")
        return view, ids


def _checked(pages: Sequence[PageHash]) -> list[PageHash]:
    """A caller's page hashes, checked here: a bad one must raise to the caller, not fail
    on an I/O thread, where it would count as a store error and degrade L3."""
    pages = list(pages)
    bad = next((p for p in pages if not isinstance(p, bytes) or len(p) != 32), None)
    if bad is not None:
        raise ValueError(f"pages must be 32-byte page hashes (page_hashes(tokens)), got {bad!r}")
    return pages


def _batch_bounds(n: int) -> list[tuple[int, int]]:
    """[start, stop) of each `exists` batch over n pages: FIRST_BATCH_PAGES, then MAX_BATCH_PAGES each."""
    bounds, start = [], 0
    while start < n:
        stop = min(n, start + (FIRST_BATCH_PAGES if start == 0 else MAX_BATCH_PAGES))
        bounds.append((start, stop))
        start = stop
    return bounds


def _payload(view: np.ndarray, row: int, seg) -> np.ndarray:
    return view[row, seg.offset:seg.offset + seg.nbytes]
