"""`PrefetchPath`: pages that reach the host tier from below it (L3 prefetch, snapshot restore),
and host copies handed down to it.

A prefetch extends the tree's coverage of a prompt with pages the storage tier holds:
`start_prefetch` reserves host pages (the anchor's for every page, each window
allocator's for the trailing window of the stop) once the caller knows the store has
them, within a share of the host tier; the bytes land in the caller's staging; and
`finish_prefetch` attaches the pages that arrived as one HOST node where the tree's
coverage of the prompt ends *then* (another request may have inserted some meanwhile),
and frees every reserved page it did not attach. On every path each reservation ends:
the ledger counts reserved pages until then.

    tree coverage      [0 .. start)          prefetched [start .. start + pages)
    window (SWA) pages                       the last window_pages pages before the stop
"""
from __future__ import annotations

import numpy as np

from hicache_jax import validate
from hicache_jax.tree.book import PrefetchRecord
from hicache_jax.tree.evict import HostEviction
from hicache_jax.tree.match import as_tokens
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.results import HostCopy, PrefetchId, PrefetchJob, PrefetchOutcome
from hicache_jax.tree.parts import TreeParts
from hicache_jax.tree.state import HOLDS_HOST, HOST, HOST_DURABLE, Residency, Tier


class PrefetchPath:
    def __init__(self, parts: TreeParts, host_eviction: HostEviction, share: float):
        self._components, self._policy, self._tree, self._ledger = parts.components, parts.policy, parts.tree, parts.ledger
        self._book, self._locks, self._candidates, self._host_eviction = parts.book, parts.locks, parts.candidates, host_eviction
        self._clock, self._stats, self._share = parts.clock, parts.stats, share
        self._page = parts.page_size

    def coverage(self, tokens) -> int:
        """Leading whole pages of `tokens` the tree holds in any state (where a prefetch starts)."""
        tokens = as_tokens(tokens)
        path = self._tree.walk(tokens[: len(tokens) // self._page * self._page])
        return sum(m for _, m in path) // self._page

    def start_prefetch(self, tokens, start: int, pages: int) -> PrefetchJob | PrefetchOutcome:
        """Reserve host pages for the prompt's pages `start .. start + pages`, which the storage
        tier holds (ask it first: nothing is reserved for pages it lacks)."""
        tokens = as_tokens(tokens)
        start, pages = validate.count("start", start), validate.count("pages", pages, minimum=1)
        if (start + pages) * self._page > len(tokens):
            raise ValueError(f"prefetch of pages {start}..{start + pages} past the prompt's "
                             f"{len(tokens) // self._page} whole pages")
        why, job = self._start(tokens[: (start + pages) * self._page], start, pages)
        if why is not None:
            self._stats.prefetches[why] += 1
            return why
        return job

    def _start(self, tokens: np.ndarray, start: int, pages: int):
        path = self._tree.walk(tokens[: start * self._page])
        if sum(m for _, m in path) != start * self._page:
            return PrefetchOutcome.STALE, None      # the tree no longer covers exactly `start` pages
        holder = path[-1][0] if path else self._tree.root   # it may go on differently: split when attaching
        if not self._may_extend(holder):
            return PrefetchOutcome.UNBACKED_PREFIX, None
        logical = {self._components.anchor.name: np.arange(start, start + pages)}
        for c in self._components.windows:
            logical[c.name] = np.arange(max(start, start + pages - c.window_pages), start + pages)
        need = {a: int(v.size) for a, v in logical.items()}
        host = self._ledger.allocators(Tier.HOST)
        if any(self._book.reserved(a) + n > self._share * host[a].capacity for a, n in need.items()):
            return PrefetchOutcome.NO_HOST_SPACE, None
        got = self._ledger.take(Tier.HOST, need, reclaim=self._host_eviction.evict)
        if got is None:
            return PrefetchOutcome.NO_HOST_SPACE, None
        record = PrefetchRecord(self._locks.lock(holder), tokens, start, pages, got, logical)
        pid = self._book.start_prefetch(record)
        return None, PrefetchJob(pid, start, pages, got, logical)

    def _may_extend(self, node: Node) -> bool:
        """A host-only child may hang below `node` (write-through keeps host copies closed under parent)."""
        return node.parent is None or not self._policy.closed_under_parent or node.state in HOLDS_HOST

    def finish_prefetch(self, pid: PrefetchId, served: int) -> tuple[int, int]:
        """The first `served` pages of prefetch `pid` are in their reserved host pages. Attach
        what is usable (all of it, or for a layout with windows only a complete fetch: a
        partial one lacks the window at its stop); free the rest. Returns the attached
        logical pages as (first, end), empty when none."""
        record = self._book.end_prefetch(pid)
        self._locks.unlock(record.lock)
        served = validate.count("served", served)
        usable = served if served == record.pages or not self._components.windows else 0
        first = end = record.start + usable
        if usable:
            first, end = self.attach(record.tokens[: end * self._page], record.start, record.reserved, record.logical)
        else:                                     # nothing usable: the whole reservation goes back
            for allocator, pages in record.reserved.items():
                self._ledger.free(Tier.HOST, allocator, pages)
        outcome = (PrefetchOutcome.LANDED if end - first == record.pages else
                   PrefetchOutcome.PARTIAL if end > first else PrefetchOutcome.USELESS)
        self._stats.prefetches[outcome if served else PrefetchOutcome.FAILED] += 1
        return first, end

    def attach(self, tokens: np.ndarray, start: int, host_pages: dict[str, np.ndarray],
               logical: dict[str, np.ndarray]) -> tuple[int, int]:
        """Give host pages holding `tokens`' pages from `start` on (per allocator: `logical[a][i]`
        is in `host_pages[a][i]`) to the tree as one HOST node where its coverage of `tokens`
        ends, if that is within them and the node above may have a host-only child. Every
        page not attached is freed. Returns the attached logical pages (first, end)."""
        end = len(tokens) // self._page
        path = self._tree.walk(tokens)
        cover = sum(m for _, m in path) // self._page
        parent = path[-1][0] if path else self._tree.root
        if path and path[-1][1] < len(parent.tokens):       # the tree goes on differently inside it
            parent = self._tree.split(parent, path[-1][1])
        first = cover
        if not start <= cover < end or not self._may_extend(parent):
            first = end                                      # nothing to attach
        node = None
        if first < end:
            node = self._tree.add(parent, tokens[first * self._page:], Residency.HOST)
        for c in self._components:
            pages = np.asarray(host_pages.get(c.name, ()), np.int64)
            where = np.asarray(logical.get(c.name, ()), np.int64)
            mine = (where >= first) & (where < end) if node is not None else np.zeros(pages.size, bool)
            if node is not None and c.index == 0:
                self._ledger.attach(node, Tier.HOST, pages[mine])
            elif node is not None:
                for lp, hp in zip(where[mine], pages[mine]):
                    self._ledger.set_window(node, Tier.HOST, c.index, int(lp) - first, int(hp))
            self._ledger.free(Tier.HOST, c.name, pages[~mine])
        if node is not None:
            node.last_access = self._clock.tick()
            self._candidates.offer(node)
            self._candidates.offer(parent)
        return (first, end) if node is not None else (end, end)

    @staticmethod
    def has_host_copy(node: Node) -> bool:
        """`node`'s host copy is durable (landed, and no write to it is pending)."""
        return node.state in HOST_DURABLE and node.write_id is None

    def host_copy(self, node: Node) -> HostCopy | None:
        """`node`'s durable host copy (None when it has none)."""
        if not self.has_host_copy(node):
            return None
        tokens = np.concatenate([n.tokens for n in reversed(list(node.path_to_root()))])
        first = len(tokens) // self._page - len(node.tokens) // self._page
        logical, host = {}, {}
        for c in self._components:
            arr = node.pages[HOST][c.index]
            keep = np.arange(arr.size) if c.index == 0 else np.flatnonzero(arr != ABSENT)
            logical[c.name], host[c.name] = first + keep, arr[keep]
        return HostCopy(tokens, logical, host)
