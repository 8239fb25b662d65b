"""Helpers of the simulator's tests: layouts, trace slices, small configs.

(Not a conftest.py: a second one would shadow `tests/conftest.py` for `from conftest import`.)"""
import functools

import hicache_jax as hc
from conftest import CONFIGS, ROOT
from hicache_jax.sim import SimConfig
from hicache_jax.trace import TraceRequest, read_trace

TRACE = ROOT / "traces" / "conversation_trace.jsonl.gz"


@functools.cache
def layout(name: str = "deepseek_v4_flash"):
    return hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))


@functools.cache
def trace(limit: int) -> tuple[TraceRequest, ...]:
    return tuple(read_trace(TRACE, limit=limit))


def config(device=64, host=256, storage=None, window_ratio=0.25, **kw) -> SimConfig:
    """A fleet of V4-Flash-like tiers in anchor pages, `window_ratio` window pages per page
    (at least 32 on device: a prompt cut to 8K tokens needs 32 to compute)."""
    kw.setdefault("max_input_tokens", 4096)
    cache = hc.HiCacheConfig(device_pages=device, swa_device_pages=max(32, int(device * window_ratio)),
                             host_pages={"kv": host, "swa": int(host * window_ratio)},
                             **kw.pop("cache", {}))
    pages = None if storage is None else {"kv": storage, "swa": int(storage * window_ratio)}
    return SimConfig(cache, storage_pages=pages, **kw)


def reference_hit_tokens(requests, page_size: int = 256, max_tokens: int | None = None) -> int:
    """Prefix hits with unlimited capacity, in arrival order, from the hash ids alone: the
    longest run of leading blocks some earlier request had at the same positions, capped
    as a match is (page-aligned, never the last token)."""
    seen, hits = set(), 0
    for r in requests:
        n = r.input_length if max_tokens is None else min(r.input_length, max_tokens)
        ids = r.blocks(n)
        k = 0
        while k < len(ids) and ids[: k + 1] in seen:
            k += 1
        seen.update(ids[: i + 1] for i in range(len(ids)))
        hits += min(k * 512, (n - 1) // page_size * page_size)
    return hits
