"""Start-up cost of the pinned host tier: seconds per GiB of each way to build a zero buffer.

    python benchmarks/bench_host_tier.py --out DIR                  # 4 and 16 GiB, 3 rounds
    python benchmarks/bench_host_tier.py --sizes-gib 2 --out DIR    # one size
    python benchmarks/bench_host_tier.py --smoke --out DIR          # seconds, on the CPU

Writes DIR/host_tier.json. Each measurement runs in a fresh process: XLA's pinned
allocator keeps the memory of freed arrays for reuse, so only a process's first pinned
allocation pays for pinning, as a server's start does. Per size, strategies alternate
within each round (the order rotates), and a round stops early rather than run past
`--time-limit-s` (the JSON says how many rounds each cell got).

Strategies (one `[rows, row_elems]` bf16 buffer, rows of `--row-kib`, in pinned host memory):
  numpy_zeros    `jax.device_put(np.zeros(...))`: what the host tier does
  numpy_empty    the same from `np.empty` (contents undefined: not checked for zeros)
  compiled_rows  one program moves a device zero row to host per row, as the rows of a
                 scan whose output lives in pinned host memory (no host array is read)
  jit_zeros      `jnp.zeros` jitted with a pinned-host output (XLA may build it on the
                 device first: skipped when its device temporaries exceed --device-temp-cap-gib)
  jit_chunks     a fori_loop writing 256 MiB device zero chunks into a host buffer that
                 starts as `device_put(jnp.zeros(...), host)` (same cap)
  engine         (first size only) a V4-Flash `TransferEngine` whose host tier (half kv,
                 half SWA rows) has the size: seconds to the end of the constructor (which
                 pins the tier's memory), to a first device-only step (device pools made,
                 one jit on them), and three backups of 16 kv pages after it (each a new
                 pinned block: the first shows whether blocks reuse the pinned memory).

Each record: compile_s (programs built), dispatch_s (the call returned), total_s (buffer
ready, compile included), s_per_gib = total_s / GiB, the process's RSS growth (pinned
memory is resident; XLA's allocator may pin more than asked), peak device memory where
the backend reports it, a warm rebuild in the same process (`--warm-max-gib`: memory
already pinned, so it is the fill alone), and zero checks of sampled rows (first, last,
and random ones), read back through a device copy.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
STRATEGIES = ("numpy_zeros", "numpy_empty", "compiled_rows", "jit_zeros", "jit_chunks")
ENGINE_STRATEGIES = ("engine",)
PROMISES_ZEROS = {"numpy_zeros", "compiled_rows", "jit_zeros", "jit_chunks", *ENGINE_STRATEGIES}
CHUNK_BYTES = 256 << 20
SAMPLE_ROWS = 8


# -- child: one measurement in a fresh process -----------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_device_bytes(device) -> int | None:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return None if not stats else stats.get("peak_bytes_in_use")


class Build:
    """One strategy's buffer: `compile()` (may decline), then `run()`; times kept."""

    def __init__(self, strategy, shape, dtype, device, temp_cap_bytes):
        import jax
        import jax.numpy as jnp
        import numpy as np

        from hicache_jax.pools import HOST_MEMORY
        self.jax, self.jnp, self.np = jax, jnp, np
        self.strategy, self.shape, self.dtype, self.device = strategy, shape, dtype, device
        self.host = jax.sharding.make_single_device_sharding(device, memory_kind=HOST_MEMORY)
        self.temp_cap = temp_cap_bytes
        self.program, self.args, self.info = None, (), {}

    def compile(self) -> bool:
        jax, jnp, np = self.jax, self.jnp, self.np
        shape, dtype = self.shape, self.dtype
        if self.strategy not in ("compiled_rows", "jit_zeros", "jit_chunks"):
            return True
        if self.strategy == "compiled_rows":
            def fill(row):    # one row per step, no unroll: an unrolled scan reshapes host values
                _, out = jax.lax.scan(lambda c, _: (c, jax.device_put(row, jax.memory.Space.Host)), None,
                                      length=shape[0])
                return out
            row = jax.ShapeDtypeStruct((shape[1],), np.dtype(dtype), sharding=jax.sharding.make_single_device_sharding(
                self.device))
            traced = jax.jit(fill, out_shardings=self.host).trace(row)
            self.args = (jax.device_put(np.zeros(shape[1], dtype), self.device),)
        elif self.strategy == "jit_zeros":
            traced = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=self.host).trace()
        else:
            rows = shape[0]
            c = max(1, min(rows, CHUNK_BYTES // (shape[1] * np.dtype(dtype).itemsize)))
            steps = -(-rows // c)

            def chunks(chunk):
                buf = jax.device_put(jnp.zeros(shape, dtype), jax.memory.Space.Host)

                def body(i, buf):  # the last chunk overlaps the one before when c does not divide rows
                    start = jnp.minimum(i * c, rows - c)
                    return jax.lax.dynamic_update_slice_in_dim(buf, jax.device_put(chunk, jax.memory.Space.Host),
                                                               start, 0)
                return jax.lax.fori_loop(0, steps, body, buf)

            chunk = jax.ShapeDtypeStruct((c, shape[1]), np.dtype(dtype),
                                         sharding=jax.sharding.make_single_device_sharding(self.device))
            traced = jax.jit(chunks, out_shardings=self.host).trace(chunk)
            self.args = (jax.device_put(np.zeros((c, shape[1]), dtype), self.device),)
        from hicache_jax.transfer import host_compute_violations
        self.info["host_compute"] = host_compute_violations(traced.jaxpr)
        self.program = traced.lower().compile()
        temp = self.program.memory_analysis().temp_size_in_bytes
        self.info["device_temp_bytes"] = temp
        if temp > self.temp_cap:
            self.info["skipped"] = f"device temporaries {temp / 2**30:.2f} GiB > cap {self.temp_cap / 2**30:.2f} GiB"
            return False
        return True

    def run(self):
        jax, np = self.jax, self.np
        if self.strategy == "numpy_zeros":
            return jax.device_put(np.zeros(self.shape, self.dtype), self.host)
        if self.strategy == "numpy_empty":
            return jax.device_put(np.empty(self.shape, self.dtype), self.host)
        return self.program(*self.args)


def sampled_rows_zero(jax, np, buf, rows, seed=0) -> bool:
    """Read back first, last and random rows through a device copy (no compute on host memory)."""
    read = jax.jit(lambda h, i: jax.device_put(jax.lax.dynamic_slice_in_dim(h, i, 1, 0), jax.memory.Space.Device))
    picks = sorted({0, rows - 1, *np.random.default_rng(seed).integers(0, rows, SAMPLE_ROWS - 2).tolist()})
    return all(not np.asarray(read(buf, np.int32(i))).view(np.uint8).any() for i in picks)


def child_buffer(strategy, gib, row_kib, temp_cap_gib, warm) -> dict:
    import jax
    import numpy as np

    import hicache_jax.pools  # noqa: F401  (imports stay outside the timed region)
    import hicache_jax.transfer  # noqa: F401
    device = jax.devices()[0]
    dtype = jax.numpy.dtype("bfloat16")
    row_elems = row_kib * 1024 // dtype.itemsize
    rows = max(1, int(gib * 2**30) // (row_kib * 1024))
    out = {"strategy": strategy, "gib": rows * row_kib * 1024 / 2**30, "rows": rows, "row_bytes": row_kib * 1024}
    jax.block_until_ready(jax.device_put(np.zeros(8, np.float32), device))   # backend started
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    build = Build(strategy, (rows, row_elems), dtype, device, int(temp_cap_gib * 2**30))
    ok = build.compile()
    t1 = time.perf_counter()
    out.update(build.info, compile_s=t1 - t0)
    if not ok:
        return out
    buf = build.run()
    t2 = time.perf_counter()
    buf.block_until_ready()
    t3 = time.perf_counter()
    out.update(dispatch_s=t2 - t0, total_s=t3 - t0, s_per_gib=(t3 - t0) / out["gib"], rss_growth_gib=(
        rss_bytes() - rss0) / 2**30, peak_device_bytes=peak_device_bytes(device),
        memory_kind=buf.sharding.memory_kind)
    if strategy in PROMISES_ZEROS:
        out["zeros_ok"] = sampled_rows_zero(jax, np, buf, rows)
    if warm:
        buf.delete()
        del buf
        gc.collect()
        t4 = time.perf_counter()
        again = build.run()
        again.block_until_ready()
        out["warm_s"] = time.perf_counter() - t4
        out["warm_s_per_gib"] = out["warm_s"] / out["gib"]
    return out


def child_engine(strategy, gib) -> dict:
    """Start-up of a V4-Flash engine whose host tier is `gib`: constructor, first device-only step, host ready."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import hicache_jax as hc
    from hicache_jax.layout.rows import RowFormat
    from hicache_jax.config import TransferConfig
    from hicache_jax.transfer import TransferEngine
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / "deepseek_v4_flash.json"))
    host_pages = {a: max(1, int(gib * 2**30 / 2) // RowFormat.create(layout, a).row_bytes)
                  for a in ("kv", "swa")}
    jax.block_until_ready(jax.device_put(np.zeros(8, np.float32), jax.devices()[0]))
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    engine = TransferEngine(layout, {"kv": 16, "swa": 4}, host_pages,
                            config=TransferConfig(host_memory_limit_bytes=1 << 50))
    t1 = time.perf_counter()
    pools = engine.init_device_pools()
    step = jax.jit(lambda p: sum(jnp.sum(x[:, :1].astype(jnp.float32)) for x in p.values()))
    float(step(pools))
    t2 = time.perf_counter()
    t3 = time.perf_counter()  # the constructor pinned the tier's memory (prewarm): nothing left to wait for
    # backups after start: each makes a new pinned block, from the memory the constructor pinned
    from hicache_jax.plan import make_plan
    backups, n = [], min(16, host_pages["kv"])
    for i in range(3):
        plan = make_plan(layout, "backup", {"kv": (np.arange(n), (np.arange(n) + n * i) % host_pages["kv"])})
        tb = time.perf_counter()
        _, handle = engine.start(plan, pools)
        handle.wait()
        backups.append(time.perf_counter() - tb)
    nbytes = engine.host.nbytes
    return {"strategy": strategy, "gib": nbytes / 2**30, "host_pages": host_pages, "constructor_s": t1 - t0,
            "first_device_step_s": t2 - t0, "total_s": t3 - t0, "s_per_gib": (t3 - t0) / (nbytes / 2**30),
            "rss_growth_gib": (rss_bytes() - rss0) / 2**30, "backup_pages": n, "backup_ms": [1e3 * b for b in backups]}


# -- parent: schedule children, summarise ------------------------------------------------------
def run_child(args, strategy, gib) -> dict:
    cmd = [sys.executable, __file__, "--child", strategy, "--gib", repr(gib), "--row-kib", str(args.row_kib),
           "--device-temp-cap-gib", repr(args.device_temp_cap_gib)]
    if gib <= args.warm_max_gib:
        cmd.append("--warm")
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(60.0, args.time_limit_s))
    wall = time.perf_counter() - t
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"strategy": strategy, "gib": gib, "error": (r.stderr or r.stdout)[-1500:], "process_s": wall}
    rec = json.loads(lines[-1])
    rec["process_s"] = wall
    return rec


def rotated(items: list, k: int) -> list:
    k %= max(1, len(items))
    return items[k:] + items[:k]


KEYS = ("warm_s_per_gib", "first_device_step_s", "constructor_s", "dispatch_s", "rss_growth_gib")


def summarise(runs) -> dict:
    out = {}
    for rec in runs:
        if "total_s" not in rec:
            continue
        cell = out.setdefault(f"{rec['requested_gib']:g}", {}).setdefault(rec["strategy"], {"rounds": 0})
        cell["rounds"] += 1
        cell.setdefault("_t", []).append(rec["total_s"])
        cell.setdefault("_g", []).append(rec["gib"])
        for key in KEYS:
            if rec.get(key) is not None:
                cell.setdefault("_" + key, []).append(rec[key])
        cell["zeros_ok"] = cell.get("zeros_ok", True) and rec.get("zeros_ok", True)
    for size in out.values():
        for cell in size.values():
            cell["median_total_s"] = statistics.median(cell.pop("_t"))
            cell["s_per_gib"] = cell["median_total_s"] / statistics.median(cell.pop("_g"))
            for key in KEYS:
                if "_" + key in cell:
                    cell["median_" + key] = statistics.median(cell.pop("_" + key))
        ref = size.get("numpy_zeros", {}).get("s_per_gib")
        for cell in size.values():
            if ref:
                cell["vs_numpy_zeros"] = cell["s_per_gib"] / ref
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="directory for host_tier.json (default: benchmarks/results/, or .../smoke/ with --smoke)")
    p.add_argument("--sizes-gib", type=float, nargs="+", default=[4, 16], help="host tier sizes to build, GiB")
    p.add_argument("--reps", type=int, default=3, help="rounds over every size and strategy (a fresh process each)")
    p.add_argument("--row-kib", type=int, default=1024, help="bytes of one host row (a V4-Flash kv page is ~1 MB)")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES + ENGINE_STRATEGIES),
                   choices=STRATEGIES + ENGINE_STRATEGIES, help="ways to build and fill the pinned buffer")
    p.add_argument("--device-temp-cap-gib", type=float, default=20.0,
                   help="skip a strategy whose device temporaries would exceed this")
    p.add_argument("--warm-max-gib", type=float, default=4.0, help="rebuild in the same process up to this size")
    p.add_argument("--time-limit-s", type=float, default=170.0, help="start no measurement after this")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round (CPU, seconds)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--gib", type=float, help=argparse.SUPPRESS)
    p.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        rec = (child_engine(args.child, args.gib) if args.child in ENGINE_STRATEGIES
               else child_buffer(args.child, args.gib, args.row_kib, args.device_temp_cap_gib, args.warm))
        print(json.dumps(rec))
        return
    if args.smoke:
        args.sizes_gib, args.reps, args.row_kib = [0.02], 1, 64
    args.out = args.out or default_out("", args.smoke)
    import jax
    started = time.perf_counter()
    runs, stopped = [], None
    sizes = sorted(args.sizes_gib)
    plan = [(rep, gib, strategy) for rep in range(args.reps) for gib in sizes
            for strategy in rotated([s for s in args.strategies if s in STRATEGIES or gib == sizes[0]], rep)]
    for rep, gib, strategy in plan:
        done = [r["process_s"] for r in runs if r["requested_gib"] == gib and r["strategy"] == strategy]
        guess = max(done) if done else 5.0 + 1.5 * gib
        if time.perf_counter() - started + guess > args.time_limit_s:
            stopped = f"round {rep + 1}: time limit reached before {strategy} at {gib:g} GiB"
            break
        rec = run_child(args, strategy, gib)
        rec["requested_gib"], rec["round"] = gib, rep + 1
        runs.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "error"}), flush=True)
        if "error" in rec:
            print(rec["error"], file=sys.stderr, flush=True)
    result = {
        "benchmark": "host_tier", "date": datetime.date.today().isoformat(), "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind), "platform": jax.devices()[0].platform,
        "host": platform.node(), "cpus": os.cpu_count(),
        "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB": os.environ.get("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"),
        "args": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()
                 if k not in ("child", "gib", "warm")},
        "stopped": stopped, "wall_s": time.perf_counter() - started, "summary": summarise(runs), "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_tier.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
