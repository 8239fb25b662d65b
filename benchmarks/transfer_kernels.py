"""Pack / unpack kernel sections of the transfer benchmark: Pallas against XLA, pools with a
layer axis against one array per layer, block sizes; and the kernels against their
references on the device."""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

import hicache_jax as hc
import pallas_kernels as pk
from transfer_common import Bench, median_s


def kernel_section(bench: Bench, cfg_path: str, pages: int, counts, blocks):
    """Pallas vs XLA pack/unpack on the V4 kv pools: layer axis vs one array per layer, block sizes."""
    layout = hc.build_layout(hc.load_model_config(cfg_path))
    specs = layout.moving_with("kv")
    key = jax.random.key(11)
    axis = [jax.random.bits(jax.random.fold_in(key, i), (s.num_layers, pages, *s.page_shape), jnp.uint8)
            for i, s in enumerate(specs)]
    per_layer = [x[l:l + 1] + 0 for x in axis for l in range(x.shape[0])]
    jax.block_until_ready((axis, per_layer))
    row = sum(s.num_layers * s.page_bytes for s in specs)
    impls = ["pallas", "reference"] if jax.default_backend() == "gpu" else ["interpret", "reference"]
    out = {}
    rng = np.random.default_rng(2)
    for n in counts:
        idx = jnp.asarray(rng.permutation(pages)[:n].astype(np.int32))
        for impl in impls:
            for label, srcs in (("layer_axis", axis), ("per_layer", per_layer)):
                for bb in (blocks if impl != "reference" and label == "layer_axis" else [bench.block_bytes]):
                    if impl == "reference" and bb != bench.block_bytes:
                        continue
                    g = jax.jit(lambda s, i, bb=bb, impl=impl: pk.gather_pages(s, i, impl=impl, block_bytes=bb))
                    st = g(srcs, idx)
                    t_g = median_s(lambda: g(srcs, idx).block_until_ready(), bench.reps(n))
                    sc = jax.jit(lambda s, x, i, bb=bb, impl=impl: pk.scatter_pages(s, x, i, impl=impl, block_bytes=bb),
                                 donate_argnums=0)
                    state = {"s": [x + 0 for x in srcs]}

                    def run():
                        state["s"] = sc(state["s"], st, idx)
                        jax.block_until_ready(state["s"])
                    t_s = median_s(run, bench.reps(n))
                    ok = bool(jnp.all(g(state["s"], idx) == st))
                    k = f"{impl}/{label}/block{bb}/n{n}"
                    out[k] = {"gather_gbps_rw": 2 * n * row / t_g / 1e9, "scatter_gbps_rw": 2 * n * row / t_s / 1e9,
                              "gather_us": 1e6 * t_g, "scatter_us": 1e6 * t_s, "exact": ok}
                    print(k, out[k], flush=True)
    bench.results["kernels_v4_kv"] = out
    # pick the block size with the best pack + unpack time at the largest count
    best = None
    for bb in blocks:
        k = f"{impls[0]}/layer_axis/block{bb}/n{counts[-1]}"
        if k in out:
            t = out[k]["gather_us"] + out[k]["scatter_us"]
            if best is None or t < best[0]:
                best = (t, bb)
    if best:
        bench.block_bytes = best[1]
        ref = out.get(f"reference/layer_axis/block{pk.DEFAULT_BLOCK_BYTES}/n{counts[-1]}")
        if ref and ref["gather_us"] + ref["scatter_us"] < best[0]:
            bench.kernels = "reference"  # XLA beat the Pallas kernels here: run the engine on it
    bench.results["block_bytes_chosen"] = bench.block_bytes
    bench.results["engine_kernels"] = bench.kernels
    del axis, per_layer


def kernel_correctness(bench: Bench):
    """Pallas kernels equal their references on the device, on random inputs with PAD entries."""
    rng = np.random.default_rng(0)
    impl = "pallas" if jax.default_backend() == "gpu" else "interpret"
    srcs = [jnp.asarray(rng.integers(0, 256, (3, 16, 1728), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (2, 16, 37440), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (1, 16, 5, 7), dtype=np.uint8))]
    bf = [jnp.asarray(rng.standard_normal((4, 16, 2, 8, 256, 64)).astype(jnp.bfloat16))]
    res = {}
    for label, s in (("uint8", srcs), ("bf16", bf)):
        idx = np.array([5, -1, 0, 15, 3, 9, -1, 2], np.int32)
        a = pk.gather_pages(s, idx, impl=impl)
        b = pk.gather_pages_reference(s, idx)
        st = jnp.asarray(rng.integers(0, 256, a.shape, dtype=np.uint8)).view(a.dtype) if a.dtype == jnp.uint8 else \
            jnp.asarray(rng.standard_normal(a.shape).astype(a.dtype))
        x = pk.scatter_pages([t + 0 for t in s], st, idx, impl=impl)
        y = pk.scatter_pages_reference(s, st, idx)
        res[label] = {"gather": bool(jnp.all(a == b)), "scatter": all(bool(jnp.all(p == q)) for p, q in zip(x, y))}
    bench.results["kernel_correctness"] = res
    print("kernel correctness:", res, flush=True)
