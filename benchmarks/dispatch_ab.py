"""When a host hit's programs are called: this tree against an earlier one, in one process.

A whole-block hit of a large prefix starts its block's copy (`copy`) before the tree plans
the load, then calls the load program. On a GPU the copy is a DMA that runs while the
Python between the two calls runs, so the time from `acquire` to the copy's call is
latency that every such hit pays. This times each program call of `acquire` from the
call's start: the Python, not the transfer. It works on any machine: on the CPU a call
may run its program before returning, so only the times up to the first call compare
across machines.

Both trees hold a V4-Flash prefix backed up as one block and load it back, taking turns
each round; the medians of the per-round times are reported per program call, in order
(the programs a whole-block hit calls: per allocator and plan programs, not the fused
programs of pieces).

    python benchmarks/dispatch_ab.py --base pre-redesign --out dispatch_ab.json
    python benchmarks/dispatch_ab.py --smoke --out dispatch_ab.json      # tiny_v4 against HEAD
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import pathlib
import statistics
import sys
import tempfile
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import hicache_jax  # noqa: E402
from bench_api import insert_prefix, make_cache  # noqa: E402
from flags import count, number_list  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from tree_ab import load_base  # noqa: E402

WARM_ROUNDS = 10


def record_calls(package, marks: list) -> None:
    """Every compiled transfer program `package` hands out appends (its name, the time) when called."""
    programs = importlib.import_module(package.__name__ + ".transfer.programs")
    try:
        plans = importlib.import_module(package.__name__ + ".transfer.plan_programs")
    except ModuleNotFoundError:       # older trees kept the plan programs in programs.py
        plans = programs
    for cls in (programs.AllocatorPrograms, plans.PlanPrograms):
        original = cls.compiled

        def compiled(self, *key, _original=original):
            program = _original(self, *key)
            name = "plan" if isinstance(key[0], bool) else str(key[0])

            def call(*args, **kwargs):
                marks.append((name, time.perf_counter()))
                return program(*args, **kwargs)
            return call
        cls.compiled = compiled


def run(trees: dict, config: str, pages: int, rounds: int, marks: list) -> dict:
    caches = {}
    for name, package in trees.items():
        cache = make_cache(config, pages, spare=0, package=package, early_copy_bytes=None)
        caches[name] = (cache, insert_prefix(cache, pages, seed=0)[0])
    times: dict[str, list] = {name: [] for name in caches}
    names = list(caches)
    gc.disable()
    try:
        for r in range(rounds + WARM_ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                cache, tokens = caches[name]
                cache.evict(10 ** 6, 10 ** 6)
                cache.drain()
                jax.block_until_ready(cache.device_pools)
                marks.clear()
                start = time.perf_counter()
                prefix = cache.acquire(tokens)
                returned = time.perf_counter()
                jax.block_until_ready(cache.device_pools)
                cache.unlock(prefix.lock)
                if r >= WARM_ROUNDS:
                    times[name].append([(n, t - start) for n, t in marks] + [("return", returned - start)])
    finally:
        gc.enable()
    for cache, _ in caches.values():
        cache.close()
    out = {}
    for name, rows in times.items():
        steps = [row[0] for row in rows[0]]
        out[name] = [{"call": step, "ms": round(statistics.median(row[i][1] for row in rows) * 1e3, 4)}
                     for i, step in enumerate(steps)]
    return {"config": config, "pages": pages, "rounds": rounds, "ms_from_acquire": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="git revision to compare with, or a directory holding its "
                                                   "hicache_jax (default: HEAD)")
    ap.add_argument("--configs", default="deepseek_v4_flash", help="comma-separated configs (default: deepseek_v4_flash)")
    ap.add_argument("--pages", default="1,16,256", type=number_list(),
                    help="comma-separated prefix sizes in pages (default: 1,16,256)")
    ap.add_argument("--rounds", type=count, default=50, help="timed rounds per size (default: 50)")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, 1 and 4 pages, 5 rounds (seconds)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/dispatch_ab.json)")
    args = ap.parse_args()
    pages = args.pages
    configs = args.configs.split(",")
    if args.smoke:
        configs, pages, args.rounds = ["tiny_v4"], [1, 4], 5
    marks: list = []
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(args.base, pathlib.Path(tmp))
        record_calls(base, marks)
        record_calls(hicache_jax, marks)
        runs = [run({"base": base, "this": hicache_jax}, c, p, args.rounds, marks) for c in configs for p in pages]
    for r in runs:
        print(json.dumps(r), file=sys.stderr)
    out = pathlib.Path(args.out) if args.out else default_out("dispatch_ab.json", args.smoke)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "base": args.base,
                               "device": str(jax.devices()[0]), "runs": runs}, indent=1))
    print(json.dumps({"out": str(out), "runs": len(runs)}))


if __name__ == "__main__":
    main()
