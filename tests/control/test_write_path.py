"""Write path: hit-driven backups per policy, merging, acks (also after splits), failures, drops."""
import pytest

from hicache_jax.tree import Residency
from helpers import P, core, dev, device_allocs, evict_device, evict_host, host, host_allocs, put, query, seq


def state(c, r):
    return c.node(r.node).state


def test_write_through_backs_up_on_first_insert_and_merges_one_batch():
    c = core("tiny_v4")
    r1, _ = put(c, seq(1, 2))
    r2, _ = put(c, seq(3))
    assert state(c, r1) is Residency.BACKING_UP and state(c, r2) is Residency.BACKING_UP
    assert c.node(r1.node).lock_ref == 1                      # device lock from commit to ack
    batch = c.take_backup_batch()
    assert batch.tokens == 3 * P and batch.plan.num_pages("kv") == 3 and batch.plan.num_pages("swa") == 2
    # contiguous host pages, one run per node: each node's pages become host blocks of their own
    assert [r.length for r in batch.plan.batch("kv").host_runs] == [2, 1]
    assert c.take_backup_batch() is None
    c.ack_backup(batch.ack_id)
    c.check_invariants()
    assert state(c, r1) is Residency.SYNCED and c.node(r1.node).lock_ref == 0


def test_a_turn_and_its_extension_backed_up_together_stay_one_host_run():
    """Nodes backed up in one batch keep host runs of their own, unless one is the other's
    parent: a conversation's turns (a node and the node that extends it) stay one run."""
    c = core("tiny_gqa")
    put(c, seq(1, 2))                                         # a turn ...
    put(c, seq(1, 2, 3))                                      # ... and the next, in the same batch
    put(c, seq(4))                                            # another prompt
    batch = c.take_backup_batch()
    assert [r.length for r in batch.plan.batch("kv").host_runs] == [3, 1]
    c.ack_backup(batch.ack_id)
    c.check_invariants()


def test_selective_backs_up_on_second_hit_write_back_never():
    c = core("tiny_gqa", write_policy="write_through_selective")
    r, _ = put(c, seq(1))
    assert state(c, r) is Residency.DEVICE and c.take_backup_batch() is None
    put(c, seq(1))
    assert state(c, r) is Residency.BACKING_UP
    wb = core("tiny_gqa", write_policy="write_back")
    r, _ = put(wb, seq(1))
    put(wb, seq(1))
    put(wb, seq(1))
    assert state(wb, r) is Residency.DEVICE and wb.take_backup_batch() is None


def test_write_through_backs_up_unbacked_ancestors_first():
    c = core("tiny_gqa", write_policy="write_through_selective")
    other, _ = put(c, seq(5))
    b, _ = put(c, seq(6, 7))
    mid = c.match_prefix(query(seq(6)))           # split [6 7] -> [6] [7], both unbacked
    head, deep = c.node(mid.device_node), c.node(b.node)
    assert c.backup(deep.id)
    assert (head.state, deep.state) == (Residency.BACKING_UP, Residency.BACKING_UP)
    assert host(head)[0] < host(deep)[0]            # root side committed first
    assert c.node(other.node).state is Residency.DEVICE
    c.check_invariants()


def test_pending_ack_cleared_only_by_its_ack_also_after_split():
    c = core("tiny_gqa")
    r1, _ = put(c, seq(1, 2, 3))
    b1 = c.take_backup_batch()
    r2, _ = put(c, seq(4))
    b2 = c.take_backup_batch()
    c.match_prefix(query(seq(1)))                 # split node 1 while its backup is in flight
    head = c.node(r1.node).parent
    assert head.write_id == b1.ack_id == c.node(r1.node).write_id
    c.ack_backup(b2.ack_id)
    c.check_invariants()
    assert head.state is Residency.BACKING_UP and c.node(r2.node).state is Residency.SYNCED
    with pytest.raises(ValueError, match="no backup in flight with ack id 99"):
        c.ack_backup(99)
    with pytest.raises(ValueError, match=f"ack id {b2.ack_id}"):
        c.ack_backup(b2.ack_id)
    c.ack_backup(b1.ack_id)
    c.check_invariants()
    assert head.state is Residency.SYNCED and c.node(r1.node).state is Residency.SYNCED


