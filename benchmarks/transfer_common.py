"""Shared pieces of the transfer benchmarks: the run record, timing, random pools, and the
paired engine-vs-contiguous measurement every ratio in BENCHMARKS.md comes from."""
from __future__ import annotations

import gc
import json
import os
import time
import traceback

import numpy as np

import jax
import jax.numpy as jnp

from hicache_jax.plan import make_plan
from hicache_jax.transfer import TransferEngine


class Bench:
    """Results of one run, saved after every section; sections stop starting past the budget."""

    def __init__(self, out: str, smoke: bool, budget_s: float):
        self.out, self.smoke = out, smoke
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.results: dict = {"env": env_info(), "sweeps": {}, "errors": {}}
        self.block_bytes = None   # the kernels' default
        self.kernels = "auto"

    def section(self, name, fn, *args):
        left = self.budget_s - (time.perf_counter() - self.t0)
        if left < 30:
            self.results["errors"][name] = f"skipped: {left:.0f} s of the time budget left"
            return
        print(f"== {name} ({time.perf_counter() - self.t0:.0f} s)", flush=True)
        try:
            fn(self, *args)
        except Exception:
            self.results["errors"][name] = traceback.format_exc()[-3000:]
            print(self.results["errors"][name], flush=True)
        gc.collect()
        self.save()

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "transfer.json"), "w") as f:
            json.dump(self.results, f, indent=1, default=str)

    def reps(self, pages):
        if self.smoke:
            return 1
        return 20 if pages <= 16 else (8 if pages <= 256 else 5)


def env_info() -> dict:
    dev = jax.devices()[0]
    return {"jax": jax.__version__, "backend": jax.default_backend(), "device": getattr(dev, "device_kind", str(dev)),
            "num_devices": jax.device_count(), "date": time.strftime("%Y-%m-%d"),
            "memories": [m.kind for m in dev.addressable_memories()]}


def median_s(fn, reps: int, warm: int = 1) -> float:
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def random_pools(engine: TransferEngine, seed: int) -> dict:
    pools = engine.init_device_pools()
    out = {}
    for i, (name, x) in enumerate(pools.items()):
        bits = jnp.uint8 if x.dtype.itemsize == 1 else jnp.uint16  # random bytes, whatever the dtype
        fill = jax.jit(lambda k, s=x.shape, d=x.dtype, b=bits: jax.lax.bitcast_convert_type(jax.random.bits(k, s, b), d),
                       out_shardings=x.sharding)
        out[name] = fill(jax.random.key(seed + i))
    del pools
    jax.block_until_ready(out)
    return out


def pages_equal(pools: dict, names, a: np.ndarray, b: np.ndarray) -> bool:
    """Pages `a` and `b` hold the same bytes in every pool named (checked on the device)."""
    ok = True
    for n in names:
        x = pools[n]
        bits = jnp.uint8 if x.dtype.itemsize == 1 else jnp.uint16  # compare bits: random bf16 holds NaNs
        same = jax.jit(lambda x, a, b: jnp.all(jax.lax.bitcast_convert_type(x[:, a], bits)
                                               == jax.lax.bitcast_convert_type(x[:, b], bits)))
        ok &= bool(same(x, a, b))
    return ok


class Contiguous:
    """The reference: one `jax.device_put` of a contiguous uint8 array of `shape` to and
    from pinned host, placed like `dev` / `host`."""

    def __init__(self, shape, dev, host):
        self.dev, self.host = dev, host
        self.x = jax.jit(lambda: jnp.ones(shape, jnp.uint8), out_shardings=dev)()
        self.hx = jax.device_put(self.x, host)
        self.hx.block_until_ready()

    def d2h(self):
        jax.device_put(self.x, self.host).block_until_ready()

    def h2d(self):
        jax.device_put(self.hx, self.dev).block_until_ready()


def run_pair(engine, pools, layout, alloc_pages: dict, rng, device_total: dict, host_total: dict, reps: int,
             fragmented: bool = False, reference: Contiguous | None = None):
    """Back up random device pages, load them into other random pages; time both and check bytes.

    With a `reference`, every round times engine backup, contiguous D2H, engine load,
    contiguous H2D back to back, and the ratios are medians of the per-round ratios: drift
    of the machine over the run (clocks, other tenants of the link) hits both sides alike.
    """
    src, dst, host = {}, {}, {}
    for a, n in alloc_pages.items():
        perm = rng.permutation(device_total[a])
        src[a], dst[a] = perm[:n].astype(np.int32), perm[n:2 * n].astype(np.int32)
        if fragmented:
            host[a] = np.sort(rng.choice(host_total[a], n, replace=False)).astype(np.int32)
        else:
            start = int(rng.integers(0, host_total[a] - n + 1))
            host[a] = np.arange(start, start + n, dtype=np.int32)
    backup = make_plan(layout, "backup", {a: (src[a], host[a]) for a in alloc_pages})
    load = make_plan(layout, "load", {a: (dst[a], host[a]) for a in alloc_pages})
    state = {"pools": pools}
    dispatch = []

    def do(plan):
        t = time.perf_counter()
        state["pools"], h = engine.start(plan, state["pools"])
        dispatch.append(time.perf_counter() - t)
        h.wait()

    rounds = []
    for i in range(reps + 1):  # round 0 warms up
        r = [timed(lambda: do(backup)), timed(reference.d2h) if reference else np.nan,
             timed(lambda: do(load)), timed(reference.h2d) if reference else np.nan]
        if i:
            rounds.append(r)
    t = np.array(rounds)
    ok = all(pages_equal(state["pools"], backup.batch(a).pools, src[a], dst[a]) for a in alloc_pages)
    runs = sum(len(backup.batch(a).host_runs) for a in alloc_pages)
    out = dict(nbytes=backup.nbytes(layout), backup_s=float(np.median(t[:, 0])), load_s=float(np.median(t[:, 2])),
               exact=ok, host_runs=runs, dispatch_ms_median=1e3 * float(np.median(dispatch)))
    if reference:
        out.update(d2h_s=float(np.median(t[:, 1])), h2d_s=float(np.median(t[:, 3])),
                   backup_ratio=float(np.median(t[:, 1] / t[:, 0])), load_ratio=float(np.median(t[:, 3] / t[:, 2])))
    return state["pools"], out


def gbps(r: dict) -> dict:
    """GB/s (and ratios, when paired) of a `run_pair` result."""
    out = {"exact": r["exact"], "backup_gbps": r["nbytes"] / r["backup_s"] / 1e9,
           "load_gbps": r["nbytes"] / r["load_s"] / 1e9, "dispatch_ms": r["dispatch_ms_median"]}
    if "d2h_s" in r:
        out.update(contig_d2h_gbps=r["nbytes"] / r["d2h_s"] / 1e9, contig_h2d_gbps=r["nbytes"] / r["h2d_s"] / 1e9,
                   backup_ratio=r["backup_ratio"], load_ratio=r["load_ratio"])
    return out


def per_page(pages: int, row_bytes: int, reps: int, dev, host):
    """sglang-jax's host pool: a list `device_put` of one array per page (packing not counted)."""
    x = [jax.device_put(jnp.full((row_bytes,), i % 251, jnp.uint8), dev) for i in range(pages)]
    hx = jax.device_put(x, [host] * pages)
    jax.block_until_ready(hx)
    d2h = median_s(lambda: jax.block_until_ready(jax.device_put(x, [host] * pages)), reps)
    h2d = median_s(lambda: jax.block_until_ready(jax.device_put(hx, [dev] * pages)), reps)
    return d2h, h2d
