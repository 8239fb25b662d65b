"""A one-page host hit (`acquire` of a one-page prefix, all pools) of this tree against an
earlier revision of itself, in one process, alternating which goes first each round.

Both caches hold the same kind of prefix (random bytes, `bench_api.insert_prefix`) and
evict and reload it every round; the times are medians, and `paired_saving_ms` the median
of the per-round differences (base - this tree), so drift between rounds hits both alike.
`--python-only` replaces both load programs by a call that returns the pools as they are,
which leaves the Python of the hit (the tree, the engine's checks, the bookkeeping).

    python benchmarks/api_ab.py --base 5f3e571 --out api_ab.json                 # GPU: the whole hit
    python benchmarks/api_ab.py --base 5f3e571 --python-only --out api_ab.json   # its Python alone
    python benchmarks/api_ab.py --smoke --out api_ab.json                        # tiny_v4 against HEAD, CPU
"""
from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import hicache_jax  # noqa: E402
from bench_api import insert_prefix, make_cache, same_bytes  # noqa: E402
from tree_ab import load_base  # noqa: E402

clock = time.perf_counter


def without_load_programs(cache) -> None:
    """Plan load programs become calls that return the pools unchanged (a ready token)."""
    token = jnp.zeros((), jnp.int32)
    plans, compiled = cache.engine._plan_programs, cache.engine._plan_programs.compiled
    plans.compiled = lambda backup, runs: compiled(backup, runs) if backup else (lambda pools, *_: (pools, token))


def run(packages: dict, config: str, rounds: int, python_only: bool) -> dict:
    caches = {name: make_cache(config, 4, package=hc) for name, hc in packages.items()}
    prefixes = {}
    for name, cache in caches.items():
        tokens, written = insert_prefix(cache, 1, seed=0)
        cache.evict(10 ** 6, 10 ** 6)
        prefix = cache.acquire(tokens)
        if not same_bytes(cache, prefix, written):
            sys.exit(f"api_ab: {name} restored other bytes than were written")
        cache.unlock(prefix.lock)
        prefixes[name] = tokens
        if python_only:
            without_load_programs(cache)
    times = {name: [] for name in caches}
    gc.disable()                      # a collection lands in one round of one side
    try:
        for r in range(rounds + 20):  # 20 rounds warm up
            for name in (list(caches) if r % 2 else list(caches)[::-1]):
                cache = caches[name]
                cache.evict(10 ** 6, 10 ** 6)
                cache.drain()
                jax.block_until_ready(cache.device_pools)
                t = clock()
                prefix = cache.acquire(prefixes[name])
                jax.block_until_ready(cache.device_pools)
                took = clock() - t
                assert prefix.length == cache.layout.page_size, prefix
                cache.unlock(prefix.lock)
                if r >= 20:
                    times[name].append(took)
    finally:
        gc.enable()
    for cache in caches.values():
        cache.close()
    out = {"config": config, "rounds": rounds, "python_only": python_only,
           "ms": {name: round(statistics.median(v) * 1e3, 4) for name, v in times.items()}}
    out["paired_saving_ms"] = round(statistics.median(b - t for b, t in zip(times["base"], times["this"])) * 1e3, 4)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git revision to compare with, or a directory holding its hicache_jax")
    ap.add_argument("--configs", default="deepseek_v4_flash,deepseek_v41_flash")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--python-only", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4 against HEAD, 20 rounds, Python only: CPU, seconds")
    ap.add_argument("--out", default="api_ab.json")
    args = ap.parse_args()
    if args.smoke:
        args.base, args.configs, args.rounds, args.python_only = "HEAD", "tiny_v4", 20, True
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]),
              "base": args.base, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"base": load_base(args.base, pathlib.Path(tmp)), "this": hicache_jax}
        for config in args.configs.split(","):
            r = run(packages, config, args.rounds, args.python_only)
            result["runs"].append(r)
            print(json.dumps(r), flush=True)
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
