"""StorageTier over an in-memory store: whole pages only, bounded calls, counted misses."""
import numpy as np
import pytest

from hicache_jax.storage import (MAX_BATCH_PAGES, FaultyBackend, MemoryBackend, MissReason, StorageConfig,
                                 StorageTier)
from storage_helpers import load_layout, random_rows, random_tokens

C4, C4_INDEXER = "deepseek_v4_c4", "deepseek_v4_c4_indexer"


def make_tier(name="tiny_v4", tp=1, **config):
    backend = FaultyBackend(MemoryBackend())
    tier = StorageTier(load_layout(name), backend, StorageConfig(**{"call_timeout_s": 2.0, **config}), tp=tp)
    return tier, backend


def same_pages(tier, allocator, a, a_ids, b, b_ids):
    """The stored bytes of rows a[a_ids] and b[b_ids] agree (the rows' padding is not stored)."""
    segs = tier.rows[allocator].spans
    av, bv = a.view(np.uint8), b.view(np.uint8)
    return all(np.array_equal(av[i, s.offset:s.offset + s.nbytes], bv[j, s.offset:s.offset + s.nbytes])
               for i, j in zip(a_ids, b_ids) for s in segs)


def put(tier, allocator, pages, rows, ids):
    op = tier.put_pages(allocator, pages, rows, ids)
    assert op.wait(10)
    return op.result()


def get(tier, allocator, pages, rows, ids):
    op = tier.get_pages(allocator, pages, rows, ids)
    assert op.wait(10)
    return op.result()


@pytest.mark.parametrize("name, tp", [("tiny_v4", 1), ("tiny_v41", 1), ("tiny_gqa", 2)])
def test_round_trip_is_bit_exact_into_other_rows(name, tp):
    tier, _ = make_tier(name, tp)
    pages = tier.page_hashes(random_tokens(5))
    for allocator, layout in tier.rows.items():
        dtype = "bfloat16" if name == "tiny_gqa" else np.uint8
        src = random_rows(layout, 8, seed=1)
        dst = np.zeros_like(src)
        assert put(tier, allocator, pages, src.view(dtype) if dtype is np.uint8 else src, [0, 1, 2, 3, 4]).written == 5 * len(layout.spans)
        result = get(tier, allocator, pages, dst, [7, 5, 3, 1, 0])
        assert (result.pages, result.served, result.misses) == (5, 5, {})
        assert same_pages(tier, allocator, src, [0, 1, 2, 3, 4], dst, [7, 5, 3, 1, 0])
    assert tier.exists_prefix(pages) == 5
    s = tier.stats()
    kv_pool = tier.rows[tier.anchor].spans[0].pool
    assert s.pools[kv_pool].read_objects == s.pools[kv_pool].written_objects == 5 * tp ** (name == "tiny_gqa")
    assert s.corrupt_objects == 0 and not s.failures


def test_existing_objects_are_skipped():
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(3))
    rows = random_rows(tier.rows["kv"], 3)
    assert put(tier, "kv", pages[:2], rows, [0, 1]).written == 6
    again = put(tier, "kv", pages, rows, [0, 1, 2])
    assert (again.written, again.skipped, again.failed) == (3, 6, 0)
    assert backend.batch_keys[-1] == ("put", 3)       # only the new page's objects moved
    assert tier.stats().pools[C4].skipped_objects == 2


def test_batches_hold_at_most_128_pages():
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(300))
    rows = random_rows(tier.rows["kv"], 300)
    put(tier, "kv", pages, rows, range(300))
    get(tier, "kv", pages, np.zeros_like(rows), range(300))
    assert tier.exists_prefix(pages) == 300
    per_page = len(tier.rows["kv"].spans)
    assert backend.calls == {"contains": 3, "put": 3, "get": 3, "exists": 4}      # exists: 8, 128, 128, 36 pages
    assert max(n for _, n in backend.batch_keys) == MAX_BATCH_PAGES * per_page
    assert [n for m, n in backend.batch_keys if m == "exists"] == [8 * per_page, 128 * per_page, 128 * per_page,
                                                                  36 * per_page]


