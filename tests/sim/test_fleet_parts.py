"""The simulator's parts alone: tier sizes, a link's queue, the shared store's rules, the router."""
import numpy as np
import pytest

from hicache_jax.sim import Router, TierSize, page_bytes, tier_pages
from hicache_jax.sim.links import Link
from hicache_jax.sim.store import SharedStore
from hicache_jax.storage.keys import page_hashes
from sim_helpers import layout


@pytest.mark.parametrize("text, tokens, nbytes", [
    ("2000000", 2_000_000, None), ("2M", 2_000_000, None), ("512k", 512_000, None), ("64GiB", None, 64 << 30),
    ("1.5 TiB", None, 3 << 39), ("80GB", None, 80 * 10 ** 9), ("unlimited", None, None)])
def test_sizes_parse_as_tokens_bytes_or_unlimited(text, tokens, nbytes):
    s = TierSize.parse(text)
    assert (s.tokens, s.bytes, s.unlimited) == (tokens, nbytes, tokens is None and nbytes is None)


@pytest.mark.parametrize("text", ["", "-1", "2X", "1.5", "lots", "1e6"])
def test_bad_sizes_name_themselves(text):
    with pytest.raises(ValueError, match="tier size"):
        TierSize.parse(text)


def test_tier_pages_from_tokens_and_bytes():
    v4 = layout()
    assert tier_pages(v4, TierSize(tokens=1_000_000), 0.25, 0) == {"kv": 3906, "swa": 976}
    assert page_bytes(v4, 0.25) == 998_208 + 0.25 * 8_160_000
    assert tier_pages(v4, TierSize.parse("64GiB"), 0.25, 0) == {"kv": (64 << 30) // 3_038_208, "swa": 5654}
    assert tier_pages(v4, TierSize(), 0.25, 777) == {"kv": 777, "swa": 777}
    gqa = layout("tiny_gqa")                     # no window allocator: anchor pages only
    assert tier_pages(gqa, TierSize(tokens=2560), 0.25, 0) == {gqa.anchor.name: 2560 // gqa.page_size}


def test_a_link_is_a_fifo_queue():
    link = Link("h2d", 1e9)
    assert link.transfer(1.5, 10 ** 9) == 2.5          # idle: starts at once
    assert link.transfer(2.0, 10 ** 9) == 3.5          # busy until 2.5
    assert link.transfer(5.0, 0) == 5.0                # nothing to move
    assert link.transfer(5.0, 5 * 10 ** 8) == 5.5
    assert (link.bytes_moved, link.busy_s) == (25 * 10 ** 8, 2.5)


def hashes(n, seed=0):
    return page_hashes(np.random.default_rng(seed).integers(1, 1000, n * 256).astype(np.int32), 256)


def test_the_store_serves_a_prefix_only_with_the_window_at_its_stop():
    store = SharedStore(layout(), {"kv": 100, "swa": 100})
    h = hashes(6)
    store.put("kv", store.missing("kv", h), visible_at=1.0)
    store.put("swa", store.missing("swa", [h[3]]), visible_at=1.0)    # the window of stop 4 only
    assert store.usable_prefix(h, now=0.5) == 0                      # not landed yet
    assert store.usable_prefix(h, now=1.0) == 4                      # 6 pages, but the window is at 4
    assert store.usable_prefix(h[:3], now=2.0) == 0                  # no window at 1, 2 or 3
    assert store.usable_prefix(hashes(6, seed=1), now=2.0) == 0      # another prompt
    assert store.missing("kv", h[:2] + hashes(1, seed=2)) == hashes(1, seed=2)
    assert store.stats()["skipped_pages"] == {"kv": 2}
    assert store.get("kv", h[2:], now=2.0) == 4 and store.stats()["read_pages"] == {"kv": 4}
    assert store.objects_per_page == {"kv": 3, "swa": 3}             # V4-Flash: 3 pools each


def test_the_store_evicts_the_least_recently_used_page_when_full():
    store = SharedStore(layout(), {"kv": 3, "swa": 0})
    h = hashes(4)
    store.put("kv", h[:3], 0.0)
    assert store.get("kv", h[:1], now=1.0) == 1          # page 0 is used again
    store.put("kv", h[3:], 0.0)                          # page 1 goes
    assert store.pages("kv") == 3 and store.stats()["evicted_pages"] == {"kv": 1}
    assert store.missing("kv", h) == [h[1]]
    store.put("swa", h, 0.0)                             # no room at all: nothing kept
    assert store.pages("swa") == 0


def test_the_store_names_the_allocators_it_needs():
    with pytest.raises(ValueError, match="must name the allocators"):
        SharedStore(layout(), {"kv": 10})


def test_affinity_picks_the_longest_prefix_within_the_load_bound():
    r = Router("affinity", 4, load_bound=2)
    cover, load = [0, 5, 9, 3], [0, 1, 3, 2]
    assert r.pick(cover.__getitem__, load.__getitem__) == 1      # 2 holds more, but is 3 above the least loaded
    load[2] = 2
    assert r.pick(cover.__getitem__, load.__getitem__) == 2
    # nothing cached anywhere: the least loaded, then the one given the fewest requests
    assert [r.pick(lambda k: 0, lambda k: 0) for _ in range(3)] == [0, 3, 0]
    assert r.routed == [2, 1, 1, 1] and r.affine == 2


def test_round_robin_and_random_ignore_the_instances():
    rr = Router("round_robin", 3)
    assert [rr.pick(None, None) for _ in range(5)] == [0, 1, 2, 0, 1]
    a, b = Router("random", 3, seed=7), Router("random", 3, seed=7)
    picks = [a.pick(None, None) for _ in range(50)]
    assert picks == [b.pick(None, None) for _ in range(50)] and set(picks) == {0, 1, 2}
    with pytest.raises(ValueError, match="route must be one of"):
        Router("nearest", 3)
