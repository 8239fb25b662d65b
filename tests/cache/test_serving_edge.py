"""The serving edge: a started load-back stays pinned until its caller lets go, every alloc is
all or nothing, an alloc that cannot succeed destroys nothing, and every misuse is a
ValueError naming the value, after which the cache still serves correctly."""
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.tree import Tier
from conftest import tp_mesh
from driver import Driver, P, layout, seq

LAYOUTS = ["tiny_v4", "tiny_v41", "tiny_gqa"]


def on_host_only(name, blocks=(0, 1), **cfg):
    """A cache whose prompt `blocks` lives on the host only (every device page free)."""
    cfg = dict(dict(device_pages=4, host_pages=8, check_invariants=True, load_back_threshold=1), **cfg)
    c = hc.HiCache(layout(name), hc.HiCacheConfig(**cfg))
    d = Driver(c)
    d.request(list(blocks), swa_every=True)
    c.drain()
    c.evict(10 ** 6, 10 ** 6 if c.swa_allocator else 0)
    c.drain()
    assert c.match_prefix(prompt(blocks)).device_len == 0
    return c, d


def prompt(blocks):
    return np.concatenate([seq(blocks), np.asarray([7], np.int32)])


@pytest.mark.parametrize("name,pressure", [(n, p) for n in LAYOUTS for p in ("kv", "swa", "evict")
                                           if not (p == "swa" and n == "tiny_gqa")])   # GQA has no SWA pool
def test_a_landed_load_back_stays_pinned_until_released(name, pressure):
    """The issue's reproduction: the load lands in `step()`, another request is served before
    this one uses the pages; its pages (and the window's SWA page) must still be its own."""
    c, d = on_host_only(name)
    blocks = [0, 1]
    m = c.match_prefix(prompt(blocks))
    pin = c.lock(m.device_node)
    lb = c.load_back(m)
    assert lb.started and lb.lock is not None
    while not c.step().loaded(lb.load_id):
        pass
    # another request is served first, and wants everything it can get
    if pressure == "evict":
        c.evict(10 ** 6, 10 ** 6 if c.swa_allocator else 0)
        other = None
    else:
        want = (4, 0) if pressure == "kv" else (0, 4)
        assert c.alloc(*want) is None          # the loaded pages are pinned: not enough room
        other = c.alloc(2, 2 if c.swa_allocator else 0)
        assert other is not None
        d.write({a: [(int(p), (5, 5)) for p in pages] for a, pages in other.items()})   # its own bytes
        for a, pages in other.items():
            assert not set(pages.tolist()) & set(lb.device_pages.tolist() if a == "kv" else lb.swa_pages.tolist())
    assert c.wait(lb)
    d.verify(blocks, lb.device_pages, lb.swa_pages)   # still what it says
    c.unlock(pin)
    c.unlock(lb.lock)
    if other is not None:
        for a, pages in other.items():
            c.free(a, pages)
    assert c.match_prefix(prompt(blocks)).device_len == 2 * P
    d.request(blocks)                                # served again, bytes checked
    with pytest.raises(ValueError, match="not a held lock"):
        c.unlock(lb.lock)                            # released once, not twice


@pytest.mark.parametrize("blocks", [(0,), (0, 1)])
def test_the_pages_a_hit_returns_are_the_callers_own_arrays(blocks):
    """Writing into a prefix's page arrays cannot reach the tree's own."""
    c, d = on_host_only("tiny_v4", blocks)
    p = c.acquire(prompt(blocks))
    assert p.length == len(blocks) * P
    pages, swa = p.device_pages.copy(), p.swa_pages.copy()
    p.device_pages[:] = 3
    p.swa_pages[:] = 3
    c.check_invariants()
    m = c.match_prefix(prompt(blocks))
    np.testing.assert_array_equal(m.device_pages, pages)
    np.testing.assert_array_equal(m.swa_pages, swa)
    d.verify(list(blocks), pages, swa)
    c.unlock(p.lock)


