"""`ReadPath` (host -> device): load-backs of a match's host part, with one owner per node.

`start_load(match)` re-checks the match against the tree, refuses (the request
recomputes) when the move is not worth it or a node is owned by another load, locks the
whole path, allocates device pages for every component at once (evicting only when that
can succeed), and marks the host-only nodes LOADING. Of each window component only the
pages of the trailing window above the match point are brought back. `finish_load` /
`fail_load` end it.

Two locks pin the path: the load's own, released when the transfer ends, and the
caller's (`LoadJob.lock`), released only by the caller, so the loaded pages cannot be
evicted between the load landing and the request using them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hicache_jax.layout import PoolLayout
from hicache_jax.plan import Direction, make_plan
from hicache_jax.tree.book import LoadRecord
from hicache_jax.tree.components import Components
from hicache_jax.tree.match import MatchResult
from hicache_jax.tree.matcher import Matcher
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.results import LoadId, LoadJob, Refusal
from hicache_jax.tree.device_evict import DeviceEviction
from hicache_jax.tree.parts import TreeParts
from hicache_jax.tree.state import DEVICE_VALID, Event, Residency, Tier


@dataclasses.dataclass(frozen=True)
class LoadCost:
    """Is moving a host hit (its bytes over the link, plus a fixed `overhead_seconds` of
    host time) faster than recomputing it? (No recompute cost set: always load.)"""

    recompute_seconds_per_token: float | None = None
    link_bytes_per_second: float = 25e9
    overhead_seconds: float = 0.0

    def worth_it(self, layout: PoolLayout, components: Components, match: MatchResult) -> bool:
        if self.recompute_seconds_per_token is None or match.host_len == 0:
            return True
        pages = match.total_len // layout.page_size
        moved = match.host_len * layout.bytes_per_token() + sum(
            layout.page_bytes_of(c.name) * min(c.window_pages, pages) for c in components.windows)
        seconds = self.overhead_seconds + moved / self.link_bytes_per_second
        return seconds <= match.host_len * self.recompute_seconds_per_token


class ReadPath:
    def __init__(self, parts: TreeParts, matcher: Matcher, device_eviction: DeviceEviction, threshold: int,
                 cost: LoadCost):
        self._layout, self._components, self._tree, self._ledger = parts.layout, parts.components, parts.tree, parts.ledger
        self._book, self._locks, self._candidates, self._pruner = parts.book, parts.locks, parts.candidates, parts.pruner
        self._matcher, self._clock, self._stats = matcher, parts.clock, parts.stats
        self._take_device = device_eviction.take
        self._threshold, self._cost = threshold, cost

    def start_load(self, match: MatchResult) -> LoadJob | Refusal:
        if not isinstance(match, MatchResult):
            raise ValueError(f"start_load takes a MatchResult, got {type(match).__name__}")
        why, job = self._start(match)
        if why is not None:
            self._stats.refusals[why] += 1
            return why
        self._stats.loads_started += 1
        return job

    def anchor_host_pages(self, match: MatchResult) -> np.ndarray | None:
        """The anchor's host pages a load of `match` would move, in order (None when the match
        is stale or has no host part); changes nothing. For starting the copy early."""
        node = self._tree.get(int(match.host_node))
        if node is None or node.parent is None:
            return None
        chain, rest = self._chain(node)
        if sum(len(n.tokens) for n in chain) != match.total_len or not rest:
            return None
        pages = [n.pages[Tier.HOST][0] for n in rest]
        return np.concatenate(pages) if all(p is not None for p in pages) else None

    @staticmethod
    def _chain(node: Node) -> tuple[list[Node], list[Node]]:
        """Root-first path to `node`, and its part after the last device-valid node."""
        chain = list(node.path_to_root())[::-1]
        return chain, chain[next((i for i, n in enumerate(chain) if n.state not in DEVICE_VALID), len(chain)):]

    def _start(self, match: MatchResult) -> tuple[Refusal | None, LoadJob | None]:
        page = self._layout.page_size
        node = self._tree.get(int(match.host_node))
        if node is None or node.parent is None:
            return (Refusal.STALE if node is None else Refusal.EMPTY), None
        chain, rest = self._chain(node)
        if sum(len(n.tokens) for n in chain) != match.total_len:
            return Refusal.STALE, None
        for n in rest:
            if n.load_id is not None:
                return Refusal.OWNED, None
            if n.state is Residency.HOST_PENDING:
                return Refusal.PENDING, None
            if n.state is not Residency.HOST:
                return Refusal.STALE, None
        needs = {}
        for c in self._components.windows:
            needs[c.index] = self._window_needs(chain, c.index, c.window_pages)
            if isinstance(needs[c.index], Refusal):
                return needs[c.index], None
        full_pages = sum(len(n.tokens) for n in rest) // page
        windows_move = any(needs.values())
        if full_pages == 0 and not windows_move:
            return Refusal.EMPTY, None
        if full_pages * page < max(1, self._threshold) and not windows_move:
            return Refusal.BELOW_THRESHOLD, None
        if not self._cost.worth_it(self._layout, self._components, match):
            return Refusal.NOT_WORTH_IT, None

        lock = self._locks.lock(node)         # before eviction may run: protects the whole path
        need = {c.name: full_pages if c.index == 0 else len(needs[c.index]) for c in self._components}
        got = self._take_device(need)
        if got is None:
            self._locks.unlock(lock)
            return Refusal.NO_DEVICE_SPACE, None
        filled = {c.index: set(got[c.name].tolist()) for c in self._components.windows}
        load_id = self._book.start_load(LoadRecord(lock, filled))
        anchor = self._components.anchor.name
        dev_pages, host_pages, offset = got[anchor], [], 0
        for n in rest:
            k = len(n.tokens) // page
            self._ledger.attach(n, Tier.DEVICE, dev_pages[offset:offset + k].copy())
            host_pages.append(n.pages[Tier.HOST][0])
            offset += k
            n.apply(Event.START_LOAD)
            self._book.own(n, load_id)
        pages = {anchor: (dev_pages, np.concatenate(host_pages) if host_pages else np.zeros(0, np.int32))}
        for c in self._components.windows:
            dev, host = got[c.name], []
            for (n, i), p in zip(needs[c.index], dev):
                self._ledger.set_window(n, Tier.DEVICE, c.index, i, int(p))
                host.append(n.pages[Tier.HOST][c.index][i])
                self._book.own(n, load_id)
            if needs[c.index]:
                pages[c.name] = (dev, np.asarray(host, np.int32))
        plan = make_plan(self._layout, Direction.LOAD, pages, validate=False)
        table, windows = self._matcher.device_tables(chain)
        return None, LoadJob(load_id, plan, node.id, match.total_len, full_pages * page, table, windows,
                             self._locks.lock(node))   # the caller's pin, from now until it unlocks

    def _window_needs(self, chain: list[Node], k: int, window: int) -> list[tuple[Node, int]] | Refusal:
        """(node, page index) of trailing-window pages of component `k` that must come from the host."""
        needs, left, page = [], window, self._layout.page_size
        for n in reversed(chain):
            for i in range(len(n.tokens) // page - 1, -1, -1):
                if left == 0:
                    return needs[::-1]
                left -= 1
                if n.state in DEVICE_VALID:
                    if n.load_id is not None:
                        return Refusal.OWNED
                    if n.pages[Tier.DEVICE][k][i] != ABSENT:
                        continue
                host = n.pages[Tier.HOST][k]
                if host is not None and host[i] != ABSENT:
                    needs.append((n, i))
                else:
                    return Refusal.STALE
        return needs[::-1]

    # -- completion --------------------------------------------------------------------------
    def finish_load(self, load_id: LoadId) -> None:
        """Load `load_id` landed: its nodes' device pages are valid from now on."""
        record = self._book.end_load(load_id)
        for n in record.nodes:
            if n.state is Residency.LOADING:
                n.apply(Event.LOAD_DONE)
        for n in record.drop_host:
            if n.state is Residency.SYNCED:
                self._ledger.drop(n, Tier.HOST)
                n.apply(Event.DROP_HOST)
        self._end(record)

    def fail_load(self, load_id: LoadId) -> None:
        """Load `load_id` raised: its device pages are freed, its nodes stay host-only."""
        record = self._book.end_load(load_id)
        for n in record.nodes:
            if n.state is Residency.LOADING:
                self._ledger.drop(n, Tier.DEVICE)
                n.apply(Event.LOAD_FAILED)
            else:
                for k, filled in record.filled_windows.items():
                    arr = n.pages[Tier.DEVICE][k]
                    if arr is not None:
                        self._ledger.drop_window(n, Tier.DEVICE, k, np.isin(arr, list(filled)))
        for n in record.drop_host:      # host-only below an unbacked parent: unreachable
            if n.state is Residency.HOST and n.parent is not None:
                self._pruner.remove_subtree(n)
        self._stats.loads_failed += 1
        self._end(record)

    def _end(self, record: LoadRecord) -> None:
        self._locks.unlock(record.lock)
        now = self._clock.tick()
        for n in record.nodes:
            if n.state is not Residency.GONE:
                n.last_access = now
                self._candidates.offer(n)

