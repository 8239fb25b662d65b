"""Matching (alignment, the input_len - 1 cap, the SWA window), insert with split, locks."""
import numpy as np
import pytest

from hicache_jax.tree import Residency, TreeStateError
from hicache_jax.tree.match import best_boundary
from hicache_jax.tree.node import ABSENT
from helpers import P, core, dev, device_allocs, evict_device, put, query, seq, swa_dev


def test_match_is_page_aligned_and_keeps_one_token():
    c = core("tiny_gqa")
    put(c, seq(1, 2, 3))
    assert c.match_prefix(seq(1, 2, 3)).device_len == 2 * P          # input_len - 1 cap
    assert c.match_prefix(query(seq(1, 2, 3))).device_len == 3 * P
    assert c.match_prefix(seq(1, 2, 3)[: 2 * P + 100]).device_len == 2 * P  # partial page never matches
    assert c.match_prefix(seq(1, 2, 4, 5)).device_len == 2 * P
    assert c.match_prefix(seq(9)).device_len == 0
    assert c.match_prefix(np.zeros(0, np.int32)).device_len == 0


def test_match_returns_the_device_pages_in_order():
    c = core("tiny_gqa")
    _, got = put(c, seq(1, 2, 3))
    m = c.match_prefix(query(seq(1, 2)))
    assert m.device_pages.tolist() == got["kv"][:2].tolist()
    assert m.host_len == 0 and m.swa_pages.size == 0


def test_insert_splits_nodes_and_frees_duplicates():
    c = core("tiny_gqa")
    r1, got1 = put(c, seq(1, 2, 3))
    assert (r1.cached_len, r1.new_len) == (3 * P, 3 * P)
    free_before = device_allocs(c)["kv"].num_free
    r2, got2 = put(c, seq(1, 2, 4))           # recomputed the shared 2 pages on its own pages
    assert (r2.cached_len, r2.new_len) == (3 * P, P)
    assert device_allocs(c)["kv"].num_free == free_before - 1     # 2 duplicates freed, 1 page kept
    assert c.tree.num_nodes == 3                          # [1 2] -> {[3], [4]}
    assert c.match_prefix(query(seq(1, 2, 4))).device_pages.tolist() == got1["kv"][:2].tolist() + [got2["kv"][2]]


def test_insert_reusing_matched_pages_keeps_them():
    c = core("tiny_gqa")
    put(c, seq(1, 2))
    m = c.match_prefix(query(seq(1, 2)))
    extra = c.alloc_device({"kv": 1})["kv"]
    r = c.insert(seq(1, 2, 5), np.concatenate([m.device_pages, extra]))
    c.check_invariants()
    assert (r.cached_len, r.new_len) == (3 * P, P) and c.held_pages("kv") == 0


def test_insert_bad_input_changes_nothing():
    c = core("tiny_v4")
    put(c, seq(1, 2))
    free = (device_allocs(c)["kv"].num_free, device_allocs(c)["swa"].num_free)
    nodes = c.tree.num_nodes
    with pytest.raises(ValueError, match="whole pages"):
        c.insert(seq(1)[:100], [0])
    with pytest.raises(ValueError, match="neither held"):
        c.insert(seq(3), [7])                       # page 7 belongs to nobody
    with pytest.raises(ValueError, match="1 pages given 2 device pages"):
        c.insert(seq(3), [0, 1])
    with pytest.raises(ValueError, match="logical pages \\[3\\]"):
        c.insert(seq(3), c.alloc_device({"kv": 1})["kv"], {"swa": {3: 0}})
    with pytest.raises(ValueError, match="1-D sequence of integers"):
        c.insert(np.ones((2, 256), np.int32), [0, 1])
    with pytest.raises(ValueError, match="tokens must be"):
        c.match_prefix(["a", "b"])
    assert c.tree.num_nodes == nodes and device_allocs(c)["swa"].num_free == free[1]
    c.check_invariants()