def test_backup_is_all_or_nothing_when_swa_host_is_full():
    c = core("tiny_v4", write_policy="write_through_selective", swa_host=1)
    a, _ = put(c, seq(1))
    put(c, seq(1))                                    # 2nd hit: backed up, takes the only SWA host page
    c.ack_backup(c.take_backup_batch().ack_id)        # SYNCED: not a host leaf, so not reclaimable
    b, _ = put(c, seq(2))
    free = (host_allocs(c)["kv"].num_free, host_allocs(c)["swa"].num_free)
    assert not c.backup(b.node)
    assert (host_allocs(c)["kv"].num_free, host_allocs(c)["swa"].num_free) == free
    assert c.node(b.node).state is Residency.DEVICE and c.take_backup_batch() is None
    assert c.stats.backups_without_room == 1
    c.check_invariants()


def test_host_slots_of_pending_writes_are_never_reclaimed():
    c = core("tiny_gqa", host=2, write_policy="write_back")
    r, _ = put(c, seq(1, 2))
    assert evict_device(c, 2).device_pages == 2        # write-back: backed up and demoted
    assert c.needs_flush and c.node(r.node).state is Residency.HOST_PENDING
    batch = c.take_backup_batch()
    put(c, seq(3))
    assert evict_host(c, 2) == 0                       # the only host leaf is still being written
    res = evict_device(c, 1)                           # no host room for this write-back: dropped
    assert res.dropped_tokens == P and c.stats.dropped[("kv", "host_pressure")] == P
    c.ack_backup(batch.ack_id)
    assert c.node(r.node).state is Residency.HOST
    assert evict_host(c, 2) == 2 and c.tree.num_nodes == 0
    c.check_invariants()


def test_failed_backups():
    c = core("tiny_v4")
    r, _ = put(c, seq(1, 2))
    batch = c.take_backup_batch()
    c.fail_backup(batch.ack_id)
    c.check_invariants()
    assert c.node(r.node).state is Residency.DEVICE and host_allocs(c)["kv"].num_free == 16
    assert c.node(r.node).lock_ref == 0
    wb = core("tiny_gqa", write_policy="write_back")
    r, _ = put(wb, seq(1, 2))
    evict_device(wb, 2)
    wb.fail_backup(wb.take_backup_batch().ack_id)     # its only copy is gone
    wb.check_invariants()
    assert wb.tree.num_nodes == 0 and wb.stats.dropped[("kv", "backup_failed")] == 2 * P
    assert host_allocs(wb)["kv"].num_free == 16 and device_allocs(wb)["kv"].num_free == 8


def test_failed_parent_backup_keeps_write_through_closure():
    c = core("tiny_gqa", write_policy="write_through_selective")
    parent, _ = put(c, seq(1))
    put(c, seq(1))
    b_parent = c.take_backup_batch()                  # parent in flight
    child, _ = put(c, seq(1, 2))
    put(c, seq(1, 2))                                 # child backed up in a later batch
    b_child = c.take_backup_batch()
    c.ack_backup(b_child.ack_id)                      # acks arrive out of order
    assert c.node(child.node).state is Residency.SYNCED
    c.fail_backup(b_parent.ack_id)
    c.check_invariants()
    assert c.node(parent.node).state is Residency.DEVICE
    assert c.node(child.node).state is Residency.DEVICE   # its host copy was dropped with the parent's
    assert host_allocs(c)["kv"].num_free == 16


def test_unbacked_write_through_eviction_is_counted():
    c = core("tiny_gqa", write_policy="write_through_selective")
    put(c, seq(1, 2))
    res = evict_device(c, 2)
    assert res.dropped_tokens == 2 * P
    assert dict(c.stats.dropped) == {("kv", "write_through_unbacked_eviction"): 2 * P}
    c.check_invariants()