def test_a_failed_load_keeps_its_lock_until_released():
    from faults import faulty_cache
    c, faulty = faulty_cache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=4, host_pages=8, check_invariants=True))
    d = Driver(c)
    d.request([0, 1], swa_every=True)
    c.drain()
    c.evict(10 ** 6, 10 ** 6)
    c.drain()
    faulty.fail_done.add("load")
    m = c.match_prefix(prompt([0, 1]))
    lb = c.load_back(m)
    assert lb.started and not c.wait(lb)
    c.unlock(lb.lock)
    c.check_invariants()
    assert d.request([0, 1]) == 2 * P                # the host copy is still good


@pytest.mark.parametrize("name", LAYOUTS)
def test_lock_of_a_node_not_on_device_is_an_error(name):
    c, _ = on_host_only(name)
    m = c.match_prefix(prompt([0, 1]))
    with pytest.raises(ValueError, match="not on device"):
        c.lock(m.host_node)
    c._core.evict_host(dict.fromkeys(c._core.components.names, 10 ** 6))
    with pytest.raises(ValueError, match="not in the tree"):
        c.lock(m.host_node)
    for bad in ("abc", 1.0, None, True):
        with pytest.raises(ValueError, match="node id"):
            c.lock(bad)
    c.unlock(c.lock(m.device_node))                  # the root: an empty prefix is fine
    c.check_invariants()


def free_counts(c):
    return {(t, a.name): a.num_free for t in Tier for a in c._core.ledger.allocators(t)}


@pytest.mark.parametrize("args", [(1, np.float64(1.0)), (np.float32(2.0), 1), ("3", 0), (1, "1"), (True, 0),
                                  (1, -1), (-2, 0), (None, 0), ([1], 0)])
def test_alloc_is_all_or_nothing_for_every_argument(args):
    c = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=4, host_pages=8, check_invariants=True))
    before = free_counts(c)
    with pytest.raises(ValueError, match="pages"):
        c.alloc(*args)
    assert free_counts(c) == before
    c.check_invariants()
    got = c.alloc(np.int64(1), np.int32(1))          # integral numpy scalars are fine
    assert got["kv"].size == 1 and got["swa"].size == 1
    c.free("kv", got["kv"])
    c.free("swa", got["swa"])
    Driver(c).request([0, 1])


def tree_pages(c):
    return {n.id: (n.state, [None if a is None else a.tolist() for a in n.pages[Tier.DEVICE]])
            for n in c._core.tree.nodes()}


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_an_alloc_that_cannot_succeed_destroys_nothing(policy):
    c = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=8, host_pages=16, write_policy=policy,
                                                       check_invariants=True))
    d = Driver(c)
    d.request([0, 1])
    d.request([2, 3])
    c.drain()
    before, stats = tree_pages(c), c.stats()
    assert c.alloc(10 ** 4) is None                  # larger than the device tier
    prefix = c.acquire(prompt([0, 1]))
    assert c.alloc(7) is None                        # 4 free + 2 evictable: [0, 1] is locked
    c.unlock(prefix.lock)
    assert tree_pages(c) == before and c.stats().dropped_tokens == stats.dropped_tokens
    assert c.stats().evicted_tokens == stats.evicted_tokens
    got = c.alloc(5)                                 # feasible: evicts what it needs, no more
    assert got is not None
    assert c.stats().evicted_tokens["device"] - stats.evicted_tokens["device"] == 2 * P
    c.free("kv", got["kv"])
    d.request([0, 1])


def test_a_load_back_that_cannot_fit_is_refused_before_evicting():
    c, d = on_host_only("tiny_gqa", blocks=(0, 1, 2), device_pages=4, host_pages=8)
    d.request([5])                                   # something on device
    held = c.alloc(3)                                # 3 of 4 device pages held by a request
    before = tree_pages(c)
    lb = c.load_back(c.match_prefix(prompt([0, 1, 2])))
    assert lb.refused is hc.Refusal.NO_DEVICE_SPACE and lb.lock is None
    assert tree_pages(c) == before                   # page [5] was not evicted for nothing
    c.free("kv", held["kv"])
    assert d.request([0, 1, 2]) == 3 * P


