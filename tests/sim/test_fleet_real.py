"""The simulator against real processes: 3 `HiCache` processes sharing a loopback Mooncake
Store serve a slice of the conversation trace, routed at random (seeded) or by affinity
over their own trees; the simulator, given the same slice, sizes and routing in its
serial mode (where timing decides nothing), predicts where every request goes and how
many of its tokens come from device, host and storage, exactly.

(With every load at 0 between requests, affinity sends all but the first request to the
instance holding the trace's common first block: it checks the router over processes'
trees; random routing spreads the slice and checks hits across instances.)"""
import sys

import pytest

import hicache_jax as hc
from conftest import ROOT
from hicache_jax.sim import Router, SimConfig, simulate
from hicache_jax.trace import read_trace

sys.path.insert(0, str(ROOT / "tests" / "storage"))
from fleet_check import RealFleet, run_real  # noqa: E402
from storage_helpers import needs_mooncake, start_mooncake  # noqa: E402

REQUESTS, INSTANCES, CUT = 150, 3, 2048
DEVICE, HOST = 16, {"kv": 400, "swa": 400}
POLICY = "every"


@pytest.mark.slow
@needs_mooncake
@pytest.mark.parametrize("route", ["random", "affinity"])
def test_the_simulator_predicts_real_processes_exactly(tmp_path, route):
    trace = "traces/conversation_trace.jsonl.gz"
    server = start_mooncake(tmp_path)
    try:
        fleet = RealFleet(INSTANCES, tmp_path, config="configs/tiny_v4.json", trace=trace, limit=REQUESTS,
                          max_input_tokens=CUT, device_pages=DEVICE, swa_device_pages=DEVICE,
                          host_pages='{"kv": 400, "swa": 400}', storage=server.url, window_policy=POLICY,
                          model_id="fleet-check")
        try:
            real = run_real(fleet, Router(route, INSTANCES, load_bound=0, seed=3), REQUESTS)
            checks = [fleet.ask(i, op="check") for i in range(INSTANCES)]   # invariants hold, no store failed
        finally:
            fleet.close()
    finally:
        server.stop()
    assert checks == [{"storage_failures": 0}] * INSTANCES

    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / "tiny_v4.json"))
    cache = hc.HiCacheConfig(device_pages=DEVICE, swa_device_pages=DEVICE, host_pages=HOST,
                             storage=hc.StorageConfig(prefetch_policy="wait_complete", call_timeout_s=30.0))
    config = SimConfig(cache, INSTANCES, route, load_bound=0, seed=3, storage_pages={"kv": 10 ** 6, "swa": 10 ** 6},
                       window_policy=hc.WindowPolicy.parse(POLICY), max_input_tokens=CUT, serial=True)
    sim = simulate(read_trace(ROOT / trace, limit=REQUESTS), layout, config)
    predicted = [(o.instance, o.device, o.host, o.storage) for o in sim.outcomes]

    for k, (p, r) in enumerate(zip(predicted, real, strict=True)):
        assert p == r, f"request {k}: simulator (instance, device, host, storage) {p}, real processes {r}"
    # the slice exercises every tier
    assert all(sim.hit_tokens[t] > 0 for t in ("device", "host", "storage")), sim.hit_tokens
    if route == "random":
        assert sorted({o.instance for o in sim.outcomes}) == list(range(INSTANCES))
