"""Device and host LRU eviction: order, leaves only, every pool of a node at once."""
from hicache_jax.tree import Residency, Tier
from helpers import P, core, device_allocs, evict_device, evict_host, host_allocs, put, query, seq


def test_device_eviction_is_lru_over_leaves():
    c = core("tiny_gqa", write_policy="write_through_selective")
    a = put(c, seq(1))[0]
    b = put(c, seq(2))[0]
    d = put(c, seq(3))[0]
    c.match_prefix(query(seq(1)))                  # a is now the most recently used
    evict_device(c, 1)
    assert c.tree.get(b.node) is None and c.node(a.node) and c.node(d.node)
    evict_device(c, 1)
    assert c.tree.get(d.node) is None
    c.check_invariants()


def test_a_match_that_does_not_touch_leaves_the_lru_order():
    c = core("tiny_gqa", write_policy="write_through_selective")
    a = put(c, seq(1))[0]
    b = put(c, seq(2))[0]
    m = c.match_prefix(query(seq(1)), touch=False)   # a look ahead: a stays the least recently used
    assert m.device_len == P
    evict_device(c, 1)
    assert c.tree.get(a.node) is None and c.node(b.node)
    c.check_invariants()


def test_internal_nodes_wait_until_they_are_leaves():
    c = core("tiny_gqa", write_policy="write_through_selective")
    put(c, seq(1, 2))
    put(c, seq(1, 3))                               # [1] -> {[2], [3]}; [1]'s 2nd hit backs it up
    c.ack_backup(c.take_backup_batch().ack_id)
    parent = c.node(c.match_prefix(query(seq(1))).device_node)   # touched last
    res = evict_device(c, 1)
    assert res.device_pages == 1 and c.tree.num_nodes == 2      # a leaf went, not the parent
    evict_device(c, 2)
    assert c.tree.num_nodes == 1 and parent.state is Residency.HOST
    assert device_allocs(c)["kv"].num_free == 8
    c.check_invariants()


def test_host_eviction_frees_every_pool_and_cleans_up_parents():
    c = core("tiny_v4", host=16, swa_host=16)
    put(c, seq(1, 2), swa_last=2)
    put(c, seq(1, 2, 3), swa_last=1)
    c.ack_backup(c.take_backup_batch().ack_id)
    evict_device(c, 8)
    assert all(n.state is Residency.HOST for n in c.tree.nodes())
    used = (16 - host_allocs(c)["kv"].num_free, 16 - host_allocs(c)["swa"].num_free)
    assert used == (3, 3)
    assert evict_host(c, 1) == 1                      # the leaf [3], with its SWA host page
    assert (16 - host_allocs(c)["kv"].num_free, 16 - host_allocs(c)["swa"].num_free) == (2, 2)
    c.check_invariants()
    assert evict_host(c, 2) == 2                      # the parent became a host leaf
    assert c.tree.num_nodes == 0 and host_allocs(c)["swa"].num_free == 16
    c.check_invariants()


def test_synced_eviction_keeps_the_host_copy_and_host_leaf_order():
    c = core("tiny_gqa")
    put(c, seq(1))
    put(c, seq(2))
    c.ack_backup(c.take_backup_batch().ack_id)
    evict_device(c, 2)
    c.match_prefix(query(seq(1)))                    # host-side touch
    evict_host(c, 1)
    m1, m2 = c.match_prefix(query(seq(1))), c.match_prefix(query(seq(2)))
    assert (m1.host_len, m2.host_len) == (P, 0)
    assert c.stats.evicted[Tier.HOST] == P


def test_swa_tombstones_free_swa_only_lru_first():
    c = core("tiny_v4", write_policy="write_through_selective", swa_dev=8)
    put(c, seq(1, 2), swa_last=2)                     # SWA on both pages
    put(c, seq(3), swa_last=1)
    c.match_prefix(query(seq(3)))                     # [3] is the most recently used
    kv_free = device_allocs(c)["kv"].num_free
    res = evict_device(c, 0, 2)                        # SWA only: the older node's two SWA pages
    assert (res.device_pages, res.swa_pages) == (0, 2) and device_allocs(c)["kv"].num_free == kv_free
    assert c.stats.tombstoned["swa"] == 2
    assert c.match_prefix(query(seq(1, 2))).device_len == 0    # its window is gone from device
    assert c.match_prefix(query(seq(3))).device_len == P       # the recent one kept its window
    c.check_invariants()