def test_a_miss_costs_one_exists_call():
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(1000))
    assert tier.usable_prefix(pages) == 0 and tier.exists_prefix(pages) == 0
    assert backend.calls == {"exists": 2} and backend.batch_keys == [("exists", 8 * 3)] * 2
    assert tier.stats().lookup_misses == 1


def test_page_with_a_missing_pool_is_absent():
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(5))
    rows = random_rows(tier.rows["kv"], 5)
    put(tier, "kv", pages, rows, range(5))
    del backend.inner.objects[tier.keys.key(C4_INDEXER, pages[3]).text]     # page 3 lost its indexer
    assert tier.exists_prefix(pages) == 3
    result = get(tier, "kv", pages, np.zeros_like(rows), range(5))
    assert result.served == 3 and result.misses == {"absent": 1}
    backend.hidden_pools.add(C4_INDEXER)                                    # and now every page did
    assert tier.exists_prefix(pages) == 0 and tier.usable_prefix(pages) == 0


def test_stop_point_needs_its_window():
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(6))
    assert tier.layout.window_pages() == 1
    put(tier, "kv", pages, random_rows(tier.rows["kv"], 6), range(6))
    assert tier.exists_prefix(pages) == 6 and tier.usable_prefix(pages) == 0    # no window anywhere
    swa = random_rows(tier.rows["swa"], 6)
    put(tier, "swa", pages[1:2], swa, [1])
    assert not tier.window_present(pages, 6) and tier.window_present(pages, 2)
    assert tier.usable_prefix(pages) == 2                                      # backs off to the last window
    put(tier, "swa", pages[5:6], swa, [5])
    assert tier.usable_prefix(pages) == 6
    backend.hidden_pools.add("deepseek_v4_c4_state")                           # a state pool of the window is gone
    assert tier.usable_prefix(pages) == 0
    backend.hidden_pools.clear()
    calls = dict(backend.calls)
    assert tier.usable_prefix(pages) == 6
    # six pages: the kv pages in one exists, the SWA flags in one contains, the window in one exists
    assert {k: n - calls.get(k, 0) for k, n in backend.calls.items() if n > calls.get(k, 0)} == {"exists": 2, "contains": 1}


@pytest.mark.parametrize("damage", ["checksum", "bad_header", "foreign", "truncated", "oversize"])
def test_corrupt_objects_are_counted_misses_never_served(damage):
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(4))
    rows = random_rows(tier.rows["kv"], 4)
    put(tier, "kv", pages, rows, range(4))
    backend.damage[tier.keys.key(C4, pages[2]).text] = damage
    result = get(tier, "kv", pages, np.zeros_like(rows), range(4))
    assert result.served == 2 and result.misses == {damage: 1}
    s = tier.stats()
    assert s.pools[C4].misses == {damage: 1} and s.corrupt_objects == 1 and not s.degraded


def test_raising_backend_degrades_then_recovers(caplog):
    now = [0.0]
    tier, backend = make_tier(retry_after_s=10.0)
    tier.guard.clock = lambda: now[0]
    pages = tier.page_hashes(random_tokens(2))
    rows = random_rows(tier.rows["kv"], 2)
    backend.raise_on.add("get")
    result = get(tier, "kv", pages, np.zeros_like(rows), [0, 1])
    assert result.served == 0 and result.misses == {"error": 6}
    s = tier.stats()
    assert s.degraded and s.failures == {"get": {"error": 1}}
    backend.raise_on.clear()
    calls = sum(backend.calls.values())
    assert tier.usable_prefix(pages) == 0 and put(tier, "kv", pages, rows, [0, 1]).reason is MissReason.UNAVAILABLE
    assert sum(backend.calls.values()) == calls                                # nothing was sent while degraded
    assert tier.stats().failures_of(MissReason.UNAVAILABLE) == 2
    now[0] = 11.0                                                              # the next call is the probe
    assert put(tier, "kv", pages, rows, [0, 1]).written == 6
    assert not tier.stats().degraded and tier.usable_prefix(pages) == 0        # no window stored yet
    lines = [r.getMessage() for r in caplog.records if r.name == "hicache_jax.storage"]
    assert len(lines) == 2 and "degraded to host-only serving" in lines[0] and "InjectedFault" in lines[0]
    assert "is back" in lines[1]


