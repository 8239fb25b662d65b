"""`HiCache.acquire_many`: a step's requests acquired together, their host loads as one
engine start, each request served exactly as one `acquire` each would serve it."""
import dataclasses

import jax
import numpy as np
import pytest

import hicache_jax as hc
from driver import P, Driver, land_in_step, layout, prompt
from hicache_jax.tree import Refusal

LAYOUTS = {name: layout(name) for name in ("tiny_v4", "tiny_v41", "tiny_gqa")}
SYSTEM = [0, 1]                                   # a shared system prompt of two pages


def make(name="tiny_v4", device=16, host=48, **kw):
    swa = {"swa_device_pages": device} if LAYOUTS[name].swa_pool is not None else {}
    kw = {"load_back_threshold": 1, **swa, **kw}
    cfg = hc.HiCacheConfig(device_pages=device, host_pages=host, check_invariants=True, **kw)
    cache = hc.HiCache(LAYOUTS[name], cfg)
    return cache, Driver(cache)


def offload(driver, conversations):
    """Serve `conversations` (block lists), back them up, evict them: host-only prefixes."""
    c = driver.cache
    for blocks in conversations:
        driver.request(blocks, swa_every=True)
    c.drain()
    c.evict(10 ** 6, 10 ** 6 if c.swa_allocator else 0)
    c.drain()


def count_starts(cache):
    """Wrap the engine's start: the list fills with the direction of every plan started."""
    starts, start = [], cache._engine.start

    def counting(plan, pools, **kw):
        starts.append(plan.direction.value)
        return start(plan, pools, **kw)

    cache._engine.start = counting
    return starts


def unlock_all(cache, prefixes):
    for p in prefixes:
        cache.unlock(p.lock)


def assert_room_back(cache):
    """Nothing held, nothing pinned (once the backups in flight, which pin what they read,
    have landed): every device page could be granted again."""
    from hicache_jax.tree import Tier
    cache.drain()
    device = cache._core.ledger.allocators(Tier.DEVICE)
    caps = {a: device[a].capacity for a in device.order}
    assert cache.device_room() == caps


