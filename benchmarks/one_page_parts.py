"""A one-page host hit split into the Python around it and the program it runs: each round
times `acquire` of a one-page prefix (all pools) until its pages are usable, then calls the
load program that `acquire` just ran again, alone, with the same blocks and page indices
(`bare`: the runtime's call and the device work, no Python around it), then a contiguous
`device_put` of the same bytes; medians over the rounds, variants taking turns in one
process. Each kernel implementation gets its own cache (default: the automatic choice and
the plain-jnp reference).

`phases_ms` splits the hit at its program call: the Python before it, the call's own host
time (the runtime launching the program), both together (`to_call_return`, timed per round:
a median of sums is not the sum of medians), and the rest until `acquire` returns (the
DMA's tail and the bookkeeping when the load lands); and the bare call into its host time
and the wait for the device.

`call_ms` (the first kernel set's cache) takes the runtime's call apart, host time until
each call returns: the hit's load program, the same program on blocks already on the
device (its scatter kernels alone), the blocks' two copy programs (the copies alone), and a
trivial jitted function (the runtime's floor per call).

    python benchmarks/one_page_parts.py --out parts.json            # V4-Flash and V4.1-Flash (GPU)
    python benchmarks/one_page_parts.py --smoke --out parts.json    # tiny_v4, CPU, seconds
"""
from __future__ import annotations

import argparse
import ast
import json
import pathlib
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
import bench_api  # noqa: E402  (the same cache and prefix as the public-path benchmark)
import hicache_jax as hc  # noqa: E402
from hicache_jax.pools.host_tier import block_rows  # noqa: E402

clock = time.perf_counter


class LastLoad:
    """Records the plan load program a cache runs (`HiCache.on_program_call`), with its
    arguments, to call it again."""

    def __init__(self, cache: hc.HiCache):
        self.cache, self.call, self.called = cache, None, (0.0, 0.0)
        cache.on_program_call(self._record)

    def _record(self, label: str, program, *args):
        if not label.startswith("plan:load"):
            return program(*args)
        runs = ast.literal_eval(label[label.index("["):])       # ((allocator, pages, on device), ...)
        names = [[s.name for s in self.cache.layout.moving_with(a)] for a, *_ in runs]
        self.call = (runs, program, names, args[1], args[2])
        t = clock()
        try:
            return program(*args)
        finally:
            self.called = (t, clock())      # the call's host time, in the hit

    def again(self) -> tuple[float, float]:
        """Call the last load program again on the cache's current pools: (seconds until the
        call returns, seconds until its outputs are ready)."""
        if self.call is None:
            raise RuntimeError("no one-program load recorded: the hit did not move as one plan program")
        _, program, names, blocks, idx = self.call
        pools = self.cache.device_pools
        t = clock()
        new, token = program(tuple(tuple(pools[n] for n in ns) for ns in names), blocks, idx)
        launched = clock() - t
        jax.block_until_ready((new, token))
        took = clock() - t
        for ns, arrays in zip(names, new):
            pools.update(zip(ns, arrays))
        self.cache.set_device_pools(pools)   # the same bytes again: the pages stay what they were
        return launched, took


def call_costs(cache: hc.HiCache, engine, load: LastLoad, rounds: int) -> dict[str, float]:
    """Host time (ms, medians) until each call returns: the one-page load program `load`
    recorded, its scatter alone (the same plan from blocks already on the device), its
    copies alone, and a trivial jit."""
    runs, program, names, blocks, idx = load.call
    scatter = engine.plan_program(False, tuple((a, n, 1) for a, n, _ in runs))
    copies = [engine.program(a, "copy", block_rows(b)) for (a, *_), b in zip(runs, blocks)]
    on_device = jax.block_until_ready(tuple(copy(b) for copy, b in zip(copies, blocks)))
    x = jax.numpy.zeros(4)
    trivial = jax.jit(lambda v: v + 1)
    jax.block_until_ready(trivial(x))
    spent = {"load_program": [], "scatter_only": [], "copies_only": [], "trivial_jit": []}

    def timed(name, fn):
        t = clock()
        out = fn()
        spent[name].append(clock() - t)
        return jax.block_until_ready(out)

    for r in range(rounds + 2):
        for name, rows in (("load_program", blocks), ("scatter_only", on_device)):
            pools = cache.device_pools
            call = program if name == "load_program" else scatter
            new, _ = timed(name, lambda: call(tuple(tuple(pools[n] for n in ns) for ns in names), rows, idx))
            for ns, arrays in zip(names, new):
                pools.update(zip(ns, arrays))
            cache.set_device_pools(pools)     # the same bytes again
        timed("copies_only", lambda: [copy(b) for copy, b in zip(copies, blocks)])
        timed("trivial_jit", lambda: trivial(x))
    return {name: round(statistics.median(v[2:]) * 1e3, 4) for name, v in spent.items()}


