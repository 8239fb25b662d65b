"""Page allocators, the anchor's slot view, pools without allocators, atomic resolve."""
import numpy as np
import pytest

from hicache_jax.alloc import PageAllocator, TierAllocators
from helpers import layout


def test_alloc_free_roundtrip_and_exhaustion():
    a = PageAllocator("kv", "device", 8)
    x = a.alloc(5)
    assert sorted(x.tolist()) == [0, 1, 2, 3, 4] and a.num_free == 3
    assert a.alloc(4) is None and a.num_free == 3     # nothing taken on failure
    a.free(x[:2])
    assert a.num_free == 5
    with pytest.raises(ValueError, match="double free"):
        a.free([x[0]])
    with pytest.raises(ValueError, match="out of range"):
        a.free([8])
    with pytest.raises(ValueError, match="cannot allocate -1"):
        a.alloc(-1)


def test_host_allocator_prefers_one_contiguous_run():
    a = PageAllocator("kv", "host", 32)
    a.alloc(32)
    a.free([0, 1, 2])                 # run of 3
    a.free(range(10, 16))             # run of 6
    a.free([20, 21])                  # run of 2
    got = a.alloc(5)                  # best fit: one block from the run of 6, not 3 + 2
    assert got.tolist() == [10, 11, 12, 13, 14]
    got = a.alloc(4)                  # no run of 4 left: largest runs first (0..2, then 20..21)
    assert sorted(got.tolist()) == [0, 1, 2, 20]
    assert a.free_pages().tolist() == [15, 21]


def test_free_merges_neighbours():
    a = PageAllocator("kv", "host", 10)
    a.alloc(10)
    a.free([3])
    a.free([5])
    a.free([4])
    assert a.num_runs() == 1 and a.alloc(3).tolist() == [3, 4, 5]


def test_pools_without_allocator_have_none():
    tier = TierAllocators(layout("tiny_v4"), "host", {"kv": 4, "swa": 4})
    for pool in ("deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state", "deepseek_v4_c4"):
        with pytest.raises(KeyError, match="no host allocator"):
            tier[pool]
    with pytest.raises(ValueError, match="has no host allocator"):
        tier.resolve({"deepseek_v4_c4_state": 1})
    assert [a.name for a in tier] == ["kv", "swa"]


def test_resolve_is_all_or_nothing_with_one_reclaim():
    tier = TierAllocators(layout("tiny_v4"), "host", {"kv": 8, "swa": 3})
    taken = tier["swa"].alloc(1)
    calls = []
    assert tier.resolve({"kv": 3, "swa": 3}, reclaim=lambda short: calls.append(short)) is None
    assert calls == [{"kv": 0, "swa": 1}]                      # one reclaim, told what is missing
    assert (tier["kv"].num_free, tier["swa"].num_free) == (8, 2)  # the anchor pages were rolled back
    assert tier.resolve({"kv": 1, "swa": 4}, reclaim=lambda short: calls.append(short)) is None
    assert len(calls) == 1                                     # beyond capacity: no reclaim can help
    tier["swa"].free(taken)
    tier["swa"].alloc(1)
    got = tier.resolve({"kv": 3, "swa": 2})
    assert got.get("kv").size == 3 and got.get("swa").size == 2
    freed = []
    def reclaim(short):          # frees what is asked, so the retry succeeds
        tier["swa"].free(got.get("swa")[: short["swa"]])
        freed.append(short)
    again = tier.resolve({"kv": 1, "swa": 1}, reclaim=reclaim)
    assert again is not None and freed == [{"kv": 0, "swa": 1}]
    assert tier.order == ("kv", "swa")


def test_resolve_rejects_unknown_and_negative():
    tier = TierAllocators(layout("tiny_v4"), "device", {"kv": 4, "swa": 4})
    with pytest.raises(ValueError, match="deepseek_v4_c4"):
        tier.resolve({"deepseek_v4_c4": 1})
    with pytest.raises(ValueError, match="-1"):
        tier.resolve({"kv": -1})
    for bad in (True, 1.0, "1", np.int64(-2)):      # named, and nothing taken
        with pytest.raises(ValueError, match="device pages of 'kv'"):
            tier.resolve({"kv": bad, "swa": 1})
    assert tier["kv"].available() == 4 and tier["swa"].available() == 4
    got = tier.resolve({"kv": np.int64(2), "swa": np.int32(1)})   # numpy counts are counts
    assert got.get("kv").size == 2 and got.get("swa").size == 1
    with pytest.raises(ValueError, match="missing"):
        TierAllocators(layout("tiny_v4"), "device", {"kv": 4})
