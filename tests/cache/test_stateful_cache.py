"""Random serving through the public API over a real engine that may be slow or fail.

Each example picks a layout, a write policy and a link (fast, or slow: transfers are seen
done only when waited on), then runs random requests, steps, drains, evictions and
injected transfer failures. The driver writes bytes unique to (pool, token prefix) into
every page it computes and checks every page the cache serves, from device or host, so a
wrongly or half-restored prefix fails the test; `check_invariants()` runs after every call.
At the end every page of every allocator must come back.
"""
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

import hicache_jax as hc
from driver import Driver, layout
from faults import empty_everything, faulty_cache

LAYOUTS = {name: layout(name) for name in ("tiny_v4", "tiny_v41", "tiny_gqa")}
PROMPT = st.lists(st.integers(0, 2), min_size=1, max_size=3)   # blocks of one page each


class CacheMachine(RuleBasedStateMachine):
    @initialize(name=st.sampled_from(sorted(LAYOUTS)),
                policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
                slow=st.booleans(), device=st.integers(4, 6), host=st.integers(6, 24),
                first=st.lists(PROMPT, min_size=2, max_size=5))
    def setup(self, name, policy, slow, device, host, first):
        cfg = hc.HiCacheConfig(device_pages=device, host_pages=host, write_policy=policy, check_invariants=True,
                               load_back_threshold=1)
        self.cache, self.faulty = faulty_cache(LAYOUTS[name], cfg, slow={"backup", "load"} if slow else ())
        self.driver = Driver(self.cache)
        self.seen = []
        for blocks in first:            # some conversations to come back to
            self.request(blocks, swa_every=True, load=True)

    @rule(blocks=PROMPT, swa_every=st.booleans(), load=st.sampled_from([True, True, True, False]))
    def request(self, blocks, swa_every, load):
        self.driver.request(blocks, load=load, swa_every=swa_every)   # checks every served page
        self.seen.append(blocks)

    @rule(pick=st.integers(0, 31), longer=st.booleans())
    def revisit(self, pick, longer):
        """An earlier prompt again (a later turn of that conversation when `longer`)."""
        if self.seen:
            blocks = self.seen[pick % len(self.seen)] + ([pick % 3] if longer else [])
            self.driver.request(blocks[:4], swa_every=True)

    @rule()
    def step(self):
        self.cache.step()

    @rule()
    def drain(self):
        self.cache.drain()
        assert self.cache.stats().in_flight == {"backup": 0, "load": 0}

    @rule(pages=st.integers(1, 4))
    def evict(self, pages):
        self.cache.evict(pages, pages if self.cache.core.swa else 0)

    @rule(direction=st.sampled_from(["backup", "load"]), when=st.sampled_from(["start", "done"]))
    def fail_next(self, direction, when):
        (self.faulty.fail_start if when == "start" else self.faulty.fail_done).add(direction)

    def teardown(self):
        if hasattr(self, "cache"):
            empty_everything(self.cache)


TestCacheMachine = CacheMachine.TestCase
# Half the profile's examples: each one runs the real engine (CI: 20, about 25 s).
TestCacheMachine.settings = settings(TestCacheMachine.settings, max_examples=max(1, settings().max_examples // 2),
                                     stateful_step_count=20, report_multiple_bugs=False)
