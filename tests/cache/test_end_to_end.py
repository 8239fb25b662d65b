"""Many requests with shared prefixes through the public API, forcing evictions and
load-backs; the device bytes of every hit equal what was written, on every pool."""
import zlib

import jax
import numpy as np
import pytest

import hicache_jax as hc
from conftest import tp_mesh
from driver import P, Driver, land_in_step, layout, seq
from faults import faulty_cache

POLICIES = ["write_through", "write_through_selective", "write_back"]


@pytest.mark.parametrize("name, groups", [("tiny_v4", 2), ("tiny_v41", 3), ("tiny_gqa", 4)])
@pytest.mark.parametrize("land", ["step", "cache"])
def test_deferred_loads_serve_the_same_bytes(name, groups, land):
    """Host hits loaded back deferred: a jitted step lands them group by group (or, never
    handed to a step, the cache does at `drain`); every served byte is what was written."""
    cfg = hc.HiCacheConfig(device_pages=6, host_pages=24, check_invariants=True,
                           transfer=hc.TransferConfig(layer_groups=groups))
    cache = hc.HiCache(layout(name), cfg)
    d = Driver(cache)
    rng = np.random.default_rng(groups)
    convs = [[int(x) for x in rng.integers(0, 4, 3)] for _ in range(4)]
    for turn in range(3):
        for conv in convs:
            d.request(conv, swa_every=True, land=land)
            conv.append(int(rng.integers(0, 4)))
            del conv[4:]
    cache.drain()
    cache.check_invariants()
    assert d.host_hits > 0 and cache.stats().in_flight["load"] == 0
    assert any(len(f.parts) > 1 for f in cache._engine.host.formats.values())   # split by layer group
    landed = cache.stats().deferred_loads
    assert landed.get(land, 0) > 0 and set(landed) == {land}, landed
    assert f'hicache_deferred_loads_total{{landed_by="{land}"}}' in cache.metrics_text()


def test_deferred_load_misuse_changes_nothing():
    cfg = hc.HiCacheConfig(device_pages=6, host_pages=24, check_invariants=True,
                           transfer=hc.TransferConfig(layer_groups=2))
    cache = hc.HiCache(layout("tiny_v4"), cfg)
    d = Driver(cache)
    d.request([1, 2, 3])
    cache.drain()                     # the backup lands, then the prefix leaves the device
    cache.evict(6, 6)
    cache.drain()
    tokens = np.concatenate([seq([1, 2, 3]), np.asarray([7], np.int32)])
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="deferred must be a bool"):
            cache.acquire(tokens, deferred=bad)
        with pytest.raises(ValueError, match="deferred must be a bool"):
            cache.load_back(cache.match_prefix(tokens), deferred=bad)
    prefix = cache.acquire(tokens, deferred=True)
    assert prefix.landing is not None and prefix.host_tokens == 3 * 256
    assert not any(t.direction is hc.Direction.LOAD for t in cache.step().completed)   # no step has landed it
    pools = land_in_step(cache.device_pools, prefix.landing)
    with pytest.raises(ValueError, match="names no deferred load"):
        cache.set_device_pools(pools, landed=object())
    cache.set_device_pools(pools, landed=prefix.landing)
    with pytest.raises(ValueError, match="names no deferred load"):     # landed once only
        cache.set_device_pools(cache.device_pools, landed=prefix.landing)
    jax.block_until_ready(cache.device_pools)                              # the step has run
    assert any(t.direction is hc.Direction.LOAD for t in cache.step().completed)
    d.verify([1, 2, 3], prefix.device_pages, prefix.swa_pages)
    cache.unlock(prefix.lock)
    cache.check_invariants()


def test_a_landing_the_cache_landed_first_is_accepted_from_the_step():
    """A deferred load that `drain` (or a short `alloc`) landed before the step: the step
    writes the same bytes again, and its `landed=` is a no-op."""
    cfg = hc.HiCacheConfig(device_pages=6, host_pages=24, check_invariants=True,
                           transfer=hc.TransferConfig(layer_groups=3))
    cache = hc.HiCache(layout("tiny_v41"), cfg)
    d = Driver(cache)
    d.request([1, 2])
    cache.drain()                     # the backup lands, then the prefix leaves the device
    cache.evict(6, 6)
    cache.drain()
    prefix = cache.acquire(np.concatenate([seq([1, 2]), np.asarray([7], np.int32)]), deferred=True)
    assert prefix.landing is not None
    cache.drain()                                            # the cache lands it
    cache.set_device_pools(land_in_step(cache.device_pools, prefix.landing), landed=prefix.landing)
    d.verify([1, 2], prefix.device_pages, prefix.swa_pages)
    assert cache.stats().deferred_loads == {"cache": 1}
    cache.unlock(prefix.lock)


def test_a_deferred_acquire_that_leaves_nothing_to_land_waits_for_its_load():
    """Found by the stateful test: when every row of a deferred load moves at once (rows of a
    larger block), there is no landing; `acquire` waits for that load like a blocking one,
    so a load that fails is recomputed instead of served."""
    cfg = hc.HiCacheConfig(device_pages=4, host_pages=6, write_policy="write_back", check_invariants=True,
                           load_back_threshold=1)
    cache, faulty = faulty_cache(layout("tiny_gqa"), cfg)
    d = Driver(cache)
    d.request([0, 0], swa_every=True)
    cache.evict(4, 0)                           # one node of two pages, written back as one 2-row block
    faulty.fail_done.add("load")
    prefix = cache.acquire(np.concatenate([seq([0]), [7]]), deferred=True)
    assert prefix.landing is None and prefix.length == 0 and prefix.refused is not None
    assert cache.stats().failures == {"load/completion": 1}
    cache.unlock(prefix.lock)
    faulty.fail_done.add("load")
    assert d.request([0], land="step") == 0    # fails again: recomputed, its bytes checked
    assert d.request([0], land="step") == P    # then served from the host


