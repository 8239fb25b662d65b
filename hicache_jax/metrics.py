"""What the cache counts, as a frozen snapshot (`CacheStats`) and as Prometheus metrics.

`TransferCounters` is the controller's mutable record; `CacheStats` is an immutable copy of it plus
the tier gauges; `StatsCollector` renders a snapshot as `hicache_*` metric families, so
`stats()` and the Prometheus exposition can never disagree. Every pool with bytes gets
its own label, sidecars and state pools included (their traffic is bytes and tokens on
the pages of their index source).
"""
from __future__ import annotations

import bisect
import dataclasses
import enum
from collections import Counter
from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from hicache_jax.plan import Direction, TransferPlan
from hicache_jax.storage import StorageStats, metric_families
from hicache_jax.tree import DropReason, PrefetchOutcome, Refusal, Tier

# what a call that waited for transfers in flight waited for: device pages (`alloc`, a load
# short of room: every transfer), or a prefix's host copy still landing (`acquire`: backups)
WAITS = ("room", "pending_write")
# transfer duration buckets, seconds: 50 us .. 10 s
DURATION_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class FailureCause(enum.StrEnum):
    """Where a transfer failed."""

    START = "start"            # the engine raised while dispatching it
    COMPLETION = "completion"  # the device reported an error
    TIMEOUT = "timeout"        # not done within transfer_timeout_s


@dataclasses.dataclass
class TransferCounters:
    """What one cache counts as it serves (the one owner of these numbers; `CacheStats` is
    their frozen snapshot): tokens asked for and where they were found, and per pool the
    tokens and bytes each completed transfer moved."""

    requested_tokens: int = 0         # prompt tokens matched
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    storage_hit_tokens: int = 0       # of the host hits, tokens just prefetched from storage
    backup_tokens: Counter = dataclasses.field(default_factory=Counter)   # pool -> tokens
    backup_bytes: Counter = dataclasses.field(default_factory=Counter)
    load_tokens: Counter = dataclasses.field(default_factory=Counter)
    load_bytes: Counter = dataclasses.field(default_factory=Counter)
    transfers: Counter = dataclasses.field(default_factory=Counter)       # direction -> completed
    failures: Counter = dataclasses.field(default_factory=Counter)        # (direction, cause) -> count
    landings: Counter = dataclasses.field(default_factory=Counter)        # deferred loads by who landed them: step | cache
    waits: Counter = dataclasses.field(default_factory=Counter)           # calls that waited on transfers, by WAITS
    durations: dict = dataclasses.field(default_factory=dict)             # direction -> [bucket counts..., sum]
    # completed transfers not counted yet: the counting runs when something reads (`settled`)
    # or every `SETTLE_EVERY` records, not on the serving path (5-8 us of a one-page hit)
    _done: list = dataclasses.field(default_factory=list, repr=False)

    SETTLE_EVERY = 256

    def record(self, direction: Direction, plan: TransferPlan, layout, host_tokens: int, seconds: float) -> None:
        """A transfer completed: its tokens and bytes per pool, its time; a load's host hit
        (counted by the next `settled`)."""
        self._done.append((direction, plan, layout, host_tokens, seconds))
        if len(self._done) >= self.SETTLE_EVERY:
            self.settled()

    def settled(self) -> TransferCounters:
        """These counters with every recorded transfer counted: read them through this."""
        done, self._done = self._done, []
        for record in done:
            self._count(*record)
        return self

    def _count(self, direction: Direction, plan: TransferPlan, layout, host_tokens: int, seconds: float) -> None:
        tokens, nbytes = ((self.backup_tokens, self.backup_bytes) if direction is Direction.BACKUP
                          else (self.load_tokens, self.load_bytes))
        for batch in plan.batches:
            for name in batch.pools:
                tokens[name] += batch.num_pages * layout.page_size
        for name, b in plan.pool_bytes(layout).items():
            nbytes[name] += b
        self.transfers[direction.value] += 1
        self.host_hit_tokens += host_tokens
        counts = self.durations.setdefault(direction.value, [0] * (len(DURATION_BUCKETS) + 1) + [0.0])
        counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        counts[-1] += seconds


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """A snapshot of everything the cache counts. Tokens per pool are tokens whose rows of
    that pool moved (SWA-addressed pools: the tokens of the SWA pages moved)."""

    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int                           # of the host hits, tokens just fetched from storage
    miss_tokens: int
    backup_tokens: Mapping[str, int]
    backup_bytes: Mapping[str, int]
    load_tokens: Mapping[str, int]
    load_bytes: Mapping[str, int]
    dropped_tokens: Mapping[str, Mapping[str, int]]   # pool -> reason -> tokens
    evicted_tokens: Mapping[str, int]                 # tier -> anchor tokens evicted from it
    transfers: Mapping[str, int]                      # direction -> completed transfers
    failures: Mapping[str, int]                       # "direction/cause" -> count
    load_refusals: Mapping[str, int]
    durations: Mapping[str, tuple[int, float]]        # direction -> (count, total seconds)
    host_used_bytes: Mapping[str, int]
    host_capacity_bytes: Mapping[str, int]
    device_used_bytes: Mapping[str, int]
    device_capacity_bytes: Mapping[str, int]
    in_flight: Mapping[str, int]                      # direction -> transfers in flight
    prefetches: Mapping[str, int]                     # prefetch outcome -> prefetches (storage -> host)
    storage: StorageStats | None = None               # the storage tier's counters (None: no storage)
    host_held_bytes: Mapping[str, int] = dataclasses.field(default_factory=dict)       # pool -> its blocks' bytes
    host_compacted_pages: Mapping[str, int] = dataclasses.field(default_factory=dict)  # allocator -> pages moved
    deferred_loads: Mapping[str, int] = dataclasses.field(default_factory=dict)  # landed by: step | cache
    transfer_waits: Mapping[str, int] = dataclasses.field(default_factory=dict)  # what a call waited for (WAITS)


