"""The storage tier through the public API: a second cache over the same store serves the
first one's prefixes, and every failure mode users met upstream is absent: partial pools,
key mismatch, shrunk hits, leaked reservations, reserving before the store was asked,
blocking on misses, corrupt objects, a store that raises or stalls. The driver checks
every byte it is served; invariants are checked after every call."""
import time

import numpy as np
import pytest

import hicache_jax as hc
from driver import Driver, P, layout, seq
from faults import empty_everything
from hicache_jax.storage import FaultyBackend, MemoryBackend
from hicache_jax.tree import Tier

LAYOUTS = ["tiny_v4", "tiny_v41", "tiny_gqa"]


def config(name, device_pages=6, host_pages=12, **storage):
    """A cache config; `storage`: `StorageConfig` fields over this file's defaults."""
    base = dict(prefetch_policy="wait_complete", model_id=name, call_timeout_s=2.0, retry_after_s=0.2)
    return hc.HiCacheConfig(device_pages=device_pages, host_pages=host_pages, check_invariants=True,
                            storage=hc.StorageConfig(**{**base, **storage}))


def writer(name, store, prompts=([0, 1, 2], [0, 1, 3]), **kw):
    """A first cache that serves `prompts` and stores their host copies in `store`."""
    c = hc.HiCache(layout(name), config(name, **kw), storage=store)
    d = Driver(c)
    for blocks in prompts:
        d.request(list(blocks), swa_every=True)
    c.drain()
    return c


def reader(name, store, **kw):
    c = hc.HiCache(layout(name), config(name, **kw), storage=store)
    return c, Driver(c)


def free_host(c):
    return {a.name: a.num_free for a in c._core.ledger.allocators(Tier.HOST)}


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_second_cache_serves_the_first_ones_prefixes_from_storage(name):
    store = MemoryBackend()
    writer(name, store)
    c, d = reader(name, store)
    assert d.request([0, 1, 2]) == 3 * P                # verified byte for byte by the driver
    assert d.request([0, 1, 3]) == 3 * P
    s = c.stats()
    assert s.storage_hit_tokens == 4 * P and s.prefetches == {"landed": 2}
    assert s.storage.pools[c.layout.byte_pools[0].name].read_objects > 0
    text = c.metrics_text()
    assert 'hicache_hit_tokens_total{tier="storage"} 1024.0' in text
    assert 'hicache_storage_prefetches_total{outcome="landed"} 2.0' in text
    empty_everything(c)


def test_write_back_stores_a_page_only_when_the_host_evicts_it():
    store = MemoryBackend()
    w = writer("tiny_v4", store, prompts=([0, 1],), write_policy="write_back")
    assert not store.objects                             # still on the host: not stored yet
    w.evict(10 ** 6, 10 ** 6)
    w.drain()
    w._core.evict_host(dict.fromkeys(w._core.components.names, 10 ** 6))
    w.drain()
    assert store.objects
    c, d = reader("tiny_v4", store)
    assert d.request([0, 1]) == 2 * P and c.stats().storage_hit_tokens == 2 * P


def test_a_miss_costs_one_exists_and_reserves_nothing():
    faulty = FaultyBackend(MemoryBackend())
    c, d = reader("tiny_v4", faulty)
    before = free_host(c)
    calls = dict(faulty.calls)
    prefix = c.acquire(np.concatenate([seq([5, 6, 7]), [7]]))
    assert prefix.length == 0
    assert faulty.calls["exists"] - calls.get("exists", 0) == 1 and faulty.calls["get"] == calls.get("get", 0)
    assert free_host(c) == before                        # nothing reserved before the store said yes
    c.unlock(prefix.lock)


def test_a_page_missing_one_pool_is_absent():
    faulty = FaultyBackend(MemoryBackend())
    writer("tiny_v4", faulty)
    faulty.hidden_pools.add("deepseek_v4_c4_indexer")    # the indexer objects are gone, the rest is there
    c, d = reader("tiny_v4", faulty)
    assert d.request([0, 1, 2]) == 0                     # recomputed, never half-restored
    assert c.stats().storage_hit_tokens == 0 and c.stats().prefetches == {}


def test_another_model_id_or_layout_reads_nothing():
    store = MemoryBackend()
    writer("tiny_v4", store)
    c, d = reader("tiny_v4", store, model_id="other weights")
    assert d.request([0, 1, 2]) == 0
    g, dg = reader("tiny_gqa", store, model_id="tiny_v4")
    assert dg.request([0, 1, 2]) == 0


@pytest.mark.parametrize("kind", ["checksum", "bad_header", "foreign", "truncated", "oversize"])
def test_a_damaged_object_is_a_counted_miss_never_served(kind):
    faulty = FaultyBackend(MemoryBackend())
    writer("tiny_v4", faulty)
    faulty.damage["/deepseek_v4_c128/"] = kind
    c, d = reader("tiny_v4", faulty)
    assert d.request([0, 1, 2]) == 0                     # the pages arrived damaged: recomputed
    s = c.stats()
    assert s.storage.pools["deepseek_v4_c128"].corrupt_objects > 0 and s.storage_hit_tokens == 0
    assert s.prefetches == {"failed": 1}
    assert all(c._core.book.reserved(a) == 0 for a in ("kv", "swa"))   # the reservation came back
    empty_everything(c)


