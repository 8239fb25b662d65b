"""A 512-token window over 256-token pages (Gemma 3): a stop point needs both window pages.

A prefix of b pages is usable only if pages b-2 and b-1 carry sliding-window K/V (on
device, or on the host for a load-back), or the sequence starts inside the window. With
one of the two missing the stop point is refused: the match stops at an earlier boundary
whose window is complete, and a load-back never brings half a window.
"""
import numpy as np

from hicache_jax.tree import LoadJob
from helpers import P, core, query, seq

SWA = "gemma3_swa_kv"


def gemma(**kw):
    c = core("tiny_gemma3", **kw)
    assert [(w.name, w.window_pages) for w in c.components.windows] == [(SWA, 2)]
    return c


def put(c, tokens, swa_on):
    """Insert whole pages of `tokens`, keeping SWA pages for the logical pages in `swa_on`."""
    n = len(tokens) // P
    got = c.alloc_device({"kv": n, SWA: len(swa_on)})
    swa = dict(zip(sorted(swa_on), got[SWA].tolist()))
    res = c.insert(tokens, got["kv"], {SWA: swa})
    c.check_invariants()
    return res, swa


def to_host(c, pages):
    """Land the queued backups, then evict `pages` device pages (LRU leaves first)."""
    c.ack_backup(c.take_backup_batch().ack_id)
    c.evict_device({"kv": pages})
    c.check_invariants()


def test_device_stop_point_needs_both_window_pages():
    c = gemma()
    _, swa = put(c, seq(1, 2, 3, 4), {2, 3})
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert m.device_len == 4 * P
    assert m.swa_pages.tolist() == [swa[2], swa[3]]          # oldest first: logical pages 2, 3


def test_device_stop_point_with_one_window_page_is_refused():
    c = gemma()
    _, swa = put(c, seq(1, 2, 3, 4), {0, 1, 3})               # page 2 lacks its window K/V
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len) == (2 * P, 0)          # 4 needs {2, 3}, 3 needs {1, 2}: 2 it is
    assert m.swa_pages.tolist() == [swa[0], swa[1]]
    c2 = gemma()
    put(c2, seq(1, 2, 3, 4), {3})                             # one window page anywhere: nothing usable
    assert c2.match_prefix(query(seq(1, 2, 3, 4))).device_len == 0


def test_window_truncated_at_the_sequence_start():
    c = gemma()
    _, swa = put(c, seq(1, 2, 3), {0})
    m = c.match_prefix(query(seq(1, 2, 3)))
    assert m.device_len == P and m.swa_pages.tolist() == [swa[0]]   # page 0's window starts at the root


def test_host_stop_point_loads_both_window_pages():
    c = gemma()
    put(c, seq(1, 2, 3, 4), {2, 3})
    to_host(c, 4)
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len) == (0, 4 * P)
    job = c.start_load(m)
    assert isinstance(job, LoadJob) and job.loaded_tokens == 4 * P
    assert job.plan.num_pages("kv") == 4 and job.plan.num_pages(SWA) == 2
    assert job.window_pages[SWA].size == 2 and len(set(job.window_pages[SWA].tolist())) == 2
    c.check_invariants()
    c.finish_load(job.load_id)
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert m.device_len == 4 * P and m.swa_pages.tolist() == job.window_pages[SWA].tolist()
    c.check_invariants()


def test_host_stop_point_with_one_window_page_is_refused_not_half_restored():
    c = gemma()
    put(c, seq(1, 2, 3, 4), {0, 1, 3})                       # the host copy of page 2's window is absent
    to_host(c, 4)
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len) == (0, 2 * P)          # the shorter stop point with a whole window
    job = c.start_load(m)
    assert job.loaded_tokens == 2 * P
    assert job.plan.num_pages("kv") == 2 and job.plan.num_pages(SWA) == 2   # pages 0 and 1, not page 3
    c.finish_load(job.load_id)
    assert c.match_prefix(query(seq(1, 2, 3, 4))).device_len == 2 * P
    c.check_invariants()


def test_window_split_across_tiers_loads_only_the_missing_page():
    c = gemma()
    _, swa_a = put(c, seq(1, 2, 3), {1, 2})                  # node A: pages 0-2, window K/V on 1, 2
    put(c, seq(1, 2, 3, 4), {3})                             # node B: page 3, window K/V on 3
    to_host(c, 1)                                            # B (the device leaf) leaves the device
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len) == (3 * P, P)          # window of 4 = page 2 (device) + page 3 (host)
    job = c.start_load(m)
    assert job.plan.num_pages("kv") == 1 and job.plan.num_pages(SWA) == 1
    assert job.window_pages[SWA].tolist()[0] == swa_a[2]             # the device half is reused, not copied
    c.finish_load(job.load_id)
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert m.device_len == 4 * P and m.swa_pages.tolist() == job.window_pages[SWA].tolist()
    c.check_invariants()


def test_a_tombstoned_window_page_without_host_copy_shortens_the_match():
    c = gemma(write_policy="write_back")                     # nothing on the host
    put(c, seq(1, 2, 3), {0, 1, 2})
    put(c, seq(1, 2, 3, 4), {3})
    c.match_prefix(query(seq(1, 2, 3, 4, 5)))                # both nodes recently used ...
    c.match_prefix(query(seq(1, 2, 3)))                      # ... node A (pages 0-2) most recently
    res = c.evict_device({"kv": 0, SWA: 1})                   # SWA pressure tombstones node B's page 3
    assert res.swa_pages == 1
    c.check_invariants()
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len) == (3 * P, 0)          # 4 would need page 3's window K/V
    assert np.all(m.swa_pages >= 0) and m.swa_pages.size == 2
