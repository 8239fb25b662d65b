"""Random serving through the public API over a real engine that may be slow or fail.

Each example picks a layout, a write policy, a host tier (or none: `host_pages=0`) and a
link (fast, or slow: transfers are seen done only when waited on), then runs random
requests (alone, or a step's batch through `acquire_many`), steps, drains, evictions and
injected transfer failures. The driver writes bytes unique to (pool, token prefix) into
every page it computes and checks every page the cache serves, from device or host, so a
wrongly or half-restored prefix fails the test; `check_invariants()` runs after every call.
A load-back through the pieces (`match_prefix` / `lock` / `load_back` / `step` / `wait`)
has other requests' allocations, inserts and evictions interleaved between every step,
and the pages it describes are checked when it is used. At the end every page of every
allocator must come back.
"""
import numpy as np
import pytest
from hypothesis import assume, event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import hicache_jax as hc
from driver import Driver, layout, seq
from faults import empty_everything, faulty_cache
from hicache_jax.storage import FaultyBackend, MemoryBackend

LAYOUTS = {name: layout(name) for name in ("tiny_v4", "tiny_v41", "tiny_gqa")}
PROMPT = st.lists(st.integers(0, 2), min_size=1, max_size=3)   # blocks of one page each


class CacheMachine(RuleBasedStateMachine):
    @initialize(name=st.sampled_from(sorted(LAYOUTS)),
                policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
                slow=st.booleans(), device=st.integers(4, 6), host=st.integers(6, 24) | st.just(0),
                first=st.lists(PROMPT, min_size=2, max_size=5), paced=st.booleans(), early=st.booleans(),
                groups=st.integers(1, 3), deferred_blocks=st.integers(1, 3),
                view_bytes=st.sampled_from([None, 0, 2048]))
    def setup(self, name, policy, slow, device, host, first, paced, early, groups, deferred_blocks, view_bytes):
        assume(host or self.make_store() is None)            # host 0: no host tier, so no storage tier
        pace = LAYOUTS[name].page_bytes_of(LAYOUTS[name].anchor.name) if paced else None  # a page a step
        cfg = hc.HiCacheConfig(device_pages=device, host_pages=host, write_policy=policy, check_invariants=True,
                               load_back_threshold=1, storage=self.storage_config(),
                               transfer=hc.TransferConfig(backup_bytes_per_step=pace, layer_groups=groups,
                                                          landing_buckets=deferred_blocks, view_bytes=view_bytes))
        self.name, self.cfg, self.slow = name, cfg, {"backup", "load"} if slow else set()
        self.store = self.make_store()
        self.cache, self.faulty = faulty_cache(LAYOUTS[name], cfg, slow=self.slow, storage=self.store)
        if early:                       # every one-block load copied early (prefetch / start)
            self.cache._engine._early.early_bytes = 0
        self.driver = Driver(self.cache)
        self.seen = []
        for blocks in first:            # some conversations to come back to
            self.request(blocks, swa_every=True, load=True, land=None)

    def storage_config(self) -> hc.StorageConfig:
        return hc.StorageConfig()

    def make_store(self):
        return None

    @rule(blocks=PROMPT, swa_every=st.booleans(), load=st.sampled_from([True, True, True, False]),
          land=st.sampled_from([None, None, "step", "cache"]))
    def request(self, blocks, swa_every, load, land):
        self.driver.request(blocks, load=load, swa_every=swa_every, land=land)   # checks every served page
        self.seen.append(blocks)

    @rule(batch=st.lists(PROMPT, min_size=0, max_size=4), picks=st.lists(st.integers(0, 31), max_size=3),
          swa_every=st.booleans(), load=st.sampled_from([True, True, True, False]),
          land=st.sampled_from([None, None, "step", "cache"]))
    def request_many(self, batch, picks, swa_every, load, land):
        """A step's admitted requests in one `acquire_many`: new prompts and earlier ones (a
        shared prefix, duplicates); every served page is checked, then each is computed."""
        batch = batch + [self.seen[k % len(self.seen)] for k in picks if self.seen]
        served = self.driver.request_many(batch, load=load, swa_every=swa_every, land=land)
        event(f"acquire_many of {len(batch)}: {sum(s > 0 for s in served)} served from the cache")
        self.seen.extend(batch)

    @rule(pick=st.integers(0, 31), longer=st.booleans())
    def revisit(self, pick, longer):
        """An earlier prompt again (a later turn of that conversation when `longer`)."""
        if self.seen:
            blocks = self.seen[pick % len(self.seen)] + ([pick % 3] if longer else [])
            self.driver.request(blocks[:4], swa_every=True)

    @rule(pick=st.integers(0, 31), others=st.lists(st.sampled_from(["alloc", "request", "evict", "step"]),
                                                    min_size=1, max_size=6), other=PROMPT)
    def pieces_load(self, pick, others, other):
        """An earlier prompt through the pieces path, with other work between every step."""
        if not self.seen:
            return
        c, blocks = self.cache, self.seen[pick % len(self.seen)]
        held = []                       # pages other requests hold while this one loads

        def interleave(op):
            if op == "alloc":           # another request takes pages and writes its own bytes into them
                n = int(np.random.default_rng(len(held)).integers(1, 3))
                grant = c.alloc(n, n if c.swa_allocator else 0)
                if grant is not None:
                    held.append(grant)
                    self.driver.write({a: [(int(p), (9, 9, len(held))) for p in pages] for a, pages in grant.items()})
            elif op == "request":
                self.driver.request(other, must_fit=False)
            elif op == "evict":
                c.evict(10 ** 6, 10 ** 6 if c.swa_allocator else 0)
            else:
                c.step()

        m = c.match_prefix(np.concatenate([seq(blocks), np.asarray([7], np.int32)]))
        pin = c.lock(m.device_node)
        lb = c.load_back(m) if m.host_len else None
        for op in others:
            interleave(op)
        usable, table, window = m.device_len, m.device_pages, m.swa_pages
        if lb is not None and lb.started:
            if c.wait(lb):
                for op in others:       # after it landed, before the request uses it
                    interleave(op)
                usable, table, window = lb.length, lb.device_pages, lb.swa_pages
            c.unlock(pin)
            pin = lb.lock
        self.driver.verify(blocks, table, window)
        assert len(table) * 256 == usable
        c.unlock(pin)
        for grant in held:
            for allocator, pages in grant.items():
                if len(pages):
                    c.free(allocator, pages)

    @rule()
    def step(self):
        self.cache.step()

    @rule()
    def drain(self):
        self.cache.drain()
        assert not any(self.cache.stats().in_flight.values())

    @rule(pages=st.integers(1, 4))
    def evict(self, pages):
        self.cache.evict(pages, pages if self.cache.swa_allocator else 0)

    @rule(direction=st.sampled_from(["backup", "load"]), when=st.sampled_from(["start", "done"]))
    def fail_next(self, direction, when):
        (self.faulty.fail_start if when == "start" else self.faulty.fail_done).add(direction)

    @invariant()
    def host_blocks_stay_within_the_tier(self):
        if hasattr(self, "cache"):
            for table in self.cache._engine.host.tables.values():
                table.check_invariants()
                assert table.rows <= table.capacity

    def teardown(self):
        if hasattr(self, "cache"):
            empty_everything(self.cache)
            self.cache.close()


