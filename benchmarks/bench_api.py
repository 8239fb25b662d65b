"""A host hit as a serving loop sees it: `acquire` (and `load_back` + `wait`) of a prefix
that lives on the host only, paired round by round with a contiguous pinned-host ->
device `device_put` of the same bytes (the prefix's kv pages and its trailing window's
SWA pages, every pool), measured in the same process.

Each round: evict the prefix from the device (its host copy stays), then time the public
call until it returns with the pages usable, then the contiguous copy; medians of the
times and of the per-round ratios. The first round's restored pages are compared byte
for byte with what was written.

    python benchmarks/bench_api.py --out api.json            # V4-Flash and V4.1-Flash, 1..4096 pages (GPU)
    python benchmarks/bench_api.py --smoke --out api.json    # tiny_v4, CPU, seconds

Each call's time is also split (`breakdown_ms`): the tree's match, its load planning, the
engine's dispatch, the wait (and the bookkeeping when the load lands), and the rest.

By default every round's hit lands on the same device pages. `--page-spread K` holds the
first `r % K` free device pages of each pool in round `r`, so the hits land on other pages,
as a serving loop's do; the cache is warmed up first (`warmup(1)`), as a serving loop's is.

    python benchmarks/bench_api.py --pages 1,16 --page-spread 64 --out spread.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hicache_jax as hc  # noqa: E402
from hicache_jax.transfer import TransferEngine  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

clock = time.perf_counter


def prefix_bytes(layout, pages: int) -> int:
    window = min(pages, layout.window_pages())
    return pages * layout.page_bytes_of(layout.anchor.name) + (
        window * layout.page_bytes_of(layout.swa_pool.name) if layout.swa_pool else 0)


def fill(cache, grant, seed: int) -> dict[str, jax.Array]:
    """Random bytes in the granted pages of every pool (on the device); returns them."""
    pools, written = cache.device_pools, {}
    key = jax.random.key(seed)
    for spec in cache.layout.byte_pools:
        pages = jnp.asarray(grant[spec.allocator])
        if pages.size == 0:
            continue
        key, sub = jax.random.split(key)
        arr = pools[spec.name]
        shape = (arr.shape[0], int(pages.size), *arr.shape[2:])
        bits = jax.random.bits(sub, shape, jnp.uint8 if arr.dtype == jnp.uint8 else jnp.uint16)
        values = jax.lax.bitcast_convert_type(bits, arr.dtype)
        pools[spec.name] = jax.jit(lambda a, p, v: a.at[:, p].set(v), donate_argnums=0,
                                   out_shardings=arr.sharding)(arr, pages, values)
        written[spec.name] = values
    cache.set_device_pools(pools)
    return written


def insert_prefix(cache, pages: int, seed: int, token_seed: int | None = None):
    """Write random bytes into `pages` new pages (and the trailing window's SWA pages) and
    insert them as a prefix of random tokens: returns (its tokens + one more, the bytes)."""
    window = min(pages, cache.window_pages)
    rng = np.random.default_rng(seed if token_seed is None else token_seed)
    tokens = rng.integers(1, 50_000, pages * cache.layout.page_size + 1).astype(np.int32)
    grant = cache.alloc(pages, window)
    written = fill(cache, grant, seed)
    keep = {pages - window + i: int(p) for i, p in enumerate(grant[cache.swa_allocator])} if window else None
    cache.insert(tokens[:-1], grant[cache.anchor], keep)
    return tokens, written


def contiguous_copy(layout, pages: int):
    """The raw-link reference for a prefix of `pages` pages: `link_copy` of its bytes."""
    return link_copy(prefix_bytes(layout, pages))


def link_copy(nbytes: int):
    """The raw-link reference: a function timing one contiguous pinned-host -> device
    `device_put` of `nbytes` bytes (seconds)."""
    dev = jax.devices()[0]
    block = jax.device_put(np.zeros(nbytes, np.uint8),
                           jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host"))
    on_device = jax.sharding.make_single_device_sharding(dev, memory_kind="device")

    def timed() -> float:
        t = clock()
        jax.block_until_ready(jax.device_put(block, on_device))
        return clock() - t
    return timed


def hold_pages(cache, n: int) -> dict:
    """Hold `n` free device pages of each pool (a window pool too), so the next hit lands elsewhere."""
    return cache.alloc(n, n if cache.window_pages else 0) if n else {}


def release_pages(cache, held: dict) -> None:
    for allocator, taken in held.items():
        cache.free(allocator, taken)


def same_bytes(cache, prefix, written) -> bool:
    pools = cache.device_pools
    for spec in cache.layout.byte_pools:
        if spec.name not in written:
            continue
        pages = prefix.device_pages if spec.allocator == cache.anchor else prefix.swa_pages
        got = pools[spec.name][:, jnp.asarray(pages)]
        want = written[spec.name][:, -len(pages):] if spec.allocator != cache.anchor else written[spec.name]
        if not bool(jnp.array_equal(got, want)):
            return False
    return True


def make_cache(config: str, max_pages: int, layer_groups: int = 1, spare: int = 0, package=hc,
               kernels: str = "auto", early_copy_bytes: int | None = None) -> hc.HiCache:
    """A cache for prefixes of up to `max_pages` pages, with `spare` more device pages per pool,
    from `package` (`hicache_jax`, or an earlier revision of it) on the `kernels` given, copying
    loads early from `early_copy_bytes` (None: the engine's default)."""
    layout = package.build_layout(package.load_model_config(ROOT / "configs" / f"{config}.json"))
    window = layout.window_pages() if layout.swa_pool else 0
    sizes = dict(device_pages=max_pages + 2 + spare, swa_device_pages=window + 2 + spare if window else None,
                 host_pages={"kv": max_pages + 2, **({"swa": window + 2} if window else {})},
                 write_policy="write_back", load_back_threshold=1)
    early = {} if early_copy_bytes is None else {"early_copy_bytes": early_copy_bytes}
    if hasattr(package, "TransferConfig"):      # this tree: the transfer settings are a section
        transfer = package.TransferConfig(host_memory_limit_bytes=1 << 40, layer_groups=layer_groups,
                                          kernels=kernels, **early)
        return package.HiCache(layout, package.HiCacheConfig(**sizes, transfer=transfer))
    # an earlier revision (api_ab.py's base): flat fields; kernels and early copies through its engine
    cfg = package.HiCacheConfig(**sizes, host_memory_limit_bytes=1 << 40, layer_groups=layer_groups)
    engine = None if kernels == "auto" and not early else package.TransferEngine(
        layout, *cfg.page_counts(layout), max_staging_bytes=cfg.max_staging_bytes,
        host_memory_limit_bytes=cfg.host_limit_bytes(), layer_groups=layer_groups, kernels=kernels, **early)
    return package.HiCache(layout, cfg, engine=engine)


def make_cache_and_engine(config: str, max_pages: int, kernels: str = "auto") -> tuple[hc.HiCache, TransferEngine]:
    """`make_cache`'s cache of this tree, built over an engine the caller keeps (to call its
    programs alone: `TransferEngine.plan_program`, `.program`)."""
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{config}.json"))
    window = layout.window_pages() if layout.swa_pool else 0
    cfg = hc.HiCacheConfig(device_pages=max_pages + 2, swa_device_pages=window + 2 if window else None,
                           host_pages={"kv": max_pages + 2, **({"swa": window + 2} if window else {})},
                           write_policy="write_back", load_back_threshold=1,
                           transfer=hc.TransferConfig(host_memory_limit_bytes=1 << 40, kernels=kernels))
    engine = TransferEngine(layout, *cfg.page_counts(layout), None, cfg.transfer)
    return hc.HiCache(layout, cfg, engine=engine), engine


class Breakdown:
    """Where an `acquire` / `load_back` + `wait` spends its time: the cache's own steps are
    wrapped with timers (match, the tree's load planning, the engine's dispatch, the wait
    and the bookkeeping after it); `other` is the rest of the call."""

    STEPS = ("match", "plan", "dispatch", "wait")

    def __init__(self, cache: hc.HiCache):
        self.spent = cache.time_phases()        # the cache's own instrumentation

    def take(self, total: float) -> dict[str, float]:
        out = {k: self.spent.get(k, 0.0) for k in self.STEPS}
        out["other"] = total - sum(out.values())
        self.spent.clear()
        return out


def run(cache: hc.HiCache, pages: int, rounds: int, seed: int, breakdown: Breakdown, spread: int = 0) -> dict:
    """One prefix of `pages` pages: insert it, then `rounds` paired rounds (after a warm-up one,
    which also compiles what it needs); with `spread`, round `r` first holds `r % spread`
    device pages of each pool, so its hit lands elsewhere."""
    layout = cache.layout
    window = min(pages, cache.window_pages)
    tokens, written = insert_prefix(cache, pages, seed, token_seed=seed + pages)
    nbytes = prefix_bytes(layout, pages)
    contiguous = contiguous_copy(layout, pages)
    rows, exact, landed_on = [], None, set()
    for r in range(rounds + 1):                     # round 0 warms up
        for how in ("acquire", "load_back"):
            cache.evict(10 ** 6, 10 ** 6 if window else 0)
            cache.drain()
            held = hold_pages(cache, r % spread) if spread else {}
            breakdown.take(0.0)
            t = clock()
            if how == "acquire":
                prefix = cache.acquire(tokens)
            else:
                lb = cache.load_back(cache.match_prefix(tokens))
                assert lb.started and cache.wait(lb), lb.refused
                prefix = lb
            jax.block_until_ready(cache.device_pools)
            took = clock() - t
            parts = breakdown.take(took)
            if exact is None:
                exact = same_bytes(cache, prefix, written)
            landed_on.add(int(prefix.device_pages[0]))
            cache.unlock(prefix.lock)
            release_pages(cache, held)
            assert prefix.length == pages * layout.page_size
            ref = contiguous()
            if r:
                rows.append((how, took, ref, parts))
    cache.evict(10 ** 6, 10 ** 6 if window else 0)   # make room for the next prefix
    cache.drain()
    cache.evict_host(10 ** 6, 10 ** 6 if window else 0)
    out = {"config": layout.model.name, "pages": pages, "bytes": nbytes, "exact": bool(exact), "rounds": rounds,
           "page_spread": spread, "first_pages_landed_on": len(landed_on)}
    for how in ("acquire", "load_back"):
        mine = [(t, ref, parts) for h, t, ref, parts in rows if h == how]
        out[how] = {"ms": round(float(np.median([t for t, _, _ in mine])) * 1e3, 3),
                    "contiguous_ms": round(float(np.median([ref for _, ref, _ in mine])) * 1e3, 3),
                    "ratio": round(float(np.median([ref / t for t, ref, _ in mine])), 3),
                    "breakdown_ms": {k: round(float(np.median([p[k] for _, _, p in mine])) * 1e3, 3)
                                     for k in (*Breakdown.STEPS, "other")}}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="deepseek_v4_flash,deepseek_v41_flash",
                    help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--pages", default="1,16,256,4096", help="prefix sizes in kv pages, comma-separated")
    ap.add_argument("--rounds", type=int, default=8, help="rounds for prefixes of more than 16 pages")
    ap.add_argument("--small-rounds", type=int, default=30,
                    help="rounds for prefixes of at most 16 pages (fast, and noisier than the large ones)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prefix's tokens and bytes")
    ap.add_argument("--page-spread", type=int, default=0,
                    help="hold 0..K-1 device pages in turn so the hits land on other pages; warm the cache up first")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, 1 and 4 pages, 2 rounds: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_api.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.configs, args.pages, args.rounds, args.small_rounds = "tiny_v4", "1,4", 2, 2
    args.out = args.out or default_out("bench_api.json", args.smoke)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]), "runs": []}
    print(f"{'config':20} {'pages':>5} {'MB':>8} {'acquire ms':>10} {'ratio':>6} {'load+wait ms':>12} {'ratio':>6} "
          f"{'contiguous ms':>13} exact")
    sizes = [int(p) for p in args.pages.split(",")]
    for config in args.configs.split(","):
        cache = make_cache(config, max(sizes), spare=args.page_spread)
        if args.page_spread:
            cache.warmup(1)
        breakdown = Breakdown(cache)
        for pages in sizes:
            r = run(cache, pages, args.small_rounds if pages <= 16 else args.rounds, args.seed, breakdown,
                    args.page_spread)
            result["runs"].append(r)
            print(f"{r['config']:20} {pages:>5} {r['bytes'] / 1e6:>8.1f} {r['acquire']['ms']:>10.3f} "
                  f"{r['acquire']['ratio']:>6.3f} {r['load_back']['ms']:>12.3f} {r['load_back']['ratio']:>6.3f} "
                  f"{r['acquire']['contiguous_ms']:>13.3f} {r['exact']}  | acquire: " +
                  " ".join(f"{k} {v:.3f}" for k, v in r["acquire"]["breakdown_ms"].items()), flush=True)
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
        cache.close()
    if not all(r["exact"] for r in result["runs"]):
        sys.exit("bench_api: restored bytes differ from what was written")


if __name__ == "__main__":
    main()
