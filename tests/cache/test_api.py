"""Bad input gets a ValueError naming the value, and nothing changes; the V4.1 retract rule."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from conftest import other_device
from driver import Driver, P, layout, seq


@pytest.fixture(scope="module")
def cache():
    c = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))
    Driver(c).request([0, 1])
    c.drain()
    return c


@pytest.mark.parametrize("mutate,match", [
    (lambda p: p.pop("swa"), r"lack \['swa'\]"),
    (lambda p: p.update(extra=p["swa"]), r"unexpected \['extra'\]"),
    (lambda p: p.update(swa=p["swa"][:, :3]), "has shape"),
    (lambda p: p.update(swa=p["swa"].astype(jnp.int32)), "dtype"),
    (lambda p: p.update(swa=np.asarray(p["swa"])), "not a jax.Array"),
    (lambda p: p.update(swa=jax.device_put(p["swa"], other_device(p["swa"]))), "sharding|placed"),
])
def test_set_device_pools_rejects_wrong_pools(cache, mutate, match):
    before = cache.device_pools
    bad = dict(before)
    mutate(bad)
    with pytest.raises(ValueError, match=match):
        cache.set_device_pools(bad)
    assert all(cache.device_pools[k] is v for k, v in before.items())
    cache.check_invariants()


@pytest.mark.parametrize("tokens", [["a", "b"], np.ones((2, 300), np.int32), np.array([1.5, 2.0]), [-3, 4]])
def test_bad_tokens(cache, tokens):
    stats = cache.stats()
    with pytest.raises(ValueError, match="tokens|token ids"):
        cache.match_prefix(tokens)
    assert cache.stats() == stats


@pytest.mark.parametrize("kwargs,match", [
    (dict(device_pages=4, write_policy="write_sometimes"), "write_policy.*'write_sometimes'"),
    (dict(device_pages=-1), "'device_pages' must be an integer >= 1, got -1"),
    (dict(device_pages=4, host_pages=-2), "'host_pages' must be an integer >= 0, got -2"),
    (dict(device_pages=4, host_ratio=0), "'host_ratio' must be a finite positive number"),
    (dict(device_pages=4, host_pages=8, host_ratio=2.0), "one of host_pages, host_ratio"),
    (dict(device_pages=4, load_back_threshold=1.5), "'load_back_threshold' must be an integer"),
    (dict(device_pages=4, write_through_threshold=0), "'write_through_threshold' must be an integer >= 1"),
    (dict(device_pages=4, transfer_timeout_s=-1), "unexpected keyword argument 'transfer_timeout_s'"),
    (dict(device_pages=4.0), "'device_pages' must be an integer"),
])
def test_config_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):   # a field that moved to a section: TypeError
        hc.HiCacheConfig(**kwargs)


def test_budgets_must_cover_the_allocators_and_fit_the_host_limit():
    lay = layout("tiny_v4")
    with pytest.raises(ValueError, match=r"\['swa'\]"):
        hc.HiCache(lay, hc.HiCacheConfig(device_pages=4, host_budget_bytes={"kv": 1 << 20}))
    with pytest.raises(ValueError, match="host"):
        hc.HiCache(lay, hc.HiCacheConfig(device_pages=4, host_pages=64,
                                         transfer=hc.TransferConfig(host_memory_limit_bytes=1 << 20)))
    cfg = hc.HiCacheConfig(device_pages=4, host_budget_bytes={"kv": 10 * lay.page_bytes_of("kv"),
                                                             "swa": 3 * lay.page_bytes_of("swa")})
    assert cfg.page_counts(lay)[1] == {"kv": 10, "swa": 3}


def test_bad_calls_change_nothing(cache):
    stats, held = cache.stats(), cache._core.held_pages("kv")
    with pytest.raises(ValueError, match="neither held"):
        cache.insert(seq([5]), [5])
    with pytest.raises(ValueError, match="not held"):
        cache.free("kv", [5])
    with pytest.raises(ValueError, match="takes a MatchResult"):
        cache.load_back("everything")
    with pytest.raises(ValueError, match="not a held lock"):
        cache.unlock(hc.tree.LockId(999))
    with pytest.raises(ValueError, match="-1"):
        cache.evict(-1)
    assert cache.stats() == stats and cache._core.held_pages("kv") == held
    cache.check_invariants()


def test_retract_keeps_whole_pages_only():
    """V4.1: state inside an unfinished page (the ratio-2 pair ring) is never backed up;
    a retracted request resumes from its last whole page and recomputes the rest."""
    c = hc.HiCache(layout("tiny_v41"), hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))
    grant = c.alloc(3, 3)
    tokens = seq([0, 1, 2])[: 2 * P + 100]         # 2 whole pages and 100 tokens of a third
    resume = c.retract(tokens, grant["kv"], {1: int(grant["swa"][1]), 2: int(grant["swa"][2])})
    c.free("swa", [int(grant["swa"][0])])
    assert resume == 2 * P
    assert c._core.held_pages("kv") == 0 and c._core.held_pages("swa") == 0
    m = c.match_prefix(tokens)
    assert m.device_len == 2 * P and m.host_len == 0
    c.check_invariants()


def test_cost_model_skips_loads_slower_than_recompute():
    lay = layout("tiny_v4")

    def host_hit(cache):
        d = Driver(cache)
        d.request([0, 1, 2])
        cache.drain()
        cache.evict(3)
        return cache.match_prefix(np.concatenate([seq([0, 1, 2]), [7]]))

    # 768 host tokens + one SWA window page: ~0.44 MB, ~18 us at 25 GB/s; recomputing at
    # 1 ns per token takes 0.8 us, so the load is not worth it
    cheap = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12, recompute_seconds_per_token=1e-9))
    m = host_hit(cheap)
    assert m.host_len == 3 * P
    lb = cheap.load_back(m)
    assert lb.refused is hc.tree.Refusal.NOT_WORTH_IT and lb.length == m.device_len
    assert cheap.stats().load_refusals == {"not_worth_it": 1}
    # at 1 us per token recomputing takes 768 us: the load wins
    costly = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12, recompute_seconds_per_token=1e-6))
    lb = costly.load_back(host_hit(costly))
    assert lb.started and costly.wait(lb)
    # the same, but any load costs 1 ms of host time: 1.018 ms against 768 us, not worth it;
    # with 0.5 ms it is (0.518 ms)
    slow_host = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12, recompute_seconds_per_token=1e-6,
                                                 load_overhead_seconds=1e-3))
    lb = slow_host.load_back(host_hit(slow_host))
    assert lb.refused is hc.tree.Refusal.NOT_WORTH_IT and slow_host.stats().load_refusals == {"not_worth_it": 1}
    fair = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12, recompute_seconds_per_token=1e-6,
                                            load_overhead_seconds=5e-4))
    lb = fair.load_back(host_hit(fair))
    assert lb.started and fair.wait(lb)


def test_acquire_pins_the_prefix_and_reports_refusals():
    lay = layout("tiny_gqa")        # no SWA window: the FULL threshold alone decides
    c = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True,
                                         load_back_threshold=4 * P))
    Driver(c).request([0, 1, 2])
    c.drain()
    c.evict(3)
    tokens = np.concatenate([seq([0, 1, 2]), [7]])
    p = c.acquire(tokens)                       # 768 host tokens < threshold 1024, no window: refused
    assert (p.length, p.host_tokens, p.refused) == (0, 0, hc.tree.Refusal.BELOW_THRESHOLD)
    c.unlock(p.lock)
    c = hc.HiCache(lay, hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))   # threshold 10
    Driver(c).request([0, 1, 2])
    c.drain()
    c.evict(3)
    p = c.acquire(tokens)
    assert (p.length, p.host_tokens, p.device_tokens, p.refused) == (3 * P, 3 * P, 0, None)
    assert c.evict(3).device_pages == 0         # pinned while acquired
    c.unlock(p.lock)
    assert c.evict(3).device_pages == 3


def test_the_host_limit_follows_xla_pinned_pool_cap(monkeypatch):
    lay = layout("tiny_v4")
    cfg = hc.HiCacheConfig(device_pages=4, host_pages=64)
    monkeypatch.delenv("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB", raising=False)
    assert cfg.transfer.host_limit_bytes() == 64 << 30
    monkeypatch.setenv("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB", "100")
    assert cfg.transfer.host_limit_bytes() == 100 << 30
    monkeypatch.setenv("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB", "0.0001")   # ~107 KB: too small for 64 pages
    with pytest.raises(ValueError, match="XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"):
        hc.HiCache(lay, cfg)
    assert hc.TransferConfig(host_memory_limit_bytes=1 << 40).host_limit_bytes() == 1 << 40
    monkeypatch.setenv("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB", "lots")
    with pytest.raises(ValueError, match="'lots'"):
        cfg.transfer.host_limit_bytes()
