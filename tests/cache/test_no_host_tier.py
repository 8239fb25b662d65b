"""`host_pages=0`: a cache with no host tier, the device prefix cache a server has without
offloading. Prefixes are served from the device; nothing is backed up or loaded; an
evicted page is dropped (reason `no_host_tier`); whatever is served is the right bytes."""
import numpy as np
import pytest

import hicache_jax as hc
from driver import Driver, layout, prompt


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_a_cache_without_a_host_tier_serves_from_the_device_and_drops_what_it_evicts(name, policy):
    cache = hc.HiCache(layout(name), hc.HiCacheConfig(device_pages=6, host_pages=0, write_policy=policy,
                                                      check_invariants=True))
    driver = Driver(cache)
    conversations = [[0, 1], [0, 1, 2], [3, 4], [0, 1, 2], [5, 6, 7], [3, 4, 8]]
    served = [driver.request(blocks, swa_every=True) for blocks in conversations]   # every served page checked
    assert served[2] == 0 and served[3] == 3 * 256 and served[1] == 2 * 256
    assert served[5] == 0                    # [3, 4] made room for [5, 6, 7] and is gone, not on a host
    s = cache.stats()
    assert s.host_hit_tokens == 0 and not s.backup_bytes and not s.load_bytes
    assert set(s.host_capacity_bytes.values()) == {0}
    assert s.dropped_tokens and all(set(r) == {"no_host_tier"} for r in s.dropped_tokens.values())
    dropped = [line for line in cache.metrics_text().splitlines()
               if line.startswith("hicache_dropped_tokens_total{") and 'reason="no_host_tier"' in line]
    assert dropped and sum(float(line.split()[-1]) for line in dropped) > 0
    assert cache.evict_host(10, 10 if cache.swa_allocator else 0) == 0
    prefix = cache.acquire(prompt([3, 4, 8]), deferred=True)   # on the device: nothing to load or land
    assert prefix.device_tokens == 3 * 256 and prefix.landing is None
    cache.unlock(prefix.lock)
    cache.drain()
    cache.check_invariants()
    cache.close()


def test_warm_up_and_landing_examples_need_no_host_tier():
    cache = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=8, host_pages=0))
    cache.warmup()
    list(cache.landing_examples())
    assert cache.stats().host_used_bytes == dict.fromkeys(cache.stats().host_used_bytes, 0)
    cache.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(host_pages=0, storage=hc.StorageConfig(url="file:///tmp/nowhere")), "storage tier .* needs a host tier"),
    (dict(host_pages={"kv": 4, "swa": 0}), r"host pages \{'kv': 4, 'swa': 0\}: give every allocator"),
    (dict(host_pages=-1), "host_pages"),
])
def test_a_host_tier_of_some_zero_pages_is_refused_with_the_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=8, **kwargs))


def test_the_request_bytes_survive_many_rounds_on_a_small_device():
    cache = hc.HiCache(layout("tiny_v41"), hc.HiCacheConfig(device_pages=5, host_pages=0, check_invariants=True))
    driver, rng = Driver(cache), np.random.default_rng(3)
    for _ in range(30):
        driver.request([int(b) for b in rng.integers(0, 4, rng.integers(1, 4))], swa_every=bool(rng.integers(2)))
    assert driver.device_hits > 0 and driver.host_hits == 0
    cache.close()
