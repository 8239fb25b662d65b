"""Components come from the layout; a second independent window allocator is a component
like the first: matching needs both windows, loads bring both back, eviction frees both."""
import pytest

from hicache_jax.tree import Components, LoadJob, Tier, TreeCore
from helpers import P, layout, query, seq
from test_stateful import two_window_layout


def test_components_follow_the_layout():
    v4 = Components.from_layout(layout("tiny_v4"))
    assert [(c.name, c.index, c.is_window) for c in v4] == [("kv", 0, False), ("swa", 1, True)]
    assert v4["swa"].window_pages == 1 and v4.windows == (v4["swa"],)
    assert Components.from_layout(layout("tiny_gqa")).names == ("kv",)
    assert Components.from_layout(two_window_layout()).names == ("kv", "draft_swa", "swa")
    with pytest.raises(ValueError, match="no allocator 'c4'"):
        v4["c4"]


def two_windows(**kw):
    return TreeCore(two_window_layout(), device_pages={"kv": 8, "swa": 8, "draft_swa": 8},
                    host_pages={"kv": 8, "swa": 8, "draft_swa": 8}, **kw)


def put(c, tokens, windows_on_last):
    n = len(tokens) // P
    got = c.alloc_device({"kv": n, **dict.fromkeys(windows_on_last, 1)})
    c.insert(tokens, got["kv"], {w: {n - 1: int(got[w][0])} for w in windows_on_last})
    c.check_invariants()


def test_a_boundary_needs_every_window():
    c = two_windows()
    put(c, seq(1, 2, 3), ["swa", "draft_swa"])
    assert c.match_prefix(query(seq(1, 2, 3))).device_len == 3 * P
    put(c, seq(1, 2, 4), ["swa"])                  # no draft window at page 3 of this branch
    m = c.match_prefix(query(seq(1, 2, 4)))
    assert m.device_len == 0                        # no page boundary has both windows
    assert set(m.window_pages) == {"swa", "draft_swa"}


def test_both_windows_are_backed_up_loaded_and_evicted_together():
    c = two_windows(write_policy="write_back")
    put(c, seq(1, 2), ["swa", "draft_swa"])
    res = c.evict_device({"kv": 2})
    assert (res.device_pages, res.swa_pages) == (2, 2)   # both windows' pages went with the leaf
    batch = c.take_backup_batch()
    assert {b.allocator: b.num_pages for b in batch.plan.batches} == {"kv": 2, "swa": 1, "draft_swa": 1}
    c.ack_backup(batch.ack_id)
    m = c.match_prefix(query(seq(1, 2)))
    assert (m.device_len, m.host_len) == (0, 2 * P)
    job = c.start_load(m)
    assert isinstance(job, LoadJob)
    assert {b.allocator: b.num_pages for b in job.plan.batches} == {"kv": 2, "swa": 1, "draft_swa": 1}
    assert set(job.window_pages) == {"swa", "draft_swa"} and all(len(v) == 1 for v in job.window_pages.values())
    c.finish_load(job.load_id)
    c.unlock(job.lock)
    assert c.evict_host({"kv": 8, "swa": 8, "draft_swa": 8}) == 0     # SYNCED: host copies stay
    c.evict_device({"kv": 8})
    assert c.evict_host({"kv": 8}) == 2
    for tier in Tier:
        for alloc in c.ledger.allocators(tier):
            assert alloc.num_free == alloc.capacity
    c.check_invariants()


def test_window_tombstones_are_per_component():
    c = two_windows(write_policy="write_through_selective")   # not backing up: tombstones allowed
    put(c, seq(1, 2), ["swa", "draft_swa"])
    res = c.evict_device({"kv": 0, "draft_swa": 1})
    assert (res.device_pages, res.swa_pages) == (0, 1)
    assert c.stats.tombstoned == {"draft_swa": 1}
    m = c.match_prefix(query(seq(1, 2)))
    assert m.device_len == 0                        # the draft window is gone at the only boundary
    c.check_invariants()
