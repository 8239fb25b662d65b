"""Fleet planner: a request trace replayed on the real control plane of N simulated instances.

Pure Python + numpy; never imports jax. Each instance is a real `TreeCore` with real
allocators, write and window policies, eviction, storage keys and prefetch policy; only
bytes and time are simulated (bytes over link rates, prefill tokens over a compute rate).
`python -m hicache_jax.sim --help` is the command line; `simulate` the library entry.

    import hicache_jax as hc
    from hicache_jax.sim import SimConfig, simulate
    from hicache_jax.trace import read_trace

    layout = hc.build_layout(hc.load_model_config("configs/deepseek_v4_flash.json"))
    cache = hc.HiCacheConfig(device_pages=4096, swa_device_pages=1024, host_pages={"kv": 16384, "swa": 4096})
    result = simulate(read_trace("traces/conversation_trace.jsonl.gz", limit=500), layout,
                      SimConfig(cache, instances=8, route="affinity", storage_pages={"kv": 10**5, "swa": 25_000}))
    result.hit_rate, result.ttft_ms, result.bytes_moved, result.outcomes   # by tier, p50/p90/p99, per link
"""
from hicache_jax.sim.config import ROUTES, Rates, SimConfig
from hicache_jax.sim.fleet import check_fits, simulate
from hicache_jax.sim.instance import RequestOutcome
from hicache_jax.sim.results import SimResult
from hicache_jax.sim.router import Router
from hicache_jax.sim.sizing import TierSize, page_bytes, tier_pages

__all__ = ["ROUTES", "Rates", "RequestOutcome", "Router", "SimConfig", "SimResult", "TierSize", "check_fits",
           "page_bytes", "simulate", "tier_pages"]