def test_a_store_that_raises_degrades_to_host_only_serving():
    faulty = FaultyBackend(MemoryBackend())
    writer("tiny_v4", faulty)
    faulty.raise_on.update({"exists", "get", "put", "contains"})
    c, d = reader("tiny_v4", faulty)
    assert d.request([0, 1, 2]) == 0                     # served by recompute, no exception
    assert c.stats().storage.degraded and c.stats().storage.failures
    faulty.raise_on.clear()
    time.sleep(0.3)                                     # past retry_after_s: probed again
    assert d.request([0, 1, 3]) == 3 * P                 # [0, 1] from the device, [3] from storage
    assert c.stats().storage_hit_tokens == P
    empty_everything(c)


def test_a_stalled_store_never_hangs_the_loop():
    faulty = FaultyBackend(MemoryBackend())
    writer("tiny_v4", faulty)
    faulty.stall_on.add("get")
    c, d = reader("tiny_v4", faulty, call_timeout_s=0.3)
    t = time.monotonic()
    assert d.request([0, 1, 2]) == 0                     # the read is still stalled: recomputed meanwhile
    c.drain()                                            # abandons the stalled read, frees its pages
    assert time.monotonic() - t < 5
    faulty.release()
    empty_everything(c)


def test_a_hit_larger_than_the_prefetch_share_is_refused_and_counted():
    store = MemoryBackend()
    writer("tiny_gqa", store, prompts=([0, 1, 2, 3, 4],), device_pages=8, host_pages=16)
    c, d = reader("tiny_gqa", store, device_pages=8, host_pages=8, prefetch_share=0.5)
    assert d.request([0, 1, 2, 3, 4]) == 0               # 5 pages > half of 8 host pages
    assert c.stats().prefetches == {"no_host_space": 1}  # reported, not silently shrunk


def test_best_effort_serves_what_is_there_and_lands_the_rest_later():
    store = MemoryBackend()
    writer("tiny_gqa", store)
    c, d = reader("tiny_gqa", store, prefetch_policy="best_effort")
    served = d.request([0, 1, 2])
    c.drain()                                            # the prefetch lands
    assert served in (0, 3 * P) and d.request([0, 1, 2]) == 3 * P
    empty_everything(c)


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_snapshot_restores_the_host_tier_in_a_new_cache(name, tmp_path):
    a = hc.HiCache(layout(name), hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))
    d = Driver(a)
    for blocks in ([0, 1, 2], [0, 1, 3], [4]):
        d.request(blocks)
    assert a.save_snapshot(tmp_path / "snap") == 4
    b = hc.HiCache(layout(name), hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))
    assert b.restore_snapshot(tmp_path / "snap") == 4
    db = Driver(b)
    assert [db.request(x) for x in ([0, 1, 2], [0, 1, 3], [4])] == [3 * P, 3 * P, P]
    assert db.host_hits >= 5 * P and db.host_hits + db.device_hits == 7 * P   # nothing recomputed
    with pytest.raises(ValueError, match="empty cache"):
        b.restore_snapshot(tmp_path / "snap")
    other = hc.HiCache(layout("tiny_gqa" if name != "tiny_gqa" else "tiny_v4"),
                       hc.HiCacheConfig(device_pages=6, host_pages=12))
    with pytest.raises(ValueError, match="another layout"):
        other.restore_snapshot(tmp_path / "snap")


@pytest.mark.parametrize("host_pages", [12, 0])
def test_a_snapshot_of_an_empty_host_tier_saves_and_restores_nothing(host_pages, tmp_path):
    """Before anything was backed up, or with no host tier at all (`host_pages=0`): a
    snapshot of no prefixes, restored as none; the cache serves on."""
    a = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=host_pages,
                                                       write_policy="write_back", check_invariants=True))
    Driver(a).request([0, 1])                          # on the device only: nothing on the host
    assert a.save_snapshot(tmp_path / "snap") == 0
    b = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=host_pages, check_invariants=True))
    assert b.restore_snapshot(tmp_path / "snap") == 0
    assert Driver(b).request([0, 1]) == 0


@pytest.mark.parametrize("retry_s", [0.0, 1.5])
def test_an_unreachable_store_degrades_at_once_with_one_log_line(retry_s, caplog):
    """A Mooncake master nobody listens on: the cache is built within a few seconds (after
    `connect_retry_s` of retrying), says so in one warning, and serves from L1/L2."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                  # closed again: nothing listens there
    caplog.set_level("WARNING", logger="hicache_jax")
    t0 = time.monotonic()
    c = hc.HiCache(layout("tiny_v4"), config("tiny_v4", url=f"mooncake://127.0.0.1:{port}",
                                              connect_retry_s=retry_s))
    assert retry_s <= time.monotonic() - t0 < retry_s + 3
    d = Driver(c)
    for blocks in ([0, 1], [0, 1, 2], [0, 1]):
        d.request(blocks)
    time.sleep(0.3)                                 # past retry_after_s: probed again, quietly
    d.request([0, 1, 3])
    s = c.stats().storage
    assert s.degraded and s.failures["open"] == {"error": 1} and d.device_hits > 0
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0].getMessage(), caplog.text
    assert "cannot reach mooncake_master" in warnings[0].getMessage()
    c.close()
