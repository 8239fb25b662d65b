"""`alloc` never refuses while eviction could make room, whatever failed before it.

Random serving through the public API over an engine that fails transfers on demand (at
start or at completion, backups and loads), with backups left queued between requests
and pages held by requests across steps. After every step a probe asks `alloc` for a
fixed amount: when it refuses, `device_room()` must say which allocator is short, and
evicting everything evictable then asking again must be refused too. `check_invariants()`
runs after every call (`HiCacheConfig(check_invariants=True)`).
"""
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

import hicache_jax as hc
from driver import Driver, layout
from faults import faulty_cache
from test_stateful_cache import LAYOUTS, PROMPT, CacheMachine

EVERYTHING = 10 ** 6


def test_a_backup_that_fails_to_start_does_not_make_alloc_refuse():
    """The case that found it: a write-through backup queued by a second hit pins its pages
    (its lock); dispatched by `alloc`, it fails to start and unpins them, and `alloc` must
    then evict them rather than refuse."""
    cfg = hc.HiCacheConfig(device_pages=12, swa_device_pages=7, host_ratio=1.5, write_policy="write_through_selective",
                           load_back_threshold=1, check_invariants=True)
    cache, faulty = faulty_cache(layout("tiny_v4"), cfg)
    d = Driver(cache)
    d.request([0, 1, 2], swa_every=True)
    d.request([0, 1, 2, 3], swa_every=True, step=False)   # second hit: its backup stays queued
    faulty.fail_start.add("backup")
    grant = cache.alloc(12, 7)
    assert grant is not None and len(grant["kv"]) == 12 and len(grant["swa"]) == 7
    assert cache.stats().failures == {"backup/start": 1}
    assert cache.device_room() == {"kv": 0, "swa": 0}      # every page is held now
    cache.free("kv", grant["kv"])
    cache.free("swa", grant["swa"])
    assert cache.alloc(13, 0) is None and cache.device_room() == {"kv": 12, "swa": 7}


class AllocMachine(CacheMachine):
    @initialize(name=st.sampled_from(sorted(LAYOUTS)),
                policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
                device=st.integers(4, 12), swa=st.integers(3, 8), ratio=st.sampled_from([1.0, 1.5, 2.0]),
                probe=st.tuples(st.integers(1, 12), st.integers(0, 8)), first=st.lists(PROMPT, min_size=2, max_size=5))
    def setup(self, name, policy, device, swa, ratio, probe, first):
        cfg = hc.HiCacheConfig(device_pages=device, swa_device_pages=swa, host_ratio=ratio, write_policy=policy,
                               load_back_threshold=1, check_invariants=True)
        self.name, self.cfg, self.slow, self.store = name, cfg, set(), None
        self.cache, self.faulty = faulty_cache(LAYOUTS[name], cfg)
        self.driver = Driver(self.cache)
        self.probe = (min(probe[0], device), min(probe[1], swa) if self.cache.swa_allocator else 0)
        self.seen, self.held = [], []
        for blocks in first:
            self.request(blocks, swa_every=True, load=True, land=None)

    # requests may not fit while other requests hold pages: they are turned away
    @rule(blocks=PROMPT, swa_every=st.booleans(), load=st.sampled_from([True, True, True, False]),
          land=st.sampled_from([None, None, "step", "cache"]), step=st.booleans())
    def request(self, blocks, swa_every, load, land, step=True):
        self.driver.request(blocks, load=load, swa_every=swa_every, land=land, must_fit=False, step=step)
        self.seen.append(blocks)

    @rule(pick=st.integers(0, 31), longer=st.booleans())
    def revisit(self, pick, longer):
        if self.seen:
            blocks = self.seen[pick % len(self.seen)] + ([pick % 3] if longer else [])
            self.driver.request(blocks[:4], swa_every=True, must_fit=False, step=False)

    @rule(n=st.integers(0, 12), m=st.integers(0, 8), keep=st.booleans())
    def alloc(self, n, m, keep):
        grant = self.alloc_or_no_room(n, m if self.cache.swa_allocator else 0)
        if grant is not None and keep:
            self.held.append(grant)      # a request holding pages across steps
        elif grant is not None:
            self.free(grant)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 7))
    def release(self, i):
        self.free(self.held.pop(i % len(self.held)))

    @invariant()
    def alloc_refuses_only_without_room(self):
        if hasattr(self, "cache"):
            grant = self.alloc_or_no_room(*self.probe)
            if grant is not None:
                self.free(grant)

    def alloc_or_no_room(self, n, m):
        c = self.cache
        grant = c.alloc(n, m)
        if grant is None:
            room, need = c.device_room(), {c.anchor: n, **({c.swa_allocator: m} if c.swa_allocator else {})}
            assert any(need[a] > room[a] for a in need), f"alloc({n}, {m}) refused with room {room}"
            c.drain()
            c.evict(EVERYTHING, EVERYTHING if c.swa_allocator else 0)
            assert c.alloc(n, m) is None, f"alloc({n}, {m}) refused, then granted after evicting everything"
        return grant

    def free(self, grant):
        for allocator, pages in grant.items():
            if len(pages):
                self.cache.free(allocator, pages)

    def teardown(self):
        if hasattr(self, "cache"):
            for grant in self.held:
                self.free(grant)
        super().teardown()


TestAllocMachine = pytest.mark.slow(AllocMachine.TestCase)
TestAllocMachine.settings = settings(TestAllocMachine.settings, max_examples=max(1, settings().max_examples // 2),
                                     stateful_step_count=25, report_multiple_bugs=False)
