"""What the L3 tier counts: `StorageCounters` (mutable, thread-safe), `StorageStats` (a
frozen snapshot) and `metric_families` (its Prometheus rendering, `hicache_storage_*`).

Per pool: objects and payload bytes served and written, objects skipped because they were
already stored, failed writes, and objects not served by reason (`MissReason`: the corrupt
ones, `absent`, and `error`/`timeout`/`unavailable`/`cancelled` when a call did not
deliver). Per operation: backend round trips, and failed or refused calls by reason.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hicache_jax.storage.objects import CORRUPT, MissReason


@dataclasses.dataclass(frozen=True)
class PoolStorageStats:
    read_objects: int
    read_bytes: int
    written_objects: int
    written_bytes: int
    skipped_objects: int                 # already stored: not written again
    write_failures: int
    misses: Mapping[str, int]            # reason -> objects a get did not serve

    @property
    def corrupt_objects(self) -> int:
        return sum(v for r, v in self.misses.items() if r in CORRUPT)


@dataclasses.dataclass(frozen=True)
class StorageStats:
    """A snapshot of one `StorageTier`'s counters."""

    pools: Mapping[str, PoolStorageStats]
    calls: Mapping[str, int]             # backend round trips by op (exists, contains, get, put)
    failures: Mapping[str, Mapping[str, int]]   # op -> reason (error/timeout/unavailable) -> calls
    lookups: int                         # `usable_prefix` calls
    lookup_hit_pages: int                # pages they found usable
    lookup_misses: int                   # of them, those that found no page
    degraded: bool                       # calls are not being sent (after an error or timeout)

    def failures_of(self, reason: MissReason) -> int:
        return sum(r.get(reason, 0) for r in self.failures.values())

    @property
    def corrupt_objects(self) -> int:
        return sum(p.corrupt_objects for p in self.pools.values())


class StorageCounters:
    """Mutable counters, updated from the tier's I/O threads under one lock."""

    def __init__(self, pools: list[str]):
        self._lock = threading.Lock()
        self._pools = pools
        self._pool = {name: Counter() for name in pools}
        self._misses = {name: Counter() for name in pools}
        self._calls: Counter = Counter()
        self._failures: Counter = Counter()     # (op, reason) -> calls
        self._lookups: Counter = Counter()

    def call(self, op: str) -> None:
        with self._lock:
            self._calls[op] += 1

    def failure(self, op: str, reason: MissReason) -> None:
        with self._lock:
            self._failures[op, str(reason)] += 1

    def pool(self, name: str, **deltas: int) -> None:
        """Add to pool `name`'s counters (`read_objects=1, read_bytes=n`, ...)."""
        with self._lock:
            self._pool[name].update(deltas)

    def miss(self, name: str, reason: MissReason, objects: int = 1) -> None:
        with self._lock:
            self._misses[name][str(reason)] += objects

    def lookup(self, pages: int) -> None:
        with self._lock:
            self._lookups["lookups"] += 1
            self._lookups["hit_pages"] += pages
            self._lookups["misses"] += pages == 0

    def snapshot(self, degraded: bool) -> StorageStats:
        with self._lock:
            fields = [f.name for f in dataclasses.fields(PoolStorageStats) if f.name != "misses"]
            pools = {name: PoolStorageStats(**{f: self._pool[name][f] for f in fields},
                                            misses=dict(self._misses[name])) for name in self._pools}
            failures: dict[str, dict[str, int]] = {}
            for (op, reason), v in self._failures.items():
                failures.setdefault(op, {})[reason] = v
            return StorageStats(pools, dict(self._calls), failures, self._lookups["lookups"],
                                self._lookups["hit_pages"], self._lookups["misses"], degraded)


def metric_families(s: StorageStats) -> Iterator:
    """`hicache_storage_*` metric families of a snapshot, for a prometheus_client collector."""
    C = CounterMetricFamily
    for name, doc in (("read_objects", "L3 objects served (verified), per pool"),
                      ("read_bytes", "L3 payload bytes served, per pool"),
                      ("written_objects", "L3 objects written, per pool"),
                      ("written_bytes", "L3 payload bytes written, per pool"),
                      ("skipped_objects", "L3 objects not written because they were already stored, per pool"),
                      ("write_failures", "L3 objects the store refused to write, per pool")):
        fam = C(f"hicache_storage_{name}", doc, labels=["pool"])
        for pool, p in sorted(s.pools.items()):
            fam.add_metric([pool], getattr(p, name))
        yield fam
    misses = C("hicache_storage_misses", "L3 objects asked for and not served, by reason", labels=["pool", "reason"])
    for pool, p in sorted(s.pools.items()):
        for reason, v in sorted(p.misses.items()):
            misses.add_metric([pool, reason], v)
    yield misses
    calls = C("hicache_storage_calls", "L3 backend round trips, by operation", labels=["op"])
    for op, v in sorted(s.calls.items()):
        calls.add_metric([op], v)
    yield calls
    failures = C("hicache_storage_failures", "L3 calls that failed or were not sent", labels=["op", "reason"])
    for op, reasons in sorted(s.failures.items()):
        for reason, v in sorted(reasons.items()):
            failures.add_metric([op, reason], v)
    yield failures
    yield C("hicache_storage_lookups", "L3 prefix lookups", value=s.lookups)
    yield C("hicache_storage_lookup_hit_pages", "Pages L3 prefix lookups found usable", value=s.lookup_hit_pages)
    yield C("hicache_storage_lookup_misses", "L3 prefix lookups that found no page", value=s.lookup_misses)
    yield GaugeMetricFamily("hicache_storage_degraded", "1 while L3 calls are not sent after a failure",
                            value=int(s.degraded))
