"""Layer-wise overlap: can a host hit's load hide under the first model step's compute?

A V4-Flash prefix of `--pages` pages on the host only (kv pages and the trailing window's
SWA page, every pool), and a synthetic step of 43 layers whose compute is calibrated to
take about as long as the load. Measured in one process, rounds interleaved, medians:

    load      `acquire` of the prefix through the public API (pages usable on device)
    compute   the step alone
    serial    `acquire`, then the step: a blocking load-back (time to first token)
    cache     `acquire(deferred=True)` on a cache of that many layer groups, then the step
              lands the prefix itself, `Landing.schedule().before_layer` before each layer
              (the overlapped path of the cache; bytes checked after the rounds)
    whole     the step's jit takes the prefix as one pinned-host array per layer group and
              moves each with `jax.device_put(h, Device)` before that group's layers
    chained   as `whole`, each group's copy ordered after the compute two groups earlier
              (`lax.optimization_barrier`), so the scheduler cannot bunch the copies up front
    slices    the jit takes per-group host *buffers* four times the prefix and slices the
              prefix's rows out (what one host buffer per allocator allows)

`whole`, `chained` and `slices` move synthetic arrays of exactly the prefix's bytes per
group: the mechanisms alone, beside the cache's path. Each is reported as time /
max(load, compute), `load` being the blocking `acquire` of a cache without layer groups
(`load/G`: of the grouped cache, also reported).

    python benchmarks/bench_overlap.py --out overlap.json            # V4-Flash (GPU)
    python benchmarks/bench_overlap.py --smoke --out overlap.json    # tiny_v4, CPU, seconds
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_api  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
import hicache_jax as hc  # noqa: E402

clock = time.perf_counter
_DEVICE, _HOST = jax.memory.Space.Device, jax.memory.Space.Host
EXACT = hc.step_compiler_options()   # every step compiled as a serving loop that lands compiles it


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = clock()
        jax.block_until_ready(fn())
        times.append(clock() - t)
    return statistics.median(times) * 1e3


class Step:
    """A synthetic step: per layer, `rounds` [T, H] x [H, H] matmuls; consumes each layer
    group's loaded rows (one element of each feeds the activations, so none is dropped)."""

    def __init__(self, tokens: int, hidden: int, layers: int):
        self.layers = layers
        dev = jax.devices()[0]
        key = jax.random.key(0)
        self.w = jax.device_put(jax.random.normal(key, (hidden, hidden), jnp.bfloat16) / hidden ** 0.5, dev)
        self.x = jax.device_put(jax.random.normal(jax.random.key(1), (tokens, hidden), jnp.bfloat16), dev)
        self.rounds = 1

    def layer(self, x):
        for _ in range(self.rounds):
            x = jnp.tanh(x @ self.w)
        return x

    @staticmethod
    def use(x, rows):
        return x + rows.reshape(-1)[:1].astype(jnp.float32).sum().astype(x.dtype) * 0

    def groups_of(self, groups: int) -> list[range]:
        bounds = np.linspace(0, self.layers, groups + 1).round().astype(int)
        return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def with_landing(self, pool: str, lead: int = 1):
        """The step landing a deferred load: before each layer its group, then one element
        of that layer's slot of `pool` (a pool with a slot per layer) feeds the activations."""
        def step(x, pools, landing):
            schedule = landing.schedule(lead)
            for layer in range(self.layers):
                pools, x = schedule.before_layer(layer, pools, x)
                x = self.use(x, pools[pool][layer, :1])
                x = self.layer(x)
            return x, schedule.finish(pools)
        return jax.jit(step, donate_argnums=1, compiler_options=EXACT)

    def plain(self):
        def step(x):
            for _ in range(self.layers):
                x = self.layer(x)
            return x
        return jax.jit(step, compiler_options=EXACT)

    def with_loads(self, groups: int, how: str, rows_per_group: int = 0):
        spans = self.groups_of(groups)

        def step(x, hosts, start):
            moved = [None] * groups
            lead = 1                                  # groups whose copy may run ahead of their use
            for g in range(groups):
                if how == "slices":
                    moved[g] = jax.device_put(jax.lax.dynamic_slice_in_dim(hosts[g], start[0], rows_per_group, 0), _DEVICE)
                elif how == "whole" or g <= lead:
                    moved[g] = jax.device_put(hosts[g], _DEVICE)
            for g, span in enumerate(spans):
                x = self.use(x, moved[g])
                for _ in span:
                    x = self.layer(x)
                nxt = g + lead + 1
                if how == "chained" and nxt < groups:
                    x, h = jax.lax.optimization_barrier((x, hosts[nxt]))
                    moved[nxt] = jax.device_put(h, _DEVICE)
            return x
        return jax.jit(step, compiler_options=EXACT)