def test_alloc_waits_for_loads_in_flight_on_a_slow_link():
    """Found by the stateful test: a deferred load-back whose request has ended still pins
    its pages until it lands; on a link that is only seen done when waited on, a later
    `alloc` that comes up short must wait for it rather than refuse."""
    cfg = hc.HiCacheConfig(device_pages=4, host_pages=6, write_policy="write_back", check_invariants=True,
                           load_back_threshold=1)
    cache, _ = faulty_cache(layout("tiny_gqa"), cfg, slow={"backup", "load"})
    d = Driver(cache)
    for blocks in ([0], [0, 0], [0], [1], [2, 1, 0], [0, 0]):
        d.request(blocks, swa_every=True)
    cache.drain()                               # the demotions' host copies land
    m = cache.match_prefix(np.concatenate([seq([2]), [7]]))
    lb = cache.load_back(m, deferred=True)      # row 0 of [2, 1, 0]'s 2-row block: no landing, a load in flight
    assert lb.started and lb.landing is None
    cache.unlock(lb.lock)                       # its request ends before the load is seen done
    assert cache.stats().in_flight["load"] == 1
    grant = cache.alloc(4, 0)                   # every device page: short while the load pins some
    assert grant is not None and cache.stats().in_flight["load"] == 0
    cache.free("kv", grant["kv"])
    assert d.request([0, 0]) >= 0
    cache.drain()
    cache.check_invariants()


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_v41", "tiny_gqa"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("link", ["fast", "slow"])
def test_shared_prefixes_survive_eviction_and_load_back(name, policy, link):
    """`slow`: no transfer is seen done by polling, only when waited on (a link slower
    than the serving loop); the cache must serve the same bytes either way."""
    cfg = hc.HiCacheConfig(device_pages=6, host_pages=24, write_policy=policy, check_invariants=True)
    cache, _ = faulty_cache(layout(name), cfg, slow={"backup", "load"} if link == "slow" else ())
    d = Driver(cache)
    rng = np.random.default_rng(zlib.crc32(f"{name}{policy}".encode()))
    convs = [[int(rng.integers(0, 3))] + [int(x) for x in rng.integers(0, 4, 2)] for _ in range(5)]
    for turn in range(4):
        for conv in convs:
            d.request(conv, swa_every=turn % 2 == 0)
            conv.append(int(rng.integers(0, 4)))            # next turn extends the conversation
            if len(conv) > 5:
                del conv[3:]                                 # keep requests within the device pool
    cache.drain()
    cache.check_invariants()
    s = cache.stats()
    assert d.host_hits > 0 and s.host_hit_tokens == d.host_hits
    assert sum(s.load_bytes.values()) > 0 and sum(s.backup_bytes.values()) > 0
    assert s.in_flight == {"backup": 0, "load": 0, "prefetch": 0}
    if policy == "write_through":
        assert not s.dropped_tokens


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_v41", "tiny_gqa"])
def test_early_copies_serve_the_same_bytes(name):
    """With every one-block load copied early (`prefetch` while the tree plans it, or first
    thing in the engine's start), hits serve the bytes written and no copy is left behind."""
    cfg = hc.HiCacheConfig(device_pages=6, host_pages=24, write_policy="write_through", check_invariants=True)
    cache, _ = faulty_cache(layout(name), cfg)
    cache._engine._early.early_bytes = 0
    d = Driver(cache)
    for turn in range(3):
        for conv in ([0, 1], [2, 3], [1, 0], [3, 2]):
            d.request(conv + [turn] * (turn > 0))
    cache.drain()
    assert d.host_hits > 0
    early = [k for k in cache._engine.compiled_programs() if "load_block" in k and k.endswith(", 1]")
             or k.startswith("plan:load_block") and ", 1)" in k]
    assert early, sorted(cache._engine.compiled_programs())
    assert not cache._engine._early._pending


@pytest.mark.parametrize("name,tp", [("tiny_gqa", 2), ("tiny_gqa", 4), ("tiny_v4", 2)])
def test_on_a_tp_mesh(name, tp):
    """GQA K/V is split by kv head across ranks (each rank backs up its shard); V4 pools are
    replicated (one host copy, broadcast on load). Bytes must come back the same."""
    mesh = tp_mesh(tp)
    cache = hc.HiCache(layout(name), hc.HiCacheConfig(device_pages=6, host_pages=24, check_invariants=True),
                       mesh=mesh)
    d = Driver(cache)
    for turn in range(3):
        for conv in ([0, 1], [2, 3], [1, 0]):
            d.request(conv + [turn] * (turn > 0))
    cache.drain()
    assert d.host_hits > 0
    spec = next(p for p in cache.layout.byte_pools if p.sharding == "tp") if name == "tiny_gqa" else None
    if spec is not None:
        assert cache.device_pools[spec.name].sharding.spec[spec.shard_axis + 2] == "tp"
    # host tier: each rank keeps its shard of tp rows; replicated rows are kept once, on one device
    for allocator, table in cache._engine.host.tables.items():
        assert table.arrays, allocator
        for block in (a for parts in table.arrays.values() for a in parts):
            shards = {s.device for s in block.addressable_shards}
            assert len(shards) == (tp if cache._engine.host.formats[allocator].sharded else 1), allocator
            assert block.sharding.memory_kind == "pinned_host"
