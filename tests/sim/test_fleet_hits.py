"""Hit rates of the fleet planner: the reference figures, monotone in every tier size,
routing and a shared storage tier doing what they should."""
import pytest

import hicache_jax as hc
from hicache_jax.sim import SimConfig, simulate
from sim_helpers import config, layout, reference_hit_tokens, trace

EVERY = hc.WindowPolicy.parse("every")


def unlimited(requests, window_policy=EVERY, **kw) -> SimConfig:
    pages = sum(-(-r.input_length // 256) for r in requests) + 1
    cache = hc.HiCacheConfig(device_pages=pages, host_pages={"kv": pages, "swa": pages})
    return SimConfig(cache, window_policy=window_policy, **kw)


def test_unlimited_tiers_hit_exactly_the_reference_prefixes():
    reqs = trace(1000)
    r = simulate(reqs, layout(), unlimited(reqs))
    assert r.hit_tokens["device"] == reference_hit_tokens(reqs) > 0
    assert r.hit_tokens["host"] == r.hit_tokens["storage"] == 0
    assert r.requests == 1000 and r.input_tokens == sum(q.input_length for q in reqs)


@pytest.mark.slow
def test_unlimited_tiers_reproduce_the_conversation_traces_reference_rate():
    reqs = trace(12031)
    r = simulate(reqs, layout(), unlimited(reqs))
    assert abs(r.hit_rate["total"] - 0.374) < 0.01      # traces/README.md


def test_sparser_stop_points_hit_less():
    reqs = trace(400)
    rates = [simulate(reqs, layout(), unlimited(reqs, window_policy=hc.WindowPolicy.parse(p))).hit_rate["total"]
             for p in ("every", "ends+every_2", "ends+every_4", "ends")]
    assert rates[0] > rates[2] and rates == sorted(rates, reverse=True), rates


@pytest.mark.parametrize("route", ["random", "affinity"])
@pytest.mark.parametrize("tier, sizes", [("device", (16, 256, 512, 1024)), ("host", (0, 512, 1024, 4096)),
                                         ("storage", (0, 2048, 4096, 16384))])
def test_hit_rate_is_monotone_in_every_tier_size(route, tier, sizes):
    reqs = trace(500)
    rates = [simulate(reqs, layout(), config(**{tier: n}, instances=4, route=route)).hit_rate["total"]
             for n in sizes]
    assert rates == sorted(rates) and rates[-1] > rates[0], rates


def test_affinity_routing_hits_at_least_as_much_as_random():
    reqs = trace(500)
    rates = {route: simulate(reqs, layout(), config(host=1024, instances=4, route=route)).hit_rate["total"]
             for route in ("random", "round_robin", "affinity")}
    assert rates["affinity"] >= rates["random"] and rates["affinity"] > rates["round_robin"], rates


def test_a_shared_storage_tier_raises_the_hit_rate_of_random_routing():
    reqs = trace(500)
    alone = simulate(reqs, layout(), config(instances=4, route="random"))
    shared = simulate(reqs, layout(), config(storage=8192, instances=4, route="random"))
    assert shared.hit_rate["storage"] > 0 and shared.hit_rate["total"] > alone.hit_rate["total"]
    assert shared.hit_rate["device"] + shared.hit_rate["host"] <= shared.hit_rate["total"]
    assert shared.bytes_moved["storage_to_host"] > 0 and shared.bytes_moved["host_to_storage"] > 0
    assert alone.bytes_moved["storage_to_host"] == 0


def test_every_tree_keeps_its_invariants_through_a_run():
    reqs = trace(200)
    for route, write, store in (("random", "write_back", "write_back"),
                                ("affinity", "write_through_selective", "write_through")):
        cfg = config(device=48, host=128, storage=4096, instances=3, route=route,
                     cache={"check_invariants": True, "write_policy": write,
                            "storage": hc.StorageConfig(write_policy=store)})
        r = simulate(reqs, layout(), cfg)
        assert r.requests == 200 and r.storage["written_pages"]["kv"] > 0