def test_insert_refuses_pages_another_requests_lock_pins():
    """Pages of the tree that another request's lock pins are not the caller's to give:
    only its held pages, or the tree's own page at the same logical page (a prefix it
    reused), are accepted; anything else would leave the tree owning a page twice."""
    c = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=12, swa_device_pages=7, host_ratio=1.5,
                                                       check_invariants=True))
    d = Driver(c)
    d.request([0, 1, 2], swa_every=True)
    other = c.acquire(np.concatenate([seq([0, 1, 2]), [7]]))    # another request pins pages 0..2
    assert other.length == 3 * P and len(other.swa_pages) == 1
    grant = c.alloc(1, 1)
    before, stats = free_counts(c), c.stats()
    tokens, table = seq([0, 1, 2, 3]), [*other.device_pages.tolist(), *grant["kv"].tolist()]
    locked_swa = int(other.swa_pages[-1])
    with pytest.raises(ValueError, match=rf"swa device pages \[{locked_swa}\] that are neither held"):
        c.insert(tokens, table, {3: locked_swa})             # its window page, given as this request's
    with pytest.raises(ValueError, match=r"kv device pages \[1, 0\] that are neither held"):
        c.insert(tokens, [table[1], table[0], *table[2:]], {3: int(grant["swa"][0])})   # its pages, swapped
    assert free_counts(c) == before and c.stats() == stats
    c.insert(tokens, table, {3: int(grant["swa"][0])})       # its own pages, and the tree's where it reused them
    c.unlock(other.lock)
    c.check_invariants()


@pytest.fixture(scope="module")
def served():
    c = hc.HiCache(layout("tiny_v4"), hc.HiCacheConfig(device_pages=6, host_pages=12, check_invariants=True))
    d = Driver(c)
    d.request([0, 1])
    c.drain()
    return c, d


@pytest.mark.parametrize("call,match", [
    (lambda c: c.evict("3"), r"num_pages must be an integer >= 0, got '3'"),
    (lambda c: c.evict(1, 0.5), r"swa_pages .* got 0.5"),
    (lambda c: c.lock("abc"), r"node id .* got 'abc'"),
    (lambda c: c.alloc("3"), r"pages must be an integer >= 0, got '3'"),
    (lambda c: c.insert(seq([7]), [1.0]), r"device_pages must be a 1-D sequence of integer page ids, got float64"),
    (lambda c: c.insert(seq([7]), np.array([0.9])), r"device_pages .* float64"),
    (lambda c: c.insert(seq([7]), [0], {0.5: 1}), r"swa_pages key .* got 0.5"),
    (lambda c: c.insert(seq([7]), [0], {0: 1.5}), r"swa_pages\[0\] .* got 1.5"),
    (lambda c: c.insert(seq([7]), [0], [1]), r"swa_pages must be a mapping"),
    (lambda c: c.free("kv", [2.0]), r"pages freed to 'kv' must be a 1-D sequence of integer page ids"),
    (lambda c: c.free("kv", ["a"]), r"pages freed to 'kv'"),
    (lambda c: c.free(3, [2]), r"no device allocator 3"),
    (lambda c: c.retract(seq([7]), [0.0]), r"device_pages .* float64"),
    (lambda c: c.wait("x"), r"wait takes a LoadBack, got str"),
    (lambda c: c.acquire(seq([0]), load_back="yes"), r"load_back must be a bool, got 'yes'"),
    (lambda c: c.warmup("3"), r"max_pages must be an integer >= 1, got '3'"),
    (lambda c: c.warmup(0), r"max_pages must be an integer >= 1, got 0"),
    (lambda c: c.unlock("lock"), r"'lock' is not a held lock"),
    (lambda c: c.load_back(None), r"load_back takes a MatchResult, got NoneType"),
    (lambda c: c.match_prefix("abc"), r"tokens must be a 1-D sequence of integers"),
    (lambda c: c.set_device_pools([1, 2]), r"pools|mapping"),
])
def test_misuse_is_a_clear_error_and_changes_nothing(served, call, match):
    c, d = served
    before, stats = free_counts(c), c.stats()
    with pytest.raises(ValueError, match=match):
        call(c)
    assert free_counts(c) == before and c.stats() == stats
    c.check_invariants()
    assert d.request([0, 1]) == 2 * P                # and it serves a normal request correctly