class StatsCollector:
    """A prometheus_client collector that renders the owning cache's current stats."""

    def __init__(self, snapshot, histograms, pools: tuple[str, ...]):
        self._snapshot = snapshot       # () -> CacheStats
        self._histograms = histograms   # () -> {direction: [bucket counts..., sum]}
        self._pools = pools             # byte-holding pools: every per-pool series exists from the start

    def collect(self):
        s: CacheStats = self._snapshot()
        C, G = CounterMetricFamily, GaugeMetricFamily
        pools, directions = self._pools, tuple(d.value for d in Direction)
        # every known label set is exported from the start (at 0), so a dashboard shows 0, not "no data"
        for cls, name, doc, label, values, known in (
            (C, "hicache_hit_tokens", "Prompt tokens served from the cache, by tier", "tier",
             {"device": s.device_hit_tokens, "host": s.host_hit_tokens, "storage": s.storage_hit_tokens}, ()),
            (C, "hicache_storage_prefetches", "Storage -> host prefetches, by outcome", "outcome", s.prefetches,
             tuple(o.value for o in PrefetchOutcome)),
            (C, "hicache_backup_tokens", "Tokens backed up device->host, per pool", "pool", s.backup_tokens, pools),
            (C, "hicache_backup_bytes", "Bytes backed up device->host, per pool", "pool", s.backup_bytes, pools),
            (C, "hicache_load_back_tokens", "Tokens loaded back host->device, per pool", "pool", s.load_tokens, pools),
            (C, "hicache_load_back_bytes", "Bytes loaded back host->device, per pool", "pool", s.load_bytes, pools),
            (C, "hicache_evicted_tokens", "Anchor tokens evicted, by tier", "tier", s.evicted_tokens, ()),
            (C, "hicache_transfers", "Completed transfers", "direction", s.transfers, directions),
            (C, "hicache_transfer_failures", "Failed transfers (direction/cause)", "kind", s.failures,
             tuple(f"{d}/{c.value}" for d in directions for c in FailureCause)),
            (C, "hicache_load_back_refused", "Load-backs not started, by reason", "reason", s.load_refusals,
             tuple(r.value for r in Refusal)),
            (G, "hicache_host_used_bytes", "Host bytes holding cached pages, per pool", "pool", s.host_used_bytes, ()),
            (G, "hicache_host_capacity_bytes", "Host bytes of the pool", "pool", s.host_capacity_bytes, ()),
            (G, "hicache_host_held_bytes", "Host bytes of the pinned blocks (cached pages, dead rows), per pool",
             "pool", s.host_held_bytes, ()),
            (C, "hicache_host_compacted_pages", "Host pages moved to new blocks to drop dead rows, per allocator",
             "allocator", s.host_compacted_pages, ()),
            (C, "hicache_deferred_loads", "Deferred load-backs landed, by a model step or by the cache",
             "landed_by", s.deferred_loads, ("step", "cache")),
            (C, "hicache_transfer_waits", "Calls that waited for transfers in flight: device room, or a "
             "prefix's host copy still landing", "reason", s.transfer_waits, WAITS),
            (G, "hicache_device_used_bytes", "Device bytes in use (cached, held, in flight), per pool", "pool",
             s.device_used_bytes, ()),
            (G, "hicache_device_capacity_bytes", "Device bytes of the pool", "pool", s.device_capacity_bytes, ()),
            (G, "hicache_transfers_in_flight", "Transfers dispatched, not yet complete", "direction", s.in_flight,
             directions),
        ):
            fam = cls(name, doc, labels=[label])
            for key, v in sorted({**dict.fromkeys(known, 0), **values}.items()):
                fam.add_metric([key], v)
            yield fam
        yield CounterMetricFamily("hicache_miss_tokens", "Matched prompt tokens the cache could not serve",
                                  value=s.miss_tokens)
        dropped = CounterMetricFamily("hicache_dropped_tokens", "Device tokens destroyed without a host copy",
                                      labels=["pool", "reason"])
        for pool in pools:
            reasons = {**dict.fromkeys((r.value for r in DropReason), 0), **s.dropped_tokens.get(pool, {})}
            for reason, v in sorted(reasons.items()):
                dropped.add_metric([pool, reason], v)
        yield dropped
        hist = HistogramMetricFamily("hicache_transfer_seconds", "Transfer time, start to observed completion",
                                     labels=["direction"])
        empty = [0] * (len(DURATION_BUCKETS) + 1) + [0.0]
        for direction, counts in sorted({**dict.fromkeys(directions, empty), **self._histograms()}.items()):
            cumulative, buckets = 0, []
            for bound, c in zip((*map(str, DURATION_BUCKETS), "+Inf"), counts[:-1]):
                cumulative += c
                buckets.append((bound, cumulative))
            hist.add_metric([direction], buckets, sum_value=counts[-1])
        yield hist
        if s.storage is not None:
            yield from metric_families(s.storage)