def group_rows(cache, pages: int, groups: int, spare: int = 1) -> list[jax.Array]:
    """Pinned-host arrays holding, per layer group, that group's share of the prefix's bytes
    (`spare` times as many rows)."""
    layout = cache.layout
    rows = pages + min(pages, cache.window_pages)
    total, layers = bench_api.prefix_bytes(layout, pages), max(p.num_layers for p in layout.byte_pools)
    bounds = np.linspace(0, layers, groups + 1).round().astype(int)
    host = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="pinned_host")
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        row_elems = max(1, -(-total * int(b - a) // (layers * rows * 2)))   # u16 elements per row
        out.append(jax.device_put(np.ones((rows * spare, row_elems), np.uint16), host))
    return out


def prefix_cache(args, groups: int):
    """A cache holding the prefix on the host only, its tokens, and the bytes written."""
    cache = bench_api.make_cache(args.config, args.pages, groups)
    tokens, written = bench_api.insert_prefix(cache, args.pages, args.seed)
    return cache, tokens, written


def evicted(cache):
    """The prefix on the host only (a load that a step landed completes at the first drain)."""
    cache.drain()
    cache.evict(10 ** 6, 10 ** 6 if cache.window_pages else 0)
    cache.drain()


def run(args) -> dict:
    cache, tokens, _ = prefix_cache(args, 1)
    layout = cache.layout
    pages, window = args.pages, min(args.pages, cache.window_pages)
    layers = max(p.num_layers for p in layout.byte_pools)
    step = Step(args.tokens, args.hidden, layers)
    every = next(p.name for p in layout.byte_pools if p.num_layers == layers)   # a pool with a slot per layer

    def acquire(c=cache):
        evicted(c)
        t = clock()
        prefix = c.acquire(tokens)
        jax.block_until_ready(c.device_pools)
        took = clock() - t
        c.unlock(prefix.lock)
        assert prefix.host_tokens == pages * layout.page_size, prefix
        return took

    def deferred(c, fn, check=None):
        evicted(c)
        t = clock()
        prefix = c.acquire(tokens, deferred=True)
        x, pools = fn(step.x, c.device_pools, prefix.landing)
        jax.block_until_ready(x)
        took = clock() - t
        c.set_device_pools(pools, landed=prefix.landing)
        if check is not None:
            check(c, prefix)
        c.unlock(prefix.lock)
        assert prefix.host_tokens == pages * layout.page_size and prefix.landing is not None, prefix
        return took

    def acquire_then_step(fn):
        evicted(cache)
        t = clock()
        prefix = cache.acquire(tokens)
        jax.block_until_ready(fn(step.x))
        took = clock() - t
        cache.unlock(prefix.lock)
        return took

    load_ms = statistics.median([acquire() for _ in range(args.reps + 1)][1:]) * 1e3
    plain = step.plain()
    while True:                                     # calibrate: compute about as long as the load
        plain = step.plain()
        compute_ms = median_ms(lambda: plain(step.x), 3)
        if compute_ms >= load_ms or step.rounds >= 256:
            break
        step.rounds = max(step.rounds + 1, int(step.rounds * load_ms / compute_ms))
    result = {"config": layout.model.name, "pages": pages, "bytes": bench_api.prefix_bytes(layout, pages),
              "layers": layers, "matmuls_per_layer": step.rounds}
    variants, grouped = {}, {}
    start = np.array([pages + window], np.int32)      # the slices start one prefix in
    landed = {lead: step.with_landing(every, lead) for lead in args.leads}
    exact = {}
    for groups in args.groups:
        c, _, written = prefix_cache(args, groups)
        check = lambda c, prefix, g=groups, w=written: exact.__setitem__(g, bench_api.same_bytes(c, prefix, w))
        grouped[groups] = (c, check)
        for fn in landed.values():                  # compile the step for this landing
            deferred(c, fn)
        acquire(c)                                  # and the grouped cache's blocking load
        whole = group_rows(cache, pages, groups)
        spare = group_rows(cache, pages, groups, spare=4)
        rows = int(whole[0].shape[0])
        fns = {how: step.with_loads(groups, how, rows) for how in ("whole", "chained", "slices")}
        variants[groups] = {"whole": (lambda f=fns["whole"], h=whole: f(step.x, h, start)),
                            "chained": (lambda f=fns["chained"], h=whole: f(step.x, h, start)),
                            "slices": (lambda f=fns["slices"], h=spare: f(step.x, h, start))}
    for fn in (f for v in variants.values() for f in v.values()):
        jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {}
    for _ in range(args.reps):                      # interleaved rounds
        samples.setdefault("load", []).append(acquire() * 1e3)
        samples.setdefault("compute", []).append(median_ms(lambda: plain(step.x), 1))
        samples.setdefault("serial", []).append(acquire_then_step(plain) * 1e3)
        for groups, fns in variants.items():
            c, _ = grouped[groups]
            for lead, fn in landed.items():
                samples.setdefault(f"cache/{groups}" + (f"/lead{lead}" if lead != 1 else ""), []).append(
                    deferred(c, fn) * 1e3)
            samples.setdefault(f"load/{groups}", []).append(acquire(c) * 1e3)
            for how, fn in fns.items():
                samples.setdefault(f"{how}/{groups}", []).append(median_ms(fn, 1))
    for groups, (c, check) in grouped.items():   # the landed bytes are the prefix's, on every pool
        deferred(c, landed[args.leads[0]], check)
        c.close()
    med = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    floor = max(med["load"], med["compute"])
    result["ms"] = med
    result["vs_max_load_compute"] = {k: round(v / floor, 3) for k, v in med.items()
                                     if k not in ("load", "compute") and not k.startswith("load/")}
    result["byte_exact"] = exact
    cache.close()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="deepseek_v4_flash", help="model config (configs/NAME.json): the pools")
    ap.add_argument("--pages", type=int, default=256, help="kv pages of the host hit that is loaded")
    ap.add_argument("--groups", default="43,11", help="layer groups, comma-separated (one run each)")
    ap.add_argument("--leads", default="1", help="groups a landing's copies run ahead (Landing.schedule), comma-separated")
    ap.add_argument("--tokens", type=int, default=2048, help="rows of each layer's matmuls")
    ap.add_argument("--hidden", type=int, default=4096, help="width of each layer's matmuls")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions of each variant (medians reported)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the prefix's bytes")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, 2 pages, small matmuls: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_overlap.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    args.out = args.out or default_out("bench_overlap.json", args.smoke)
    if args.smoke:
        args.config, args.pages, args.groups, args.tokens, args.hidden, args.reps = "tiny_v4", 2, "2", 16, 64, 2
    args.groups = [int(g) for g in str(args.groups).split(",")]
    args.leads = [int(g) for g in str(args.leads).split(",")]
    if any(g < 1 for g in args.groups) or args.pages < 1 or args.reps < 1:
        sys.exit(f"--groups, --pages and --reps must be >= 1; got {args.groups}, {args.pages}, {args.reps}")
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]), **run(args)}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("config", "pages", "matmuls_per_layer", "ms", "vs_max_load_compute",
                                             "byte_exact")}))
    if not all(result["byte_exact"].values()):
        sys.exit("a deferred load landed wrong bytes")


if __name__ == "__main__":
    main()