@pytest.mark.parametrize("kwargs,match", [
    (dict(host_ratio=float("inf")), r"'host_ratio' must be a finite positive number, got inf"),
    (dict(host_ratio=float("nan")), r"'host_ratio' must be a finite positive number, got nan"),
    (dict(host_ratio="2"), r"'host_ratio' must be a finite number, got '2'"),
    (dict(link_bytes_per_second=float("inf")), r"'link_bytes_per_second'.*inf"),
    (dict(recompute_seconds_per_token=float("nan")), r"'recompute_seconds_per_token'.*nan"),
    (dict(load_overhead_seconds=-1e-3), r"'load_overhead_seconds' must be >= 0, got -0.001"),
    (dict(load_overhead_seconds=float("inf")), r"'load_overhead_seconds'.*inf"),
    (dict(load_overhead_seconds="1ms"), r"'load_overhead_seconds' must be a finite number"),
    (dict(transfer="fast"), r"'transfer' must be a TransferConfig"),
    (dict(storage="file:///tmp/x"), r"'storage' must be a StorageConfig"),
    (dict(host_pages=8.0), r"'host_pages' must be an integer >= 0, got 8.0"),
    (dict(host_budget_bytes={"kv": 1e9, "swa": 1}), r"'host_budget_bytes\['kv'\]' must be an integer"),
    (dict(write_policy=["write_back"]), r"'write_policy' must be one of"),
    (dict(check_invariants="yes"), r"'check_invariants' must be a bool"),
])
def test_config_rejects_non_finite_and_non_numeric_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hc.HiCacheConfig(device_pages=4, **kwargs)


@pytest.mark.parametrize("section, kwargs, match", [
    ("transfer", dict(timeout_s=float("inf")), r"TransferConfig field 'timeout_s'.*inf"),
    ("transfer", dict(timeout_s="30"), r"'timeout_s' must be a finite number, got '30'"),
    ("transfer", dict(max_staging_bytes=float("inf")), r"'max_staging_bytes' must be an integer"),
    ("transfer", dict(landing_buckets=0), r"'landing_buckets' must be an integer >= 1, got 0"),
    ("transfer", dict(landing_buckets=True), r"'landing_buckets' must be an integer"),
    ("transfer", dict(kernels=None), r"'kernels' must be a kernel name"),
    ("storage", dict(url="ftp://x"), r"StorageConfig field 'url'"),
    ("storage", dict(write_policy="sometimes"), r"'write_policy' must be one of write_through, write_back"),
    ("storage", dict(prefetch_share=1.5), r"'prefetch_share' must be in \(0, 1\]"),
    ("storage", dict(io_threads=0), r"'io_threads' must be an integer >= 1"),
])
def test_config_sections_name_the_bad_field(section, kwargs, match):
    kind = {"transfer": hc.TransferConfig, "storage": hc.StorageConfig}[section]
    with pytest.raises(ValueError, match=match):
        kind(**kwargs)


def test_policies_given_as_strings_become_their_enums():
    cfg = hc.HiCacheConfig(device_pages=4, write_policy="write_back",
                           storage=hc.StorageConfig(write_policy="write_back", prefetch_policy="best_effort"))
    assert cfg.write_policy is hc.WritePolicyName.WRITE_BACK
    assert cfg.storage.write_policy is hc.StorageWritePolicy.WRITE_BACK
    assert cfg.storage.prefetch_policy is hc.PrefetchPolicy.BEST_EFFORT and cfg.storage.prefetch_wait_s(10**6) == 0.0


def test_constructor_arguments_are_checked():
    lay, cfg = layout("tiny_v4"), hc.HiCacheConfig(device_pages=4, host_pages=8)
    with pytest.raises(ValueError, match="mesh must be a jax.sharding.Mesh"):
        hc.HiCache(lay, cfg, mesh="tp")
    with pytest.raises(ValueError, match="clock must be a callable"):
        hc.HiCache(lay, cfg, clock=3.0)
    mesh = tp_mesh(2)
    hc.HiCache(layout("tiny_gqa"), cfg, mesh=mesh).check_invariants()