class ThreeTierMachine(CacheMachine):
    """The same over three tiers: a storage tier under the host tier, which outlives the
    cache (a restart builds a new one over the same store) and may fail, stall, or hand back
    damaged objects; whatever it serves is checked byte for byte like the rest."""

    def storage_config(self) -> hc.StorageConfig:
        return hc.StorageConfig(prefetch_policy="wait_complete", call_timeout_s=0.5, retry_after_s=0.05)

    def make_store(self):
        return FaultyBackend(MemoryBackend())

    @rule(pick=st.integers(0, 31))
    def restart(self, pick):
        """A new process over the same store: everything but the store is gone. It serves an
        earlier prompt at once (from the store, when the store has it and works)."""
        empty_everything(self.cache)
        self.cache.close()
        self.cache, self.faulty = faulty_cache(LAYOUTS[self.name], self.cfg, slow=self.slow, storage=self.store)
        self.driver = Driver(self.cache)
        if self.seen:
            self.driver.request(self.seen[pick % len(self.seen)], swa_every=True)
            event(f"first request after a restart: {'from storage' if self.driver.storage_hits else 'recomputed'}")

    @rule()
    def evict_host(self):
        self.cache.drain()
        self.cache._core.evict_host(dict.fromkeys(self.cache._core.components.names, 10 ** 6))

    @rule(fault=st.sampled_from(["raise", "damage", "hide", "heal"]))
    def storage_fault(self, fault):
        if fault == "raise":
            self.store.raise_on.update({"exists", "contains", "get", "put"})
        elif fault == "damage":
            self.store.damage["/swa/"] = "checksum"
        elif fault == "hide":
            self.store.hidden_pools.add(self.cache.layout.byte_pools[-1].name)
        else:
            self.store.raise_on.clear()
            self.store.damage.clear()
            self.store.hidden_pools.clear()


TestCacheMachine = pytest.mark.slow(CacheMachine.TestCase)
# Half the profile's examples: each one runs the real engine (CI: 20, about 25 s).
TestCacheMachine.settings = settings(TestCacheMachine.settings, max_examples=max(1, settings().max_examples // 2),
                                     stateful_step_count=20, report_multiple_bugs=False)
TestThreeTierMachine = pytest.mark.slow(ThreeTierMachine.TestCase)
TestThreeTierMachine.settings = settings(TestThreeTierMachine.settings, max_examples=max(1, settings().max_examples // 4),
                                         stateful_step_count=20, report_multiple_bugs=False)