def snapshot(layout, core, counters: TransferCounters, in_flight: Mapping[str, int],
             storage: StorageStats | None = None,
             host_blocks: Mapping[str, tuple[int, int]] | None = None) -> CacheStats:
    """Build a `CacheStats` from the cache's counters and the tree core's;
    `host_blocks`: allocator -> (rows its blocks hold, pages compaction moved)."""
    stats = core.stats
    counters = counters.settled()
    dropped: dict[str, dict[str, int]] = {}
    for p in layout.byte_pools:
        reasons = {str(r): v for (a, r), v in stats.dropped.items() if a == p.allocator and v}
        if reasons:
            dropped[p.name] = reasons
    host_used, host_cap, dev_used, dev_cap = {}, {}, {}, {}
    for p in layout.byte_pools:
        per_page = p.num_layers * p.page_bytes
        h, d = core.ledger.allocators(Tier.HOST)[p.allocator], core.ledger.allocators(Tier.DEVICE)[p.allocator]
        host_used[p.name] = (h.capacity - h.num_free) * per_page
        host_cap[p.name] = h.capacity * per_page
        dev_used[p.name] = (d.capacity - d.num_free) * per_page
        dev_cap[p.name] = d.capacity * per_page
    durations = {d: (sum(c[:-1]), c[-1]) for d, c in counters.durations.items()}
    return CacheStats(
        device_hit_tokens=counters.device_hit_tokens,
        host_hit_tokens=counters.host_hit_tokens,
        storage_hit_tokens=counters.storage_hit_tokens,
        miss_tokens=max(0, counters.requested_tokens - counters.device_hit_tokens - counters.host_hit_tokens),
        backup_tokens=dict(counters.backup_tokens), backup_bytes=dict(counters.backup_bytes),
        load_tokens=dict(counters.load_tokens), load_bytes=dict(counters.load_bytes),
        dropped_tokens=dropped,
        evicted_tokens={"device": stats.evicted[Tier.DEVICE], "host": stats.evicted[Tier.HOST]},
        transfers=dict(counters.transfers),
        failures={f"{d}/{c}": v for (d, c), v in counters.failures.items()},
        load_refusals={r.value: v for r, v in stats.refusals.items() if v},
        durations=durations,
        host_used_bytes=host_used, host_capacity_bytes=host_cap,
        device_used_bytes=dev_used, device_capacity_bytes=dev_cap,
        in_flight=dict(in_flight),
        prefetches={o.value: v for o, v in stats.prefetches.items() if v},
        storage=storage,
        host_held_bytes={p.name: host_blocks[p.allocator][0] * p.num_layers * p.page_bytes
                         for p in layout.byte_pools if host_blocks and p.allocator in host_blocks},
        host_compacted_pages={a: moved for a, (_, moved) in (host_blocks or {}).items()},
        deferred_loads=dict(counters.landings),
        transfer_waits=dict(counters.waits),
    )