def test_queued_copies_dropped_before_dispatch_release_everything():
    """A failed batch whose subtree was queued in the next, not yet dispatched, batch: those
    copies are dropped (their host pages freed at once), never merged twice, locks released."""
    c = core("tiny_v4", dev=4, host=4, swa_dev=3, swa_host=3)
    a, _ = put(c, seq(0))
    first = c.take_backup_batch()                    # a's copy is in flight
    b, _ = put(c, seq(0, 0))                         # b's copy is queued (not dispatched)
    c.fail_backup(first.ack_id)                      # a unbacked: b's queued copy must go too
    c.check_invariants()
    assert c.node(b.node).state is Residency.DEVICE and host_allocs(c)["kv"].num_free == 4
    assert c.take_backup_batch() is None and c.node(b.node).lock_ref == 0
    put(c, seq(0, 0))                                # both hit again: one copy each
    batch = c.take_backup_batch()
    assert sorted(batch.plan.batch("kv").device_pages.tolist()) == sorted(
        dev(c.node(a.node)).tolist() + dev(c.node(b.node)).tolist())
    c.ack_backup(batch.ack_id)
    c.check_invariants()


def test_a_read_backup_lets_its_pages_go_before_the_ack():
    """Once a batch is dispatched whole (`backup_read`), its nodes' device pages may be
    evicted before the copy lands: such a node waits on the host (HOST_PENDING), is not
    matched there until the ack, then is an ordinary host node."""
    c = core("tiny_v4")
    r, _ = put(c, seq(1, 2))
    batch = c.take_backup_batch()
    assert evict_device(c, 2).device_pages == 0               # read by nothing yet: locked
    c.backup_read(batch.ack_id)
    c.check_invariants()
    assert c.node(r.node).lock_ref == 0 and c.device_room()["kv"] == 8
    assert evict_device(c, 2).device_pages == 2
    c.check_invariants()
    assert c.node(r.node).state is Residency.HOST_PENDING and device_allocs(c)["kv"].num_free == 8
    m = c.match_prefix(query(seq(1, 2)))                       # the host copy is not there yet:
    assert m.total_len == 0 and m.pending_len == 2 * P and m.pending_writes == {batch.ack_id}
    c.ack_backup(batch.ack_id)
    c.check_invariants()
    assert c.node(r.node).state is Residency.HOST and c.match_prefix(query(seq(1, 2))).host_len == 2 * P
    with pytest.raises(ValueError, match="no backup in flight"):
        c.backup_read(batch.ack_id)


def test_a_read_backup_that_fails_after_its_pages_went_drops_them_and_keeps_the_closure():
    """Write-through: a read batch fails after its nodes were evicted: their only copy is
    gone (dropped, counted as backup_failed), and a host copy below them goes too."""
    c = core("tiny_gqa")
    parent, _ = put(c, seq(1))
    first = c.take_backup_batch()
    child, _ = put(c, seq(1, 2))
    second = c.take_backup_batch()
    for b in (first, second):
        c.backup_read(b.ack_id)
    c.ack_backup(second.ack_id)                               # the child's copy is durable
    assert evict_device(c, 2).device_pages == 2               # both leave the device
    assert c.node(parent.node).state is Residency.HOST_PENDING
    c.fail_backup(first.ack_id)
    c.check_invariants()
    assert c.tree.num_nodes == 0 and c.stats.dropped[("kv", "backup_failed")] == P
    assert host_allocs(c)["kv"].num_free == 16 and device_allocs(c)["kv"].num_free == 8


def test_backup_read_refuses_a_batch_not_dispatched():
    c = core("tiny_v4")
    put(c, seq(1))                                            # queued in the open batch, not taken
    with pytest.raises(ValueError, match="no backup in flight with ack id 1"):
        c.backup_read(1)
