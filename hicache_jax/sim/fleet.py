"""`simulate`: a trace through N instances on a simulated clock.

Events in time order, one heap for the whole fleet (ties in the order they were made):

    arrival of request k   route it (each instance's tree and queue as of now); queue it
                           there; an idle instance begins it at once
    prefill end on i       the request's pages go to i's tree; i begins its next queued
                           request at that time
    landing on i           a backup or a prefetch of i has landed: i steps (applies it),
                           as a serving loop that calls `step()` every iteration would

Events at or before an arrival are handled before it, so the arrival sees their pages.
Instances share nothing but the storage tier, whose entries carry the time they become
visible, so one instance's write is seen by another only once it has landed. In serial
mode (`SimConfig.serial`) the arrival times are ignored: each request begins after the
one before has ended and all its transfers, storage writes included, have landed.
"""
from __future__ import annotations

import heapq
import resource
import time
from collections.abc import Callable, Sequence

from hicache_jax.layout import PoolLayout
from hicache_jax.sim.config import SimConfig
from hicache_jax.sim.instance import Instance, RequestOutcome, SimRequest
from hicache_jax.sim.results import SimResult, tree_counters
from hicache_jax.sim.router import Router
from hicache_jax.sim.sizing import GIB, pages_bytes
from hicache_jax.sim.store import SharedStore
from hicache_jax.trace import TraceRequest, request_tokens

PROGRESS_EVERY = 500     # requests between progress reports


def check_fits(layout: PoolLayout, config: SimConfig, requests: Sequence[TraceRequest]) -> None:
    """ValueError unless the device tier can hold the longest request, every allocator
    (a request computes its pages on device, whatever it finds cached), and a storage tier
    has a host tier to land in."""
    if not requests:
        return
    longest = max(r.input_length if config.max_input_tokens is None else min(r.input_length, config.max_input_tokens)
                  for r in requests)
    pages = -(-longest // layout.page_size)
    device, host = config.cache.page_counts(layout)
    if config.has_storage and not any(host.values()):
        raise ValueError("a storage tier needs a host tier (its pages reach the device through the host): "
                         f"host pages are {host}")
    short = {a: n for a, n in device.items() if n < pages}
    if short:
        raise ValueError(f"the device tier is smaller than the longest request ({longest} tokens, {pages} pages): "
                         f"device pages {short}")


def simulate(requests: Sequence[TraceRequest], layout: PoolLayout, config: SimConfig,
             progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Serve `requests` (arrival order) through `config.instances` instances; see the module
    docstring. `progress(done, total)` is called every `PROGRESS_EVERY` requests."""
    if not isinstance(config, SimConfig):
        raise ValueError(f"simulate takes a SimConfig, got {type(config).__name__}")
    check_fits(layout, config, requests)
    wall = time.perf_counter()
    run = _Run(layout, config, len(requests), progress)
    for req in requests:
        run.arrive(req)
    run.finish()
    run.outcomes.sort(key=lambda o: o.index)
    return _result(layout, config, run.fleet, run.store, run.outcomes, time.perf_counter() - wall)


class _Run:
    """The fleet, its event heap and what it has produced so far."""

    def __init__(self, layout: PoolLayout, config: SimConfig, total: int,
                 progress: Callable[[int, int], None] | None):
        self.config, self.total, self.progress = config, total, progress
        self.store = SharedStore(layout, config.storage_pages, config.cache.storage.model_id) \
            if config.has_storage else None
        self.fleet = [Instance(i, layout, config, self.store) for i in range(config.instances)]
        self.router = Router(config.route, config.instances, config.load_bound, config.seed)
        self.vocab = max(2, layout.model.vocab_size)
        self.outcomes: list[RequestOutcome] = []
        self._events: list[tuple[float, int, int, bool]] = []   # (time, order made, instance, prefill end?)
        self._made = 0
        self._clock = 0.0                                       # serial mode: when the next request may begin

    def arrive(self, req: TraceRequest) -> None:
        arrival = req.timestamp_ms / 1e3
        while self._events and self._events[0][0] <= arrival:
            self._handle(*heapq.heappop(self._events))
        tokens = request_tokens(req, self.vocab, max_tokens=self.config.max_input_tokens)
        fleet = self.fleet
        i = self.router.pick(lambda k: fleet[k].coverage(tokens), lambda k: fleet[k].load)
        inst = fleet[i]
        if self.config.serial:                  # arrivals do not pace a serial run
            done = inst.begin(SimRequest(req.index, self._clock, tokens), self._clock)
            self._done(inst.end(done))
            self._clock = max(done, inst.transfers.drain(done))
            inst.transfers.wakeups.clear()      # drained: nothing left to land
        elif inst.running is None:
            self._push(inst.begin(SimRequest(req.index, arrival, tokens), arrival), i, True)
        else:
            inst.queue.append(SimRequest(req.index, arrival, tokens))

    def finish(self) -> None:
        """Run every event left: the queued requests and the transfers they start."""
        while self._events:
            self._handle(*heapq.heappop(self._events))
        if self.progress is not None and len(self.outcomes) % PROGRESS_EVERY:
            self.progress(len(self.outcomes), self.total)

    def _handle(self, t: float, _order: int, i: int, prefill_end: bool) -> None:
        inst = self.fleet[i]
        if not prefill_end:                     # a landing: apply it (a no-op if already applied)
            inst.transfers.step(t)
        else:
            self._done(inst.end(t))
            if inst.queue:
                self._push(inst.begin(inst.queue.popleft(), t), i, True)
        self._push_landings(i)

    def _push(self, t: float, i: int, prefill_end: bool) -> None:
        heapq.heappush(self._events, (t, self._made, i, prefill_end))
        self._made += 1
        self._push_landings(i)

    def _push_landings(self, i: int) -> None:
        wakeups = self.fleet[i].transfers.wakeups
        for t in wakeups:
            heapq.heappush(self._events, (t, self._made, i, False))
            self._made += 1
        wakeups.clear()

    def _done(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)
        if self.progress is not None and len(self.outcomes) % PROGRESS_EVERY == 0:
            self.progress(len(self.outcomes), self.total)


def _result(layout: PoolLayout, config: SimConfig, fleet: list[Instance], store: SharedStore | None,
            outcomes: list[RequestOutcome], wall_s: float) -> SimResult:
    moved: dict[str, int] = {}
    for inst in fleet:
        for link, n in inst.transfers.bytes_moved().items():
            moved[link] = moved.get(link, 0) + n
    device, host = config.cache.page_counts(layout)
    tiers = {"device_pages": device, "device_gib": round(pages_bytes(layout, device) / GIB, 3),
             "host_pages": host, "host_gib": round(pages_bytes(layout, host) / GIB, 3)}
    if store is not None:
        tiers.update(storage_pages=dict(config.storage_pages),
                     storage_gib=round(pages_bytes(layout, dict(config.storage_pages)) / GIB, 3))
    tree = tree_counters([inst.core.stats for inst in fleet])
    tree["prefetched_pages"] = sum(inst.transfers.prefetched_pages for inst in fleet)
    span = (max(o.first_token_s for o in outcomes) - min(o.arrival_s for o in outcomes)) if outcomes else 0.0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # Linux: KiB
    return SimResult(config.instances, config.route, config.window_policy.name, tuple(outcomes), moved, tiers, tree,
                     store.stats() if store is not None else None, span, wall_s, rss_mib)


__all__ = ["check_fits", "simulate"]
