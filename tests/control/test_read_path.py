"""Read path: load-backs, owners and back-off, thresholds, SWA window loads, failures."""
import pytest

from hicache_jax.tree import LoadJob, Refusal, Residency, TreeStateError
from helpers import P, core, dev, device_allocs, evict_device, evict_host, put, query, seq, swa_of


def backed_up_then_evicted(c, tokens, swa_last=1):
    r, _ = put(c, tokens, swa_last=swa_last)
    c.ack_backup(c.take_backup_batch().ack_id)
    evict_device(c, len(tokens) // P)
    c.check_invariants()
    return r


def test_load_back_roundtrip_and_second_claimant_backs_off():
    c = core("tiny_v4")
    r = backed_up_then_evicted(c, seq(1, 2, 3))
    m = c.match_prefix(query(seq(1, 2, 3)))
    assert (m.device_len, m.host_len) == (0, 3 * P)
    job = c.start_load(m)
    assert isinstance(job, LoadJob) and job.loaded_tokens == 3 * P
    assert job.plan.num_pages("kv") == 3 and job.plan.num_pages("swa") == 1
    assert job.device_pages.tolist() == dev(c.node(r.node)).tolist() and job.window_pages["swa"].size == 1
    c.check_invariants()
    assert c.node(r.node).state is Residency.LOADING
    m2 = c.match_prefix(query(seq(1, 2, 3)))      # in flight: not valid on device yet
    assert (m2.device_len, m2.host_len) == (0, 3 * P)
    assert c.start_load(m2) is Refusal.OWNED       # a second request recomputes instead
    assert c.stats.refusals[Refusal.OWNED] == 1
    c.finish_load(job.load_id)
    c.check_invariants()
    m3 = c.match_prefix(query(seq(1, 2, 3)))
    assert (m3.device_len, m3.host_len) == (3 * P, 0)
    assert m3.device_pages.tolist() == job.device_pages.tolist()


def test_threshold_and_empty_plans():
    c = core("tiny_gqa", load_back_threshold=2 * P)
    backed_up_then_evicted(c, seq(1))
    m = c.match_prefix(query(seq(1)))
    assert c.start_load(m) is Refusal.BELOW_THRESHOLD
    c = core("tiny_gqa", load_back_threshold=0)    # applied as max(1, 0)
    backed_up_then_evicted(c, seq(1))
    m = c.match_prefix(query(seq(1)))
    assert isinstance(c.start_load(m), LoadJob)
    put(c, seq(2))
    assert c.start_load(c.match_prefix(query(seq(2)))) is Refusal.EMPTY   # nothing on host to move
    assert c.start_load(c.match_prefix(query(seq(9)))) is Refusal.EMPTY


def test_only_the_trailing_window_swa_is_loaded():
    c = core("tiny_v4")
    backed_up_then_evicted(c, seq(1, 2, 3, 4), swa_last=4)   # SWA on every page, on both tiers
    job = c.start_load(c.match_prefix(query(seq(1, 2, 3, 4))))
    assert job.plan.num_pages("kv") == 4 and job.plan.num_pages("swa") == 1
    c.finish_load(job.load_id)
    # a shorter prefix's window (page 1) is on the host only: an SWA-only component load
    m = c.match_prefix(query(seq(1, 2)))
    assert (m.device_len, m.host_len) == (0, 2 * P)
    job = c.start_load(m)
    assert job.loaded_tokens == 0 and job.plan.num_pages("kv") == 0 and job.plan.num_pages("swa") == 1
    c.check_invariants()
    c.finish_load(job.load_id)
    assert c.match_prefix(query(seq(1, 2))).device_len == 2 * P
    c.check_invariants()


def test_failed_load_leaves_host_copy_usable():
    c = core("tiny_v4")
    r = backed_up_then_evicted(c, seq(1, 2))
    free = (device_allocs(c)["kv"].num_free, device_allocs(c)["swa"].num_free)
    job = c.start_load(c.match_prefix(query(seq(1, 2))))
    c.fail_load(job.load_id)
    c.check_invariants()
    assert c.node(r.node).state is Residency.HOST
    assert (device_allocs(c)["kv"].num_free, device_allocs(c)["swa"].num_free) == free
    m = c.match_prefix(query(seq(1, 2)))
    assert m.device_len == 0 and m.host_len == 2 * P
    assert isinstance(c.start_load(m), LoadJob)


def test_no_device_space_changes_nothing():
    c = core("tiny_gqa", dev=3, write_policy="write_back")
    backed_up = put(c, seq(1, 2))[0]
    evict_device(c, 2)
    c.ack_backup(c.take_backup_batch().ack_id)
    m = c.match_prefix(query(seq(1, 2)))
    held = c.alloc_device({"kv": 2})               # a running request holds 2 of 3 pages
    assert c.start_load(m) is Refusal.NO_DEVICE_SPACE
    c.check_invariants()
    assert c.node(backed_up.node).state is Residency.HOST and c.node(backed_up.node).lock_ref == 0
    c.free_device("kv", held["kv"])
    assert isinstance(c.start_load(m), LoadJob)


def test_stale_and_pending_matches_are_refused():
    c = core("tiny_gqa", write_policy="write_back")
    put(c, seq(1, 2))
    evict_device(c, 2)
    c.ack_backup(c.take_backup_batch().ack_id)
    m = c.match_prefix(query(seq(1, 2)))
    evict_host(c, 2)                                # gone before the load starts
    assert c.start_load(m) is Refusal.STALE
    put(c, seq(3))
    m = c.match_prefix(query(seq(3)))              # on device at match time ...
    evict_device(c, 1)                              # ... then demoted, its write in flight
    assert c.start_load(m) is Refusal.PENDING
    c.check_invariants()


@pytest.mark.parametrize("name", ["tiny_gqa", "tiny_v4"])
def test_a_match_reports_host_copies_still_being_written(name):
    c = core(name, write_policy="write_back")
    put(c, seq(1, 2), swa_last=2)
    put(c, seq(1, 2, 3, 4), swa_last=2)
    evict_device(c, 4, 4 if swa_of(c) else 0)            # both demoted, their writes in flight
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len, m.pending_len) == (0, 0, 4 * P)
    c.ack_backup(c.take_backup_batch().ack_id)      # landed: the same prompt now matches on host
    m = c.match_prefix(query(seq(1, 2, 3, 4)))
    assert (m.device_len, m.host_len, m.pending_len) == (0, 4 * P, 0)
    assert c.match_prefix(query(seq(9))).pending_len == 0
    c.check_invariants()