def run(config: str, kernels: list[str], rounds: int) -> dict:
    built = {k: bench_api.make_cache_and_engine(config, 4, kernels=k) for k in kernels}
    caches = {k: cache for k, (cache, _) in built.items()}
    loads = {k: LastLoad(c) for k, c in caches.items()}
    prefixes = {k: bench_api.insert_prefix(c, 1, seed=0) for k, c in caches.items()}
    breakdowns = {k: bench_api.Breakdown(c) for k, c in caches.items()}
    layout = next(iter(caches.values())).layout
    dev = jax.devices()[0]
    host_block = jax.device_put(np.zeros(bench_api.prefix_bytes(layout, 1), np.uint8),
                                jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host"))
    on_device = jax.sharding.make_single_device_sharding(dev, memory_kind="device")
    times = {f"{part}_{k}": [] for k in kernels for part in ("acquire", "bare")} | {"contiguous": []}
    parts, phases, exact = {k: [] for k in kernels}, {k: [] for k in kernels}, {}
    for r in range(rounds + 2):                 # two rounds warm up
        for k, cache in caches.items():
            tokens, written = prefixes[k]
            cache.evict(10 ** 6, 10 ** 6)
            cache.drain()
            jax.block_until_ready(cache.device_pools)
            breakdowns[k].take(0.0)
            t = clock()
            prefix = cache.acquire(tokens)
            returned = clock()
            jax.block_until_ready(cache.device_pools)
            took = clock() - t
            c0, c1 = loads[k].called
            split = breakdowns[k].take(took)
            assert prefix.length == layout.page_size, prefix
            exact.setdefault(k, bench_api.same_bytes(cache, prefix, written))
            launched, bare = loads[k].again()
            cache.unlock(prefix.lock)
            if r >= 2:
                times[f"acquire_{k}"].append(took)
                times[f"bare_{k}"].append(bare)
                parts[k].append(split)
                phases[k].append({"before_call": c0 - t, "call": c1 - c0, "to_call_return": c1 - t,
                                  "after_call": returned - c1,
                                  "bare_call": launched, "bare_wait": bare - launched})
        t = clock()
        jax.block_until_ready(jax.device_put(host_block, on_device))
        if r >= 2:
            times["contiguous"].append(clock() - t)
    calls = call_costs(*built[kernels[0]], loads[kernels[0]], rounds)
    for cache in caches.values():
        cache.close()
    ms = lambda xs: round(statistics.median(xs) * 1e3, 4)
    out = {"config": layout.model.name, "rounds": rounds, "exact": exact, "ms": {k: ms(v) for k, v in times.items()}}
    out["breakdown_ms"] = {k: {n: ms([p[n] for p in parts[k]]) for n in parts[k][0]} for k in kernels}
    out["phases_ms"] = {k: {n: ms([p[n] for p in phases[k]]) for n in phases[k][0]} for k in kernels}
    out["call_ms"] = calls
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="deepseek_v4_flash,deepseek_v41_flash",
                    help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--kernels", default="auto,reference", help="engine kernels (TransferEngine kernels=), comma-separated")
    ap.add_argument("--rounds", type=int, default=40, help="one-page hits per config and kernels (medians reported)")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, reference kernels, 3 rounds: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/one_page_parts.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.configs, args.kernels, args.rounds = "tiny_v4", "reference", 3
    args.out = args.out or default_out("one_page_parts.json", args.smoke)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]), "runs": []}
    for config in args.configs.split(","):
        r = run(config, args.kernels.split(","), args.rounds)
        result["runs"].append(r)
        print(json.dumps(r), flush=True)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    if not all(all(r["exact"].values()) for r in result["runs"]):
        sys.exit("one_page_parts: restored bytes differ from what was written")


if __name__ == "__main__":
    main()