def stats_view(cache):
    """What `stats()` counts, but the transfers' durations (a merged transfer's time is each of its loads')."""
    return {k: v for k, v in dataclasses.asdict(cache.stats()).items() if k != "durations"}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_bytes_served_and_one_start_for_many_host_hits(name):
    cache, d = make(name)
    convs = [SYSTEM + [2], SYSTEM + [3], [4, 5], [6]]
    offload(d, convs)
    batch = [SYSTEM + [2], [4, 5], [6]]            # distinct host prefixes: one start
    starts = count_starts(cache)
    prefixes = cache.acquire_many([prompt(b) for b in batch])
    assert starts == ["load"]
    for blocks, p in zip(batch, prefixes):
        assert p.refused is None and p.length == len(blocks) * P and p.host_tokens > 0
        d.verify(blocks, p.device_pages, p.swa_pages)
    unlock_all(cache, prefixes)
    assert_room_back(cache)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_program_calls_of_one_merged_start(name):
    """The same hits acquired one by one on an identical cache take one start (and at least
    one program) each; merged, they take one start, and once the merged shape's program is
    compiled (on the background thread, from its `fuse_after`-th load), exactly one program."""
    blocks = ([2, 3], [4], [5, 6])
    calls = {}
    for how in ("one_by_one", "many", "many_again"):
        cache, d = make(name, transfer=hc.TransferConfig(fuse_after=2))
        offload(d, list(blocks))
        toks = [prompt(b) for b in blocks]
        if how == "many_again":                    # the same shape `fuse_after` times before: its program compiles
            for _ in range(cache.config.transfer.fuse_after):
                unlock_all(cache, cache.acquire_many(toks))
                cache.evict(10 ** 6, 10 ** 6 if cache.swa_allocator else 0)
                cache.drain()
            cache.wait_compiles()
        starts, labels = count_starts(cache), []
        cache.on_program_call(lambda label, program, *args: labels.append(label) or program(*args))
        prefixes = cache.acquire_many(toks) if how != "one_by_one" else [cache.acquire(t) for t in toks]
        assert all(p.host_tokens for p in prefixes)
        for b, p in zip(blocks, prefixes):
            d.verify(b, p.device_pages, p.swa_pages)
        calls[how] = (len(starts), labels)
        unlock_all(cache, prefixes)
    assert calls["one_by_one"][0] == 3 and len(calls["one_by_one"][1]) >= 3
    assert calls["many"][0] == 1
    assert calls["many_again"][0] == 1 and len(calls["many_again"][1]) == 1, calls["many_again"]
    assert calls["many_again"][1][0].startswith("plan:load_pieces")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_block_starts_copying_before_any_request_is_planned(name):
    """Every block large enough to copy early (`early_copy_bytes=0`): before the first
    request is matched for its plan, every request's whole anchor block has started for the
    device, one `copy` each while the blocks' shared program compiles in the background,
    then the two 2-page blocks by one `copy_many` (the 1-page block alone, by `copy`),
    having looked ahead at each request (no match, no LRU touch). The merged load unpacks
    those copies, through staging at first and then in its one fused program (pieces marked
    copied), bit for bit; a deferred acquire copies nothing early."""
    blocks = ([2, 3], [4], [5, 6])
    cache, d = make(name, transfer=hc.TransferConfig(early_copy_bytes=0, fuse_after=1,
                                                                  landing_buckets=5))
    offload(d, list(blocks))
    toks = [prompt(b) for b in blocks]
    events, match = [], cache._core.match_prefix
    cache._core.match_prefix = lambda tokens, touch=True: events.append(f"match:{touch}") or match(tokens, touch)
    ahead = cache._core.anchor_pages_ahead
    cache._core.anchor_pages_ahead = lambda tokens: events.append("ahead") or ahead(tokens)
    cache.on_program_call(lambda label, program, *args: events.append(label) or program(*args))
    anchor = cache.layout.anchor.name
    early = (f"{anchor}:copy[", f"{anchor}:copy_many[")
    rounds = []
    for deferred in (False, False, True):
        events.clear()
        prefixes = cache.acquire_many(toks, deferred=deferred)
        if deferred:
            landing = prefixes[0].landing
            cache.set_device_pools(land_in_step(cache.device_pools, landing), landed=landing)
            jax.block_until_ready(cache.device_pools)
            cache.step()
        for b, p in zip(blocks, prefixes):
            assert p.host_tokens == len(b) * P
            d.verify(b, p.device_pages, p.swa_pages)
        unlock_all(cache, prefixes)
        cache.evict(10 ** 6, 10 ** 6 if cache.swa_allocator else 0)
        cache.drain()
        cache.wait_compiles()
        rounds.append(list(events))
    for events, copies in zip(rounds[:2], ([f"{anchor}:copy[2]", f"{anchor}:copy[2]", f"{anchor}:copy[1]"],
                                           [f"{anchor}:copy_many[2, 2]", f"{anchor}:copy[1]"])):
        planned = events.index("match:True")
        assert events[:planned] == ["ahead"] * len(blocks) + copies, events
        assert not any(e.startswith(early) for e in events[planned:]), events
    assert not any(e.startswith("plan:load_pieces") for e in rounds[0]), rounds[0]      # staging: not yet compiled
    staged = [e for e in rounds[0] if e.startswith(anchor + ":h2d")]
    assert staged and all(e.endswith(", 1]") for e in staged), rounds[0]          # the copies, placed on the device
    fused = [e for e in rounds[1] if not e.startswith(("match", "ahead", *early))]
    assert len(fused) == 1 and fused[0].startswith("plan:load_pieces") and "True" in fused[0], rounds[1]
    assert not any(e.startswith(early) for e in rounds[2]) and "ahead" not in rounds[2], rounds[2]
    assert not any(e == "match:False" for r in rounds for e in r), rounds


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_without_fused_loads_each_copy_goes_into_staging_on_the_device(name):
    """With fused loads off (the default) the merged load moves through the staging buffer:
    each request's early copy goes in by an on-device `h2d` or `h2d_many` (key ending in 1;
    the two 2-page copies in one call), and no anchor block crosses the link a second time
    from the host."""
    blocks = ([2, 3], [4], [5, 6])
    cache, d = make(name, transfer=hc.TransferConfig(early_copy_bytes=0, fuse_after=0))
    offload(d, list(blocks))
    labels = []
    cache.on_program_call(lambda label, program, *args: labels.append(label) or program(*args))
    prefixes = cache.acquire_many([prompt(b) for b in blocks])
    for b, p in zip(blocks, prefixes):
        assert p.host_tokens == len(b) * P
        d.verify(b, p.device_pages, p.swa_pages)
    anchor = cache.layout.anchor.name
    copied = [1 if e.startswith(anchor + ":copy[") else int(e.rstrip("]").split(", ")[1])
              for e in labels if e.startswith((anchor + ":copy[", anchor + ":copy_many["))]
    into_staging = [e for e in labels if e.startswith((anchor + ":h2d[", anchor + ":h2d_many["))]
    assert sum(copied) == len(blocks), labels
    assert 1 <= len(into_staging) < len(blocks) and all(e.endswith(", 1]") for e in into_staging), labels
    unlock_all(cache, prefixes)
    assert_room_back(cache)


