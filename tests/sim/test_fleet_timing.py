"""The simulated clock and the decisions on small hand-made traces: TTFT, queueing,
load-backs, window stop points, the shared storage tier's visibility and prefetch policy."""
import pytest

import hicache_jax as hc
from hicache_jax.sim import Rates, SimConfig, simulate
from hicache_jax.trace import TraceRequest
from sim_helpers import layout

RATES = Rates(prefill_tokens_per_s=1000.0)
KV, SWA = 998_208, 8_160_000          # V4-Flash bytes of one page of each allocator (every pool, every layer)


def req(index, t_s, ids, n=None):
    return TraceRequest(index, t_s * 1e3, n or 512 * len(ids), 0, tuple(ids))


def fleet(device=64, host=256, storage=None, policy="ends+every_4", **kw):
    cache = hc.HiCacheConfig(device_pages=device, host_pages={"kv": host, "swa": host},
                             check_invariants=True, **kw.pop("cache", {}))
    pages = None if storage is None else {"kv": storage, "swa": storage}
    return SimConfig(cache, storage_pages=pages, window_policy=hc.WindowPolicy.parse(policy), rates=RATES, **kw)


def test_a_lone_request_takes_its_prefill_and_nothing_else():
    r = simulate([req(0, 3.0, (1, 2), n=1000)], layout(), fleet())
    (o,) = r.outcomes
    assert (o.device, o.host, o.storage, o.computed) == (0, 0, 0, 1000)
    assert o.start_s == 3.0 and o.ttft_s == pytest.approx(1.0)
    assert r.ttft_ms["p50"] == pytest.approx(1000.0)


def test_requests_queue_on_a_busy_instance_and_not_on_an_idle_one():
    two = [req(0, 0.0, (1, 2)), req(1, 0.0, (3, 4))]
    one = simulate(two, layout(), fleet(route="round_robin")).outcomes
    assert [o.ttft_s for o in one] == pytest.approx([1.024, 2.048]) and one[1].start_s == pytest.approx(1.024)
    spread = simulate(two, layout(), fleet(instances=2, route="round_robin")).outcomes
    assert [o.ttft_s for o in spread] == pytest.approx([1.024, 1.024]) and [o.instance for o in spread] == [0, 1]


def test_a_next_turn_resumes_at_the_end_of_the_last_one():
    a, b = req(0, 0.0, (1, 2, 3)), req(1, 10.0, (1, 2, 3, 4))   # b extends a's 6 pages
    o = simulate([a, b], layout(), fleet()).outcomes[1]
    assert (o.device, o.host, o.computed) == (1536, 0, 512)
    assert o.ttft_s == pytest.approx(0.512)


def test_an_evicted_prefix_is_loaded_back_from_host_at_the_link_rate():
    # c (8 pages) needs the whole 8-page device tier: a's pages go, backed up on the host
    a, c, b = req(0, 0.0, (1, 2, 3)), req(1, 5.0, (7, 8, 9, 10)), req(2, 10.0, (1, 2, 3, 4))
    r = simulate([a, c, b], layout(), fleet(device=8, host=64))
    o = r.outcomes[2]
    assert (o.device, o.host, o.computed) == (0, 1536, 512)
    moved = 6 * KV + 1 * SWA          # a's 6 kv pages and the window (1 page) of its stop at 6
    assert r.bytes_moved["host_to_device"] == moved
    assert o.ttft_s == pytest.approx(moved / RATES.host_link_bytes_per_s + 0.512)


@pytest.mark.parametrize("policy, hit", [("every", 512), ("ends+every_2", 512), ("ends+every_4", 0)])
def test_a_hit_ends_only_where_the_window_policy_kept_the_window(policy, hit):
    # b shares a's first block (2 pages); a keeps the window of page boundary 2 only under some policies
    r = simulate([req(0, 0.0, (1, 2)), req(1, 10.0, (1, 9))], layout(), fleet(policy=policy))
    assert r.outcomes[1].device == hit


def test_a_storage_write_is_seen_by_another_instance_once_it_has_landed():
    a = req(0, 0.0, (1, 2, 3))
    kept = 2                        # a keeps the windows of its stops 4 and 6 (ends+every_4)
    written = (6 * KV + kept * SWA) / RATES.storage_write_bytes_per_s
    early = simulate([a, req(1, 1.536 + written / 2, (1, 2, 3, 4))], layout(),
                     fleet(storage=1000, instances=2, route="round_robin"))
    assert early.outcomes[1].instance == 1 and early.outcomes[1].storage == 0
    late = simulate([a, req(1, 1.536 + 2 * written, (1, 2, 3, 4))], layout(),
                    fleet(storage=1000, instances=2, route="round_robin"))
    o = late.outcomes[1]
    assert (o.instance, o.device, o.host, o.storage) == (1, 0, 0, 1536)
    read = 6 * KV + 1 * SWA         # 6 kv pages and the window of the stop at 6
    assert late.bytes_moved["storage_to_host"] == read
    # written: a's pages, then b's 2 new pages with the window of its end (page 7)
    assert late.bytes_moved["host_to_storage"] == (6 * KV + kept * SWA) + (2 * KV + 1 * SWA)
    assert o.ttft_s == pytest.approx(RATES.storage_lookup_s + read / RATES.storage_read_bytes_per_s
                                     + read / RATES.host_link_bytes_per_s + 0.512)


def test_best_effort_does_not_wait_for_a_prefetch_which_lands_while_the_request_runs():
    a = req(0, 0.0, (1, 2, 3))
    b, c = req(1, 5.0, (1, 2, 3, 4)), req(3, 9.0, (1, 2, 3, 5))
    cfg = fleet(storage=1000, instances=2, route="round_robin", cache={"storage": hc.StorageConfig(prefetch_policy="best_effort")})
    r = simulate([a, b, req(2, 7.0, (20, 21)), c], layout(), cfg)   # 2 instances: c goes where b went
    ob, oc = r.outcomes[1], r.outcomes[3]
    assert ob.instance == oc.instance == 1
    assert (ob.device, ob.host, ob.storage) == (0, 0, 0)    # b computed everything: the read had not landed
    assert r.tree["prefetches"] == {"landed": 1}            # it landed during b's prefill: 6 pages, host-only
    # b's insert adopted those 6 pages, keeping SWA device pages at its own stops (4 and 8);
    # the window of boundary 6 is the prefetch's, on the host: c loads it back
    assert (oc.device, oc.host, oc.storage) == (1024, 512, 0)
