"""`backup_bytes_per_step`: a write-through batch larger than the budget goes one piece per
`step()`, is acknowledged once, when its last piece lands, and lands exactly; a write-back
demotion is never paced; `drain` / `acquire` finish a paced batch at once."""
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.plan import Direction, make_plan, split_plan
from driver import Driver, P, layout

LAYOUTS = ["tiny_v4", "tiny_v41", "tiny_gqa"]


def page_of(c):
    """The bytes one anchor page (all pools moving with it) takes."""
    return c.layout.page_bytes_of(c.anchor)


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_paced_batch_moves_a_piece_per_step_and_lands_exactly(name):
    lay = layout(name)
    budget = 2 * lay.page_bytes_of(lay.anchor.name)
    c = hc.HiCache(lay, hc.HiCacheConfig(device_pages=12, host_pages=24, check_invariants=True, load_back_threshold=1,
                                         transfer=hc.TransferConfig(backup_bytes_per_step=budget)))
    d = Driver(c)
    blocks = list(range(7))
    d.request(blocks, swa_every=True)      # 7 pages inserted: their backup is queued
    steps = 0
    while (c.stats().in_flight["backup"] or steps == 0) and steps < 50:   # the last steps wait for the copies
        c.step()
        steps += 1
    c.drain()                              # a slow machine: the last pieces may still be landing
    per_swa_piece = max(1, budget // lay.page_bytes_of(c.swa_allocator)) if c.swa_allocator else 0
    pieces = 4 + (-(-7 // per_swa_piece) if per_swa_piece else 0)   # 7 kv pages, 2 a piece; then SWA
    assert steps >= pieces - 1             # the step that dispatches a batch may also start its second piece
    assert c.stats().transfers["backup"] == 1             # one transfer for the tree and the metrics
    c.evict(10 ** 6, 10 ** 6 if c.swa_allocator else 0)
    c.drain()
    assert d.request(blocks) == 7 * P        # all of it from the host, bytes checked


def test_drain_and_acquire_finish_a_paced_batch_at_once():
    lay = layout("tiny_v4")
    c = hc.HiCache(lay, hc.HiCacheConfig(device_pages=12, host_pages=24, check_invariants=True, load_back_threshold=1,
                                         transfer=hc.TransferConfig(backup_bytes_per_step=lay.page_bytes_of("kv"))))
    d = Driver(c)
    d.request([0, 1, 2, 3], swa_every=True)
    c.step()
    assert c.stats().in_flight["backup"] == 1
    c.drain()
    assert c.stats().in_flight["backup"] == 0 and c.stats().transfers["backup"] == 1
    d.request([5, 6, 7], swa_every=True)
    c.step()
    c.evict(10 ** 6, 10 ** 6)   # the unfinished batch's nodes stay locked on device
    assert d.request([5, 6, 7]) == 3 * P


def test_a_demotion_is_never_paced():
    lay = layout("tiny_v4")
    c = hc.HiCache(lay, hc.HiCacheConfig(device_pages=8, host_pages=24, check_invariants=True,
                                         write_policy="write_back", load_back_threshold=1,
                                         transfer=hc.TransferConfig(backup_bytes_per_step=1)))
    d = Driver(c)
    d.request([0, 1, 2, 3], swa_every=True)
    c.evict(10 ** 6, 10 ** 6)             # demotion: device pages free at once, its copy goes whole
    grant = c.alloc(8, 8)                  # ... and may be overwritten right away
    d.write({a: [(int(p), (9, 9)) for p in pages] for a, pages in grant.items()})
    for a, pages in grant.items():
        c.free(a, pages)
    c.drain()
    assert d.request([0, 1, 2, 3]) == 4 * P


def test_split_plan_cuts_within_the_budget_and_keeps_every_page():
    lay = layout("tiny_v4")
    kv, swa = lay.page_bytes_of("kv"), lay.page_bytes_of("swa")
    plan = make_plan(lay, Direction.BACKUP, {"kv": ([5, 1, 9, 2, 7], [10, 11, 12, 20, 21]), "swa": ([3, 4], [0, 6])})
    pieces = split_plan(plan, lay, 2 * kv)
    assert all(p.nbytes(lay) <= max(2 * kv, swa) for p in pieces)
    for a in ("kv", "swa"):
        dev = np.concatenate([p.batch(a).device_pages for p in pieces if p.batch(a)])
        host = np.concatenate([p.batch(a).host_pages for p in pieces if p.batch(a)])
        assert dev.tolist() == plan.batch(a).device_pages.tolist() and host.tolist() == plan.batch(a).host_pages.tolist()
    assert split_plan(plan, lay, 10 ** 12) == [plan]
    with pytest.raises(ValueError, match="max_bytes"):
        split_plan(plan, lay, 0)
    with pytest.raises(ValueError, match="backup_bytes_per_step"):
        hc.HiCacheConfig(device_pages=4, transfer=hc.TransferConfig(backup_bytes_per_step=0))


def test_batches_in_flight_share_one_budget_per_step():
    lay = layout("tiny_gqa")
    page = lay.page_bytes_of("kv")
    c = hc.HiCache(lay, hc.HiCacheConfig(device_pages=16, host_pages=32, check_invariants=True, load_back_threshold=1,
                                         transfer=hc.TransferConfig(backup_bytes_per_step=2 * page)))
    sent = [0]                           # bytes dispatched, per step()
    real_start = c._engine.start

    def counting(plan, pools):
        sent[-1] += plan.nbytes(lay)
        return real_start(plan, pools)
    c._engine.start = counting
    d = Driver(c)
    d.request([0, 1, 2])                 # 3 pages queued; the request's step() sends 2
    sent.append(0)
    d.request([4, 5, 6, 7])              # 4 more while the first batch is still being paced
    while c.stats().in_flight["backup"] and len(sent) < 20:   # 4 steps dispatch; the rest wait for the copies
        sent.append(0)
        c.step()
    c.drain()        # a slow machine: the last pieces may still be landing (a piece left over would go now)
    assert max(sent) <= 2 * page and sum(sent) == 7 * page
    assert c.stats().transfers["backup"] == 2
    c.evict(10 ** 6)
    assert d.request([0, 1, 2]) == 3 * P and d.request([4, 5, 6, 7]) == 4 * P