def _scenario(name, batch, device=16, **kw):
    """(prefixes of acquire_many, stats), (prefixes of one acquire each, stats), on identical caches."""
    out = []
    for many in (True, False):
        cache, d = make(name, device=device, **kw)
        offload(d, [SYSTEM + [2], SYSTEM + [3], [4, 5], [6, 7]])
        d.request([8], swa_every=True)              # a device hit
        cache.drain()                               # (its backup lands when the link says: not compared)
        toks = [prompt(b) for b in batch]
        prefixes = cache.acquire_many(toks) if many else [cache.acquire(t) for t in toks]
        for blocks, p in zip(batch, prefixes):
            d.verify(blocks, p.device_pages, p.swa_pages)
        view = [(p.length, p.device_tokens, p.host_tokens, p.refused, len(p.swa_pages)) for p in prefixes]
        out.append((view, stats_view(cache)))
        unlock_all(cache, prefixes)
        cache.drain()
        assert_room_back(cache)
    return out


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_same_as_one_acquire_each(name):
    """Shared system prompt, duplicates, a miss, device and host hits mixed."""
    batch = [SYSTEM + [2], SYSTEM + [3], SYSTEM + [2], [9, 9], [8], [4, 5], SYSTEM + [3, 1], [6, 7]]
    (many, many_stats), (single, single_stats) = _scenario(name, batch)
    assert many == single
    assert many_stats == single_stats
    assert many[3][0] == 0                                   # the miss
    assert many[4][1] == P                                   # the device hit


def test_shared_system_prompt_batch_gets_the_hit():
    cache, d = make("tiny_v4")
    offload(d, [SYSTEM + [2]])
    batch = [SYSTEM + [10 + i] for i in range(4)]
    starts = count_starts(cache)
    prefixes = cache.acquire_many([prompt(b) for b in batch])
    assert starts == ["load"]                       # the first loads the system prompt; the rest find it
    assert [p.length for p in prefixes] == [len(SYSTEM) * P] * 4
    assert prefixes[0].host_tokens == len(SYSTEM) * P
    assert [p.device_tokens for p in prefixes[1:]] == [len(SYSTEM) * P] * 3
    for blocks, p in zip(batch, prefixes):
        d.verify(blocks, p.device_pages, p.swa_pages)
    unlock_all(cache, prefixes)
    assert_room_back(cache)


def test_empty_batch_and_no_load_back():
    cache, d = make("tiny_gqa")
    offload(d, [[1, 2]])
    before = stats_view(cache)
    assert cache.acquire_many([]) == [] and cache.acquire_many(()) == []
    assert stats_view(cache) == before
    starts = count_starts(cache)
    prefixes = cache.acquire_many([prompt([1, 2]), prompt([3])], load_back=False)
    assert starts == [] and [(p.length, p.refused) for p in prefixes] == [(0, None), (0, None)]
    unlock_all(cache, prefixes)


def test_refused_below_threshold_keeps_the_device_part():
    cache, d = make("tiny_gqa", load_back_threshold=10 ** 6)
    offload(d, [[1, 2]])
    d.request([3], swa_every=True)
    prefixes = cache.acquire_many([prompt([1, 2]), prompt([3, 4])])
    assert prefixes[0].refused is Refusal.BELOW_THRESHOLD and prefixes[0].length == 0
    assert prefixes[1].refused is None and prefixes[1].length == P and prefixes[1].device_tokens == P
    d.verify([3], prefixes[1].device_pages, prefixes[1].swa_pages)
    unlock_all(cache, prefixes)
    assert_room_back(cache)