def test_swa_window_gap_is_not_matched_past():
    c = core("tiny_v4")
    put(c, seq(1, 2, 3, 4), swa_last=1)            # SWA data only on page 3
    assert c.match_prefix(query(seq(1, 2, 3, 4))).device_len == 4 * P
    # boundaries at 1, 2, 3 pages lack SWA right before them: nothing matches there
    assert c.match_prefix(query(seq(1, 2, 3))).device_len == 0
    assert c.match_prefix(query(seq(1, 2, 3, 4, 5))).device_len == 4 * P
    put(c, seq(1, 2, 9), swa_last=1)               # gives page 2 of the "9" branch SWA
    m = c.match_prefix(query(seq(1, 2, 9)))
    assert m.device_len == 3 * P and m.swa_pages.size == 1


def test_best_boundary_window_rule():
    swa = np.array([True, True, False, True, True, False])
    desc = lambda b: reversed(swa[:b].tolist())
    valid = [b for b in range(7) if best_boundary(desc(b), b, 2) == b]
    assert valid == [0, 1, 2, 5]
    assert best_boundary(desc(6), 6, 1) == 5 and best_boundary(desc(4), 4, 3) == 2
    assert best_boundary(iter([True] * 3), 3, 8) == 3      # shorter than a window, no gap: valid


def test_locks_pin_the_path_and_survive_splits():
    c = core("tiny_gqa", dev=4, write_policy="write_through_selective")
    r, _ = put(c, seq(1, 2, 3))
    lock = c.lock(r.node)
    assert evict_device(c, 3).device_pages == 0         # locked: nothing evictable
    c.match_prefix(query(seq(1)))                      # splits the locked node
    c.check_invariants()
    assert evict_device(c, 3).device_pages == 0
    c.unlock(lock)
    c.check_invariants()
    assert evict_device(c, 3).device_pages == 3           # both halves, leaf first
    assert c.tree.num_nodes == 0 and c.stats.dropped[("kv", "write_through_unbacked_eviction")] == 3 * P
    with pytest.raises(ValueError, match="not a held lock"):
        c.unlock(lock)


def test_illegal_transition_raises_naming_state_and_event():
    c = core("tiny_gqa", write_policy="write_back")
    r, _ = put(c, seq(1))
    node = c.node(r.node)
    from hicache_jax.tree.state import Event
    with pytest.raises(TreeStateError, match="'load_done' in state 'device'"):
        node.apply(Event.LOAD_DONE)


def test_check_invariants_catches_corruption():
    c = core("tiny_v4")
    r, got = put(c, seq(1, 2))
    node = c.node(r.node)
    dev(node)[0] = dev(node)[1]                   # one page owned twice
    with pytest.raises(TreeStateError, match="owned twice|capacity"):
        c.check_invariants()
    dev(node)[0] = got["kv"][0]
    c.check_invariants()
    node.lock_ref += 1
    with pytest.raises(TreeStateError, match="lock count"):
        c.check_invariants()
    node.lock_ref -= 1
    swa_dev(node)[0] = swa_dev(node)[1]
    with pytest.raises(TreeStateError):
        c.check_invariants()
    swa_dev(node)[0] = ABSENT
    node.state = Residency.HOST
    with pytest.raises(TreeStateError, match="device pages present in state host"):
        c.check_invariants()


def test_long_nodes_match_exactly_where_they_differ():
    """A node longer than the short-compare limit (70 pages, 17,920 tokens): a prompt that
    differs in its last pages, or only in one token deep inside, matches up to that page."""
    c = core("tiny_gqa", dev=160, host=16)
    blocks = list(range(1, 71))
    _, got = put(c, seq(*blocks))
    assert c.tree.num_nodes == 1 and len(c.tree.root.children) == 1
    assert c.match_prefix(query(seq(*blocks))).device_len == 70 * P
    assert c.match_prefix(query(seq(*blocks[:66], 99, 98))).device_len == 66 * P
    late = query(seq(*blocks)).copy()
    late[69 * P + 5] += 1                      # one token of the last page
    assert c.match_prefix(late).device_len == 69 * P
    deep = query(seq(*blocks)).copy()
    deep[3 * P + 1] += 1
    m = c.match_prefix(deep)
    assert m.device_len == 3 * P and m.device_pages.tolist() == got["kv"][:3].tolist()
