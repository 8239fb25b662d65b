"""Pack / unpack kernel benchmark: Mosaic GPU beside Triton and XLA (the jnp reference), one run.

    python benchmarks/bench_kernels.py --out DIR            # GPU: V4-Flash kv and SWA batches
    python benchmarks/bench_kernels.py --smoke --out DIR    # CPU: tiny shapes, interpreted kernels

Shapes: the V4-Flash kv allocator's pools (c4 + c4_indexer + c128, 62 pool-layers, 4096
device pages: the c4 pool has more than 2^31 elements) and its SWA allocator's pools
(swa + 2 state pools, 512 device pages), random pages. Pack = `gather_pages` (a new
staging array), unpack = `scatter_pages` into donated pools (in place). GB/s count bytes
read + written (2 x the pages' bytes). Every row is checked bit-exact against the
reference on the device. Mosaic GPU is also run at other block sizes, ring depths, grid
sizes and lags (`pallas_kernels.mosaic_gpu.plan`). Writes `kernels.json` to DIR.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hicache_jax as hc  # noqa: E402
import pallas_kernels as pk  # noqa: E402
from pallas_kernels import backends, mosaic_gpu  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from transfer_common import env_info, median_s  # noqa: E402

# (label, block_bytes, mosaic knobs): the default first
MOSAIC_VARIANTS = [("default", None, {}), ("block32k", 32768, {}),
                   ("lag0", None, {"lag": 0}), ("ctas1x", None, {"ctas": mosaic_gpu.sm_count()})]


def pools_of(cfg_path: str, allocator: str, pages: int, smoke: bool):
    layout = hc.build_layout(hc.load_model_config(cfg_path))
    specs = layout.moving_with(allocator)
    key = jax.random.key(7)
    return [jax.random.bits(jax.random.fold_in(key, i), (s.num_layers, pages, *s.page_shape), jnp.uint8)
            for i, s in enumerate(specs)], sum(s.num_layers * s.page_bytes for s in specs)


def impls_to_run(smoke: bool):
    """(label, impl, block_bytes, knobs) rows: Mosaic variants, Triton at two block sizes, XLA."""
    if smoke:
        return [("mosaic_gpu", "mosaic_gpu_interpret", None, {}), ("triton", "triton_interpret", None, {}),
                ("xla", "reference", None, {})]
    rows = [(f"mosaic_gpu/{label}", "mosaic_gpu", bb, knobs) for label, bb, knobs in MOSAIC_VARIANTS]
    return rows + [("triton/block4k", "triton", 4096, {}), ("xla", "reference", None, {})]


def kernel_fns(sources, impl: str, block_bytes, knobs: dict):
    """(gather(sources, idx), scatter(sources, rows, idx)) jitted; scatter donates the sources."""
    if not knobs:
        g = lambda s, i: pk.gather_pages(s, i, impl=impl, block_bytes=block_bytes, align_bytes=512)
        sc = lambda s, x, i: pk.scatter_pages(s, x, i, impl=impl, block_bytes=block_bytes, align_bytes=512)
        return jax.jit(g), jax.jit(sc, donate_argnums=0)
    layout, _ = backends.describe(sources, "mosaic_gpu", block_bytes, 512)
    flat = lambda s: [backends.flat(x) for x in s]
    g = lambda s, i: mosaic_gpu.gather(layout, flat(s), i, None, False, **knobs)
    sc = lambda s, x, i: [y.reshape(z.shape) for y, z in
                          zip(mosaic_gpu.scatter(layout, flat(s), x, i, False, **knobs), s)]
    return jax.jit(g), jax.jit(sc, donate_argnums=0)


def measure(results: dict, name: str, sources, row_bytes: int, counts, smoke: bool):
    rng = np.random.default_rng(3)
    pages = sources[0].shape[1]
    for n in counts:
        idx = jnp.asarray(rng.permutation(pages)[:n].astype(np.int32))
        want = pk.gather_pages_reference(sources, idx, align_bytes=512)
        data = sum(s.shape[0] * int(np.prod(s.shape[2:])) for s in sources)   # the row's end padding is not compared
        rows = jax.random.bits(jax.random.key(n), want.shape, jnp.uint8)
        want_pools = pk.scatter_pages_reference(sources, rows, idx)
        reps = 1 if smoke else (6 if n <= 256 else 3)
        for label, impl, bb, knobs in impls_to_run(smoke):
            key = f"{name}/n{n}/{label}"
            try:
                g, sc = kernel_fns(sources, impl, bb, knobs)
                got = g(sources, idx)
                exact = bool(jnp.array_equal(got[:, :data], want[:, :data]))
                t_g = median_s(lambda: g(sources, idx).block_until_ready(), reps)
                state = {"s": [x + 0 for x in sources]}
                state["s"] = sc(state["s"], rows, idx)
                exact &= all(bool(jnp.array_equal(a, b)) for a, b in zip(state["s"], want_pools))

                def run():
                    state["s"] = sc(state["s"], rows, idx)
                    jax.block_until_ready(state["s"])
                t_s = median_s(run, reps)
                moved = 2 * n * row_bytes
                results[key] = {"gather_gbps_rw": moved / t_g / 1e9, "scatter_gbps_rw": moved / t_s / 1e9,
                                "gather_us": 1e6 * t_g, "scatter_us": 1e6 * t_s, "exact": exact}
            except Exception:
                results[key] = {"error": traceback.format_exc()[-2500:]}
            print(key, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in results[key].items()}, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run, interpreted kernels")
    ap.add_argument("--out", default=None,
                    help="output folder for kernels.json (default: benchmarks/results/, or .../smoke/ with --smoke)")
    args = ap.parse_args(argv)
    args.out = args.out or str(default_out("", args.smoke))
    t0 = time.perf_counter()
    cfg = lambda n: os.path.join(HERE, "..", "configs", f"{n}.json")  # noqa: E731
    results = {"env": env_info(), "rows": {}}
    if args.smoke:
        cases = [("v4_kv", cfg("tiny_v4"), "kv", 16, [4]), ("v4_swa", cfg("tiny_v4"), "swa", 8, [2])]
    else:
        cases = [("v4_kv", cfg("deepseek_v4_flash"), "kv", 4096, [256, 4096]),
                 ("v4_swa", cfg("deepseek_v4_flash"), "swa", 512, [64, 256])]
    for name, path, allocator, pages, counts in cases:
        sources, row_bytes = pools_of(path, allocator, pages, args.smoke)
        measure(results["rows"], name, sources, row_bytes, counts, args.smoke)
        del sources
    results["total_s"] = time.perf_counter() - t0
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernels.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({"total_s": round(results["total_s"], 1),
                      "all_exact": all(r.get("exact") for r in results["rows"].values())}), flush=True)
    return results


if __name__ == "__main__":
    main()