def test_device_too_small_for_all():
    """Each host hit takes 2 of 6 device pages: the fourth finds no room; none leaks."""
    batch = [[1, 2], [3, 4], [5, 6], [7, 8]]
    out = []
    for many in (True, False):
        cache, d = make("tiny_gqa", device=6, host=32)
        offload(d, batch)
        toks = [prompt(b) for b in batch]
        prefixes = cache.acquire_many(toks) if many else [cache.acquire(t) for t in toks]
        out.append([(p.length, p.refused) for p in prefixes])
        for blocks, p in zip(batch, prefixes):
            d.verify(blocks, p.device_pages, p.swa_pages)
        unlock_all(cache, prefixes)
        cache.drain()
        assert_room_back(cache)
    assert out[0] == out[1]
    assert out[0][:3] == [(2 * P, None)] * 3 and out[0][3] == (0, Refusal.NO_DEVICE_SPACE)


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
def test_failing_start_fails_every_load_once(name):
    cache, d = make(name)
    offload(d, [[1, 2], [3], SYSTEM + [4]])
    d.request([5], swa_every=True)
    start = cache._engine.start

    def failing(plan, pools, **kw):
        if plan.direction.value == "load":
            raise RuntimeError("injected: the load failed to start")
        return start(plan, pools, **kw)

    cache._engine.start = failing
    batch = [[1, 2], [3], [5, 6], SYSTEM + [4]]
    prefixes = cache.acquire_many([prompt(b) for b in batch])
    assert [p.refused for p in prefixes] == [Refusal.FAILED, Refusal.FAILED, None, Refusal.FAILED]
    assert [p.length for p in prefixes] == [0, 0, P, 0]
    assert cache.stats().failures == {"load/start": 3}
    d.verify([5], prefixes[2].device_pages, prefixes[2].swa_pages)
    unlock_all(cache, prefixes)
    cache._engine.start = start
    assert_room_back(cache)
    again = cache.acquire_many([prompt(b) for b in batch])      # the host copies are intact
    assert [(p.length, p.refused) for p in again] == [(2 * P, None), (P, None), (P, None), (3 * P, None)]
    for blocks, p in zip(batch, again):
        d.verify(blocks[: p.length // P], p.device_pages, p.swa_pages)
    unlock_all(cache, again)


@pytest.mark.parametrize("groups", [1, 2])
def test_deferred_lands_once_for_every_request(groups):
    cache, d = make("tiny_gqa", transfer=hc.TransferConfig(layer_groups=groups, landing_buckets=5))
    batch = [[1, 2], [3, 4], [5]]
    offload(d, batch)
    starts = count_starts(cache)
    prefixes = cache.acquire_many([prompt(b) for b in batch], deferred=True)
    assert starts == ["load"]
    landing = prefixes[0].landing
    assert landing is not None and all(p.landing is landing for p in prefixes)
    assert cache.stats().in_flight["load"] == len(batch)     # each until the step lands the one landing
    cache.set_device_pools(land_in_step(cache.device_pools, landing), landed=landing)
    jax.block_until_ready(cache.device_pools)   # a GPU runs the step after the call returns
    cache.step()                                # the first step after it: every load done
    assert cache.stats().in_flight["load"] == 0
    for blocks, p in zip(batch, prefixes):
        d.verify(blocks, p.device_pages, p.swa_pages)
    assert d.cache._data.counters.landings == {"step": 1}
    unlock_all(cache, prefixes)
    assert_room_back(cache)


def test_deferred_with_a_shared_prompt_defers_only_the_last_start():
    cache, d = make("tiny_gqa", transfer=hc.TransferConfig(landing_buckets=5))
    offload(d, [SYSTEM + [2], [3, 4]])
    batch = [SYSTEM + [2], SYSTEM + [5], [3, 4]]
    prefixes = cache.acquire_many([prompt(b) for b in batch], deferred=True)
    assert prefixes[0].landing is None and prefixes[0].refused is None   # waited for: the second needs it
    assert prefixes[1].device_tokens == len(SYSTEM) * P
    landing = prefixes[2].landing
    assert landing is not None and prefixes[1].landing is None        # a device hit: nothing to land
    cache.set_device_pools(land_in_step(cache.device_pools, landing), landed=landing)
    cache.drain()
    for blocks, p in zip(batch, prefixes):
        d.verify(blocks[: p.length // P], p.device_pages, p.swa_pages)
    unlock_all(cache, prefixes)


@pytest.mark.parametrize("bad,match", [
    (np.arange(5, dtype=np.int32), "list or tuple"),
    ("tokens", "list or tuple"),
    ([prompt([1]), []], "token sequence 1 is empty"),
    ([prompt([1]), [1.5, 2.5]], "token sequence 1"),
    ([prompt([1]), [[1, 2]]], "token sequence 1"),
])
def test_misuse_changes_nothing(bad, match):
    cache, d = make("tiny_v4")
    offload(d, [[1]])
    before, nodes = stats_view(cache), cache._core.tree.num_nodes
    with pytest.raises(ValueError, match=match):
        cache.acquire_many(bad)
    for kw in ({"load_back": 1}, {"deferred": "yes"}):
        with pytest.raises(ValueError, match="must be a bool"):
            cache.acquire_many([prompt([1])], **kw)
    assert stats_view(cache) == before and cache._core.tree.num_nodes == nodes
    assert_room_back(cache)
