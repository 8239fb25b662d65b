"""A host hit (`acquire` of a prefix that lives on the host only, all pools) of this tree
against an earlier revision of itself, or under other early-copy thresholds, in one
process, taking turns in a rotating order each round.

Every variant holds the same kind of prefix (random bytes, `bench_api.insert_prefix`) in
a cache of its own and evicts and reloads it every round; each round also times a
contiguous pinned-host -> device `device_put` of the same bytes (the raw link, measured
beside them). The times are medians, and `paired_saving_ms[v]` the median of the
per-round differences (first variant - v), so drift between rounds hits all alike.
`--python-only` replaces every load program by a call that returns the pools as they are,
which leaves the Python of the hit (the tree, the engine's checks, the bookkeeping).
`--page-spread K` holds `r % K` device pages of each pool in round `r` (after `warmup(1)`),
so the hits land on other pages, as a serving loop's do.

    python benchmarks/api_ab.py --base 5f3e571 --out api_ab.json                 # GPU: the whole hit
    python benchmarks/api_ab.py --base 5f3e571 --python-only --out api_ab.json   # its Python alone
    python benchmarks/api_ab.py --base none --early-copy-bytes 12582912,4194304 --pages 1,16 \\
        --page-spread 64 --out early.json                                       # thresholds, this tree
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
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from bench_api import contiguous_copy, hold_pages, insert_prefix, make_cache, release_pages, same_bytes  # noqa: E402
from tree_ab import load_base  # noqa: E402

clock = time.perf_counter
WARM_ROUNDS = 20


def without_load_programs(cache) -> None:
    """Plan load programs become calls that return the pools unchanged (a ready token)."""
    token = jnp.zeros((), jnp.int32)

    def stand_in(label, program, *args):
        return (args[0], token) if label.startswith("plan:load") else program(*args)
    if not hasattr(cache, "on_program_call"):
        sys.exit("api_ab: --python-only needs revisions whose HiCache has on_program_call")
    cache.on_program_call(stand_in)


def run(variants: dict, config: str, pages: int, rounds: int, python_only: bool, spread: int = 0) -> dict:
    """`variants`: `{name: (package, early_copy_bytes or None)}`."""
    caches = {name: make_cache(config, pages, spare=spread, package=hc, early_copy_bytes=early)
              for name, (hc, early) in variants.items()}
    prefixes = {}
    for name, cache in caches.items():
        if spread:
            cache.warmup(1)
        tokens, written = insert_prefix(cache, pages, seed=0)
        cache.evict(10 ** 6, 10 ** 6)
        prefix = cache.acquire(tokens)
        if not same_bytes(cache, prefix, written):
            sys.exit(f"api_ab: {name} restored other bytes than were written")
        cache.unlock(prefix.lock)
        prefixes[name] = tokens
        if python_only:
            without_load_programs(cache)
    layout = next(iter(caches.values())).layout
    contiguous = contiguous_copy(layout, pages)
    names = list(caches)
    times = {name: [] for name in [*names, "contiguous"]}
    landed_on = {name: set() for name in names}
    gc.disable()                      # a collection lands in one round of one side
    try:
        for r in range(rounds + WARM_ROUNDS):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                cache = caches[name]
                cache.evict(10 ** 6, 10 ** 6)
                cache.drain()
                held = hold_pages(cache, r % spread) if spread else {}
                jax.block_until_ready(cache.device_pools)
                t = clock()
                prefix = cache.acquire(prefixes[name])
                jax.block_until_ready(cache.device_pools)
                took = clock() - t
                assert prefix.length == pages * layout.page_size, prefix
                landed_on[name].add(int(prefix.device_pages[0]))
                cache.unlock(prefix.lock)
                release_pages(cache, held)
                if r >= WARM_ROUNDS:
                    times[name].append(took)
            ref = contiguous()
            if r >= WARM_ROUNDS:
                times["contiguous"].append(ref)
    finally:
        gc.enable()
    for cache in caches.values():
        cache.close()
    first = times[names[0]]
    return {"config": config, "pages": pages, "rounds": rounds, "python_only": python_only, "page_spread": spread,
            "early_copy_bytes": {name: early for name, (_, early) in variants.items()}, "exact": True,
            "first_pages_landed_on": {name: len(v) for name, v in landed_on.items()},
            "ms": {name: round(statistics.median(v) * 1e3, 4) for name, v in times.items()},
            "paired_saving_ms": {name: round(statistics.median(a - b for a, b in zip(first, times[name])) * 1e3, 4)
                                 for name in names[1:]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD",
                    help="git revision to compare with, a directory holding its hicache_jax, or none")
    ap.add_argument("--early-copy-bytes", default="",
                    help="this tree under each of these early-copy thresholds (default: the engine's)")
    ap.add_argument("--configs", default="deepseek_v4_flash,deepseek_v41_flash",
                    help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--pages", default="1", help="prefix sizes in kv pages, comma-separated (one run each)")
    ap.add_argument("--rounds", type=int, default=200, help="rounds per run; every variant hits once per round")
    ap.add_argument("--page-spread", type=int, default=0,
                    help="hold r %% K device pages of each pool in round r, so hits land on other pages (0: off)")
    ap.add_argument("--python-only", action="store_true",
                    help="replace every load program by a no-op: time the Python of a hit alone")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4 against HEAD, 20 rounds, Python only: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/api_ab.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.base, args.configs, args.rounds, args.python_only = "HEAD", "tiny_v4", 20, True
    args.out = args.out or default_out("api_ab.json", args.smoke)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]),
              "base": args.base, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        variants = {} if args.base == "none" else {"base": (load_base(args.base, pathlib.Path(tmp)), None)}
        thresholds = [int(x) for x in args.early_copy_bytes.split(",") if x]
        variants |= {f"early={x}": (hicache_jax, x) for x in thresholds} or {"this": (hicache_jax, None)}
        if len(variants) < 2:
            sys.exit("api_ab: give a base, or at least two early-copy thresholds")
        for config in args.configs.split(","):
            for pages in (int(p) for p in args.pages.split(",")):
                r = run(variants, config, pages, args.rounds, args.python_only, args.page_spread)
                result["runs"].append(r)
                print(json.dumps(r), flush=True)
                pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