def test_two_loads_never_own_one_node():
    c = core("tiny_gqa")
    backed_up_then_evicted(c, seq(1, 2))
    job = c.start_load(c.match_prefix(query(seq(1, 2))))
    node = c.node(job.node)
    with pytest.raises(TreeStateError, match="claimed by load"):
        c.book.own(node, job.load_id + 1)


def _ahead(c, tokens):
    pages = c.anchor_pages_ahead(query(tokens))
    return None if pages is None else pages.tolist()


def _planned(c, tokens):
    pages = c.anchor_host_pages(c.match_prefix(query(tokens), touch=False))
    return None if pages is None else pages.tolist()


@pytest.mark.parametrize("name", ["tiny_v4", "tiny_gqa"])
def test_the_look_ahead_names_the_host_pages_a_load_would_move_and_changes_nothing(name):
    """`anchor_pages_ahead` (acquire_many's early copies) names the anchor's host pages that
    the load planned next moves, without a split or an LRU touch; nothing while the prefix
    is on the device or being loaded."""
    c = core(name, dev=16, host=16)
    assert _ahead(c, seq(1, 2)) is None                               # nothing cached
    backed_up_then_evicted(c, seq(1, 2, 3), swa_last=3)
    nodes, stamps = c.tree.num_nodes, {n.id: n.last_access for n in c.tree.nodes()}
    assert _ahead(c, seq(1, 2)) == _ahead(c, seq(1, 2, 3))[:2]        # inside one node: its head
    assert c.tree.num_nodes == nodes and {n.id: n.last_access for n in c.tree.nodes()} == stamps
    assert _ahead(c, seq(1, 2, 3)) == _planned(c, seq(1, 2, 3))
    job = c.start_load(c.match_prefix(query(seq(1, 2, 3))))
    assert isinstance(job, LoadJob)
    assert _ahead(c, seq(1, 2, 3)) is None                            # being loaded: nothing to copy
    c.finish_load(job.load_id)
    assert _ahead(c, seq(1, 2, 3)) is None and _planned(c, seq(1, 2, 3)) is None   # on the device now
    # a device head and a host tail: the tail's pages only
    put(c, seq(1, 2, 3, 4, 5), swa_last=3)
    c.ack_backup(c.take_backup_batch().ack_id)
    c.match_prefix(query(seq(1, 2, 3)))                               # the head used last: the tail goes first
    evict_device(c, 2, swa=3)
    assert len(_ahead(c, seq(1, 2, 3, 4, 5))) == 2 and _ahead(c, seq(1, 2, 3, 4, 5)) == _planned(c, seq(1, 2, 3, 4, 5))
    c.check_invariants()
