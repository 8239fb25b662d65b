"""Faults: failed backups and load-backs (at start and at completion), host exhaustion, an
ack that never comes. No slot leaks, no wrong bytes are served, the cache keeps serving."""
import pytest

import hicache_jax as hc
from hicache_jax.tree import Residency, Tier
from driver import Driver, layout, prompt
from faults import empty_everything, faulty_cache


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make(name="tiny_v4", policy="write_through", device=6, host=24, clock=None):
    cfg = hc.HiCacheConfig(device_pages=device, host_pages=host, write_policy=policy, check_invariants=True,
                           transfer=hc.TransferConfig(timeout_s=5.0))
    cache, faulty = faulty_cache(layout(name), cfg, clock=clock or Clock())
    return cache, faulty, Driver(cache)


def churn(d, convs=((0, 1, 2), (1, 2, 3), (2, 3, 0), (3, 0, 1)), rounds=2):
    for _ in range(rounds):
        for c in convs:
            d.request(list(c))


@pytest.mark.parametrize("when", ["start", "done"])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_failed_backup(when, policy):
    cache, faulty, d = make(policy=policy)
    getattr(faulty, f"fail_{when}").add("backup")
    churn(d)
    s = cache.stats()
    assert s.failures.get(f"backup/{'start' if when == 'start' else 'completion'}") == 1
    if policy == "write_back" and when == "done":
        assert s.dropped_tokens["deepseek_v4_c4"]["backup_failed"] > 0   # demoted pages lost with it
    churn(d)                                    # keeps serving: every served byte is verified
    assert d.host_hits > 0
    empty_everything(cache)


@pytest.mark.parametrize("when", ["start", "done"])
@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
def test_failed_load_back_is_recomputed_never_served(when, name):
    cache, faulty, d = make(name)
    churn(d, rounds=1)
    getattr(faulty, f"fail_{when}").add("load")
    before = d.host_hits
    churn(d, rounds=1)                          # the first load fails: that request recomputes
    s = cache.stats()
    assert s.failures.get(f"load/{'start' if when == 'start' else 'completion'}") == 1
    assert d.host_hits > before                 # later loads of the same host copies succeed
    empty_everything(cache)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_host_exhaustion(policy):
    cache, faulty, d = make(policy=policy, host=1)
    churn(d)
    s = cache.stats()
    if policy == "write_back":
        assert sum(r.get("host_pressure", 0) for r in s.dropped_tokens.values()) > 0
    else:
        assert cache._core.stats.backups_without_room > 0
    empty_everything(cache)


def test_ack_that_never_comes_times_out():
    """A backup that hangs after its dispatch: the dispatch read its pages, so they may leave
    the device before the ack (the nodes wait for it on the host); the timeout
    fails it, and the nodes, whose only copy never landed, are dropped and counted."""
    clock = Clock()
    cache, faulty, d = make(clock=clock)
    faulty.hang.add("backup")
    d.request([0, 1, 2])                        # its backup hangs after its dispatch
    assert cache.stats().in_flight["backup"] == 1
    free = cache._core.ledger.allocators(Tier.DEVICE)["kv"].num_free
    assert cache.step().failed == () and cache.evict(3).device_pages == 3   # read already: evictable
    assert cache._core.ledger.allocators(Tier.DEVICE)["kv"].num_free == free + 3
    clock.now = 10.0                            # past transfer_timeout_s
    report = cache.step()
    assert report.failed and cache.stats().failures == {"backup/timeout": 1}
    assert cache.stats().in_flight["backup"] == 0
    page = cache.layout.page_size
    assert cache.stats().dropped_tokens["deepseek_v4_c4"]["backup_failed"] == 3 * page
    churn(d)
    empty_everything(cache)


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
def test_alloc_takes_pages_a_dispatched_backup_has_read_without_waiting_for_it(name):
    """Write-through on a slow link: the pages of a backup in flight were read at its
    dispatch, so a request that needs them evicts them at once (the node waits on the host
    for its ack) instead of waiting for the copy to land; the next hit of that prefix then
    waits for that ack (no other) and loads it back, byte for byte."""
    cache, faulty, d = make(name, "write_through", device=4)
    faulty.slow.add("backup")                   # seen done only when waited for
    d.request([0, 1, 2], swa_every=True)        # the step after it dispatches its backup
    (first,) = cache._core.book.pending_acks()
    d.request([1, 2, 3], swa_every=True)        # takes the first one's pages
    assert first in cache._core.book.pending_acks()           # nobody waited for that copy
    assert cache.stats().transfer_waits.get("room", 0) == 0
    (second,) = set(cache._core.book.pending_acks()) - {first}
    held = cache.acquire(prompt([1, 2, 3]))     # pins the second one's pages: nothing evictable
    assert cache.alloc(4) is None               # refused at once: landing a read copy frees no page
    assert second in cache._core.book.pending_acks() and cache.stats().transfer_waits.get("room", 0) == 0
    cache.unlock(held.lock)
    assert [n.state for n in cache._core.tree.nodes() if n.write_id == first] == [Residency.HOST_PENDING]
    before = d.host_hits
    d.request([0, 1, 2], swa_every=True)        # waits for its ack alone, then loads it back (verified)
    assert first not in cache._core.book.pending_acks() and second in cache._core.book.pending_acks()
    assert d.host_hits - before == 3 * cache.layout.page_size
    assert cache.stats().transfer_waits["pending_write"] == 1
    assert 'hicache_transfer_waits_total{reason="pending_write"} 1.0' in cache.metrics_text()
    empty_everything(cache)


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_slow_link_backups_never_starve_alloc(name, policy):
    """Backups that have not landed by the next request pin their pages (write-through) or
    still write the host copy a request matches; `alloc` and `acquire` wait for them
    instead of answering what a faster link would not have."""
    cache, faulty, d = make(name, policy, device=4)
    faulty.slow.add("backup")
    for conv in ([0, 1, 2], [1, 2, 3], [2, 3, 0], [0, 1, 2], [3, 0, 1]):
        d.request(conv, swa_every=True)         # each takes 3 of the 4 pages: the previous one must go
    assert cache.stats().in_flight["backup"] >= 1
    if policy == "write_through":               # [0, 1, 2] came back from the host
        assert d.host_hits == 3 * 256
    cache.drain()
    before = d.host_hits
    d.request([2, 3, 0], swa_every=True)
    assert d.host_hits - before == 3 * 256 and cache.stats().host_hit_tokens == d.host_hits
    empty_everything(cache)