def test_stalled_backend_is_bounded_by_the_timeout():
    tier, backend = make_tier(call_timeout_s=0.2)
    pages = tier.page_hashes(random_tokens(2))
    rows = random_rows(tier.rows["kv"], 2)
    backend.stall_on.add("get")
    stuck = tier.get_pages("kv", pages, rows, [0, 1])
    assert not stuck.wait(0.3) and not stuck.done()       # its rows stay reserved until it returns
    assert tier.usable_prefix(pages) == 0                 # refused at once: a call has overrun
    assert tier.stats().failures == {"lookup": {"timeout": 1}}
    backend.release()
    assert stuck.wait(5) and stuck.result().misses == {"absent": 6}


def test_stalled_lookup_times_out():
    tier, backend = make_tier(call_timeout_s=0.2, io_threads=1)
    pages = tier.page_hashes(random_tokens(2))
    backend.stall_on.add("exists")
    assert tier.usable_prefix(pages) == 0                 # waited 0.2 s, not forever
    assert tier.stats().failures == {"lookup": {"timeout": 1}} and tier.stats().degraded
    backend.release()


def test_queued_call_can_be_cancelled():
    tier, backend = make_tier(io_threads=1)
    pages = tier.page_hashes(random_tokens(2))
    rows = random_rows(tier.rows["kv"], 2)
    backend.stall_on.add("get")
    first = tier.get_pages("kv", pages, rows, [0, 1])
    second = tier.get_pages("kv", pages, np.zeros_like(rows), [0, 1])
    assert second.cancel() and second.done() and second.result().misses == {"cancelled": 6}
    assert not first.cancel()
    backend.release()
    assert first.wait(5)


def test_bad_rows_raise_value_error():
    tier, _ = make_tier()
    pages = tier.page_hashes(random_tokens(2))
    rows = random_rows(tier.rows["kv"], 2)
    with pytest.raises(ValueError, match="is 42496 bytes"):
        tier.get_pages("kv", pages, np.zeros((2, 42495), np.uint8), [0, 1])
    with pytest.raises(ValueError, match="in 0..1"):
        tier.get_pages("kv", pages, rows, [0, 2])
    with pytest.raises(ValueError, match="distinct"):
        tier.get_pages("kv", pages, rows, [1, 1])
    with pytest.raises(ValueError, match="one row per page"):
        tier.put_pages("kv", pages, rows, [1])
    with pytest.raises(ValueError, match="allocator 'nope'"):
        tier.put_pages("nope", pages, rows, [0, 1])
    with pytest.raises(ValueError, match="32-byte page hashes"):
        tier.usable_prefix([b"short"])
    with pytest.raises(ValueError, match="32-byte page hashes"):
        tier.put_pages("kv", ["ab" * 32, pages[0]], rows, [0, 1])
    assert not tier.stats().failures
    rows.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        tier.get_pages("kv", pages, rows, [0, 1])
    with pytest.raises(ValueError, match="call_timeout_s"):
        StorageConfig(call_timeout_s=0)


def test_prometheus_families():
    from prometheus_client import CollectorRegistry, generate_latest

    from hicache_jax.storage import metric_families
    tier, backend = make_tier()
    pages = tier.page_hashes(random_tokens(2))
    put(tier, "kv", pages, random_rows(tier.rows["kv"], 2), [0, 1])
    backend.damage[f"/{C4}/"] = "checksum"      # both pages' c4 objects
    get(tier, "kv", pages, random_rows(tier.rows["kv"], 2), [0, 1])

    class Collector:
        def collect(self):
            return metric_families(tier.stats())
    registry = CollectorRegistry()
    registry.register(Collector())
    text = generate_latest(registry).decode()
    assert 'hicache_storage_written_bytes_total{pool="deepseek_v4_c4"} 49920.0' in text
    assert 'hicache_storage_misses_total{pool="deepseek_v4_c4",reason="checksum"} 2.0' in text
    assert "hicache_storage_degraded 0.0" in text
