"""The read path (host -> device): load-backs of a match's host part, with one owner per node.

`start_load(match)` re-checks the match against the tree, refuses (the request recomputes)
when the move is not worth it or a node is owned by another load, locks the whole path,
allocates device pages for every pool at once (evicting LRU device leaves once if short),
and marks the host-only nodes LOADING. Only the SWA pages of the trailing window above the
match point are brought back. `finish_load` / `fail_load` end it.

Two locks pin the path: the load's own, released when the transfer ends, and the
caller's (`LoadJob.lock`), released only by the caller, so the loaded pages cannot be
evicted between the load landing and the request using them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hicache_jax.plan import Direction, make_plan
from hicache_jax.tree.match import MatchResult
from hicache_jax.tree.node import ABSENT, Node
from hicache_jax.tree.policy import LoadJob, LockId, Refusal
from hicache_jax.tree.state import DEVICE_VALID, Event, Residency


@dataclasses.dataclass
class _Load:
    nodes: set[Node]          # nodes stamped with this load id (split halves included)
    swa_assigned: set[int]    # SWA device pages this load fills
    lock: LockId
    drop_host: set[Node] = dataclasses.field(default_factory=set)  # closure repair at the end


class ReadPath:
    def _init_read_path(self) -> None:
        self._loads: dict[int, _Load] = {}
        self._next_load = 1

    def start_load(self, match: MatchResult) -> LoadJob | Refusal:
        if not isinstance(match, MatchResult):
            raise ValueError(f"start_load takes a MatchResult, got {type(match).__name__}")
        node = self._by_id.get(int(match.host_node))
        if node is None or node.parent is None:
            return self._refuse(Refusal.STALE if node is None else Refusal.EMPTY)
        chain = list(node.path_to_root())[::-1]
        if sum(len(n.tokens) for n in chain) != match.total_len:
            return self._refuse(Refusal.STALE)
        cut = next((i for i, n in enumerate(chain) if n.state not in DEVICE_VALID), len(chain))
        rest = chain[cut:]
        for n in rest:
            if n.load_id is not None:
                return self._refuse(Refusal.OWNED)
            if n.state is Residency.HOST_PENDING:
                return self._refuse(Refusal.PENDING)
            if n.state is not Residency.HOST:
                return self._refuse(Refusal.STALE)
        swa_needs = self._window_swa_needs(chain)
        if isinstance(swa_needs, Refusal):
            return self._refuse(swa_needs)
        full_pages = sum(len(n.tokens) for n in rest) // self.page_size
        if full_pages == 0 and not swa_needs:
            return self._refuse(Refusal.EMPTY)
        if full_pages * self.page_size < max(1, self.load_back_threshold) and not swa_needs:
            return self._refuse(Refusal.BELOW_THRESHOLD)

        lock = self._lock(node)         # before eviction may run: protects the whole path
        need = {self.anchor: full_pages}
        if self.swa is not None:
            need[self.swa] = len(swa_needs)
        got = self._resolve_device(need)
        if got is None:
            self.unlock(lock)
            return self._refuse(Refusal.NO_DEVICE_SPACE)
        load_id = self._next_load
        self._next_load += 1
        record = _Load(set(), set(got.get(self.swa).tolist()) if self.swa else set(), lock)
        dev_pages, host_pages, offset = got.get(self.anchor), [], 0
        for n in rest:
            k = len(n.tokens) // self.page_size
            n.device = dev_pages[offset:offset + k].copy()
            host_pages.append(n.host)
            offset += k
            if self.swa is not None:
                n.swa_device = np.full(k, ABSENT, np.int32)
            n.apply(Event.START_LOAD)
            self._own(n, load_id, record)
        swa_dev, swa_host = got.get(self.swa) if self.swa else np.zeros(0, np.int32), []
        for (n, i), page in zip(swa_needs, swa_dev):
            n.swa_device[i] = page
            swa_host.append(n.swa_host[i])
            self._own(n, load_id, record)
        self._loads[load_id] = record
        pages = {self.anchor: (dev_pages, np.concatenate(host_pages) if host_pages else np.zeros(0, np.int32))}
        if swa_needs:
            pages[self.swa] = (swa_dev, np.asarray(swa_host, np.int32))
        plan = make_plan(self.layout, Direction.LOAD, pages)
        table, window = self._device_tables(chain)
        self.events["load_started"] += 1
        # the caller's pin: from now until the caller unlocks it, whether or not the load lands
        return LoadJob(load_id, plan, node.id, match.total_len, full_pages * self.page_size, table, window,
                       self._lock(node))

    def _own(self, node: Node, load_id: int, record: _Load) -> None:
        if node.load_id not in (None, load_id):
            raise AssertionError(f"bug: {node} claimed by load {load_id} while owned by load {node.load_id}")
        node.load_id = load_id
        record.nodes.add(node)

    def _window_swa_needs(self, chain: list[Node]) -> list[tuple[Node, int]] | Refusal:
        """(node, page index) of trailing-window pages whose SWA must come from the host."""
        if self.swa is None:
            return []
        needs, left = [], self.window_pages
        for n in reversed(chain):
            for i in range(len(n.tokens) // self.page_size - 1, -1, -1):
                if left == 0:
                    return needs[::-1]
                left -= 1
                if n.state in DEVICE_VALID:
                    if n.load_id is not None:
                        return Refusal.OWNED
                    if n.swa_device[i] != ABSENT:
                        continue
                if n.swa_host is not None and n.swa_host[i] != ABSENT:
                    needs.append((n, i))
                else:
                    return Refusal.STALE
        return needs[::-1]

    def _refuse(self, why: Refusal) -> Refusal:
        self.events[f"load_refused_{why.value}"] += 1
        return why

    def finish_load(self, load_id: int) -> None:
        """Load `load_id` landed: its nodes' device pages are valid from now on."""
        record = self._pop_load(load_id)
        for n in record.nodes:
            n.load_id = None
            if n.state is Residency.LOADING:
                n.apply(Event.LOAD_DONE)
        for n in record.drop_host:
            if n.state is Residency.SYNCED:
                self._free_host_pages(n)
                n.apply(Event.DROP_HOST)
        self._end_load(record)

    def fail_load(self, load_id: int) -> None:
        """Load `load_id` raised: its device pages are freed, its nodes stay host-only."""
        record = self._pop_load(load_id)
        swa_alloc = self.device[self.swa] if self.swa else None
        for n in record.nodes:
            n.load_id = None
            if n.state is Residency.LOADING:
                self._free_device_pages(n)
                n.apply(Event.LOAD_FAILED)
            elif n.swa_device is not None:
                mine = np.isin(n.swa_device, list(record.swa_assigned))
                swa_alloc.free(n.swa_device[mine])
                n.swa_device[mine] = ABSENT
        for n in record.drop_host:      # host-only below an unbacked parent: unreachable
            if n.state is Residency.HOST and n.parent is not None:
                self._remove_subtree(n)
        self.events["load_failed"] += 1
        self._end_load(record)

    def _pop_load(self, load_id: int) -> _Load:
        try:
            return self._loads.pop(load_id)
        except KeyError:
            raise ValueError(f"no load-back in flight with id {load_id} (in flight: {sorted(self._loads)})") from None

    def _end_load(self, record: _Load) -> None:
        self.unlock(record.lock)
        now = self._tick()
        for n in record.nodes:
            if n.state is not Residency.GONE:
                n.last_access = now
                self._offer_leaf(n)

    def loads_in_flight(self) -> list[int]:
        return sorted(self._loads)
