"""Prometheus metrics: per-pool counters for every pool, one registry per cache."""
import re

import hicache_jax as hc
from driver import Driver, layout


def value(text, name, **labels):
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(sel)}}} (\S+)$" if sel else rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_sidecar_and_state_pools_show_backup_bytes():
    cache = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=12))
    other = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=12))
    Driver(cache).request([0, 1, 2])
    cache.drain()
    text = cache.metrics_text()
    s = cache.stats()
    for pool in ("deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128", "swa",
                 "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state"):
        got = value(text, "hicache_backup_bytes_total", pool=pool)
        assert got and got == s.backup_bytes[pool]
        assert value(text, "hicache_host_used_bytes", pool=pool) > 0
        # the pinned blocks hold the pages backed up (no page written twice: no dead rows)
        assert value(text, "hicache_host_held_bytes", pool=pool) == s.host_held_bytes[pool] == s.host_used_bytes[pool]
    for allocator in ("kv", "swa"):
        assert value(text, "hicache_host_compacted_pages_total", allocator=allocator) == 0
    spec = cache.layout.pool("deepseek_v4_c4_state")
    assert s.backup_bytes["deepseek_v4_c4_state"] == 1 * spec.num_layers * spec.page_bytes   # one SWA page
    assert s.backup_tokens["deepseek_v4_c4"] == 3 * 256
    assert value(text, "hicache_transfers_total", direction="backup") == 1
    assert value(text, 'hicache_transfer_seconds_count', direction="backup") == 1
    # a second cache in the same process counts nothing of the first's
    assert value(other.metrics_text(), "hicache_backup_bytes_total", pool="swa") == 0


def test_every_known_label_set_is_exported_at_zero_from_the_start():
    cache = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=12))
    text = cache.metrics_text()
    for kind in ("backup/start", "backup/completion", "backup/timeout", "load/start", "load/completion", "load/timeout"):
        assert value(text, "hicache_transfer_failures_total", kind=kind) == 0
    for reason in hc.Refusal:
        assert value(text, "hicache_load_back_refused_total", reason=reason.value) == 0
    for pool in ("swa", "deepseek_v4_c4", "deepseek_v4_c4_state"):
        for reason in ("write_through_unbacked_eviction", "host_pressure", "backup_failed", "no_host_tier"):
            assert value(text, "hicache_dropped_tokens_total", pool=pool, reason=reason) == 0
        assert value(text, "hicache_load_back_bytes_total", pool=pool) == 0
    for direction in ("backup", "load"):
        assert value(text, "hicache_transfers_total", direction=direction) == 0
        assert value(text, "hicache_transfer_seconds_count", direction=direction) == 0


def test_dropped_tokens_are_labelled_by_pool_and_reason():
    cache = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=12,
                                                           write_policy="write_through_selective"))
    Driver(cache).request([0, 1])
    cache.evict(2)
    text = cache.metrics_text()
    assert value(text, "hicache_dropped_tokens_total", pool="deepseek_v4_c4",
                 reason="write_through_unbacked_eviction") == 512
    assert value(text, "hicache_dropped_tokens_total", pool="deepseek_v4_c4_state",
                 reason="write_through_unbacked_eviction") == 256
    assert value(text, "hicache_evicted_tokens_total", tier="device") == 512


def test_the_tally_counts_every_transfer_when_read_and_keeps_at_most_a_bounded_backlog():
    """Completed transfers are counted when the counters are read (stats, metrics) or every
    `SETTLE_EVERY` records: the counts equal recording them one by one, and the backlog of
    uncounted transfers never grows past the bound."""
    from hicache_jax.metrics import TransferCounters
    from hicache_jax.plan import Direction, make_plan
    lay = layout("tiny_v4")
    plan = make_plan(lay, "load", {"kv": ([0, 1], [4, 5]), "swa": ([2], [3])})
    lazy, eager, n = TransferCounters(), TransferCounters(), TransferCounters.SETTLE_EVERY + 3
    for i in range(n):
        lazy.record(Direction.LOAD, plan, lay, 7, 1e-3 * i)
        eager.record(Direction.LOAD, plan, lay, 7, 1e-3 * i)
        eager.settled()
        assert len(lazy._done) < TransferCounters.SETTLE_EVERY
    assert len(lazy._done) == 3 and lazy.settled() == eager
    assert lazy.load_bytes == {k: v * n for k, v in plan.pool_bytes(lay).items()}
    assert lazy.host_hit_tokens == 7 * n and lazy.transfers["load"] == n and sum(lazy.durations["load"][:-1]) == n
    cache = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12))
    Driver(cache).request([0, 1, 2])
    cache.drain()
    assert cache.stats().transfers == {"backup": 1} and cache._data.counters._done == []   # read: counted


def test_host_pages_the_tree_frees_leave_their_blocks():
    """Under host pressure the tree frees host pages of evicted nodes; their rows leave the
    pinned blocks at once, so the blocks hold exactly the pages in use (each request backed
    up alone: no block is left part-dead), nothing is ever compacted, and the prefixes
    still cached come back exact."""
    cache = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=9, check_invariants=True))
    d = Driver(cache)
    # 3 pages, then 1, ...: a 1-page backup evicts a 3-page node from the host and reuses one page
    requests = [[10 * r + i for i in range(3 if r % 2 == 0 else 1)] for r in range(10)]
    for blocks in requests:
        d.request(blocks)
        cache.drain()
        s = cache.stats()
        assert s.host_held_bytes == s.host_used_bytes, (s.host_held_bytes, s.host_used_bytes)
    assert cache.stats().evicted_tokens["host"] >= 3 * 256                # nodes left the host
    assert cache.stats().host_compacted_pages == {"kv": 0, "swa": 0}
    assert d.request(requests[-2]) == 3 * 256                             # a cached one, exact (verified)
