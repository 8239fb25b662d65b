"""Do backups slow decode? Decode-step time with backups in flight vs without, through the
public API, on a layout's real pools (V4-Flash: 43 layers, 7 pools, real page sizes).

The "model" is a synthetic jitted decode step of realistic size. It donates the cache's
device pools and, for each layer, reads the request's pages of every pool layer that
belongs to it (a gather over the request's page table), runs an MLP (`--tokens` x
`--hidden` -> `--ffn` -> `--hidden`, bf16), and writes one new token slot of the
request's last page into each of those pool layers (a decode step appending KV); it
returns the pools and one token id per row, which the loop reads back each step as a
serving loop reads sampled tokens. Every read feeds the activations and every write is
made from them, so XLA can drop none of it.

Scenarios, one round each, in alternating order, in the same process:

    none    `step = model(pools)`, `cache.step()`, read the tokens: no backups.
    backup  the same, but every `--insert-every` steps the loop first allocates and
            inserts a `--prefix-pages` prefix (plus its window's SWA page) whose bytes
            were "prefilled" earlier; write_through queues its backup and `cache.step()`
            dispatches it, so backups are in flight while the next steps run.
    paced   (with `--pace-mib N`) `backup` with `backup_bytes_per_step` = N MiB: each
            `step()` sends at most one N MiB piece more of each batch in flight.
    raw     `none` plus, at the same points, a plain `jax.device_put` of the same number
            of bytes from a device block to pinned host (no cache): how much the link
            itself overlaps decode.

Per round: the median step time of each scenario and the paired ratios backup/none and
raw/none; then the medians over rounds. Also: bytes backed up per second of the backup
round (steps and the final drain), per-transfer rate (start to completion as `step()` saw
it, so at most one step late), the share of steps after which a backup was still in
flight, the Python time of `cache.step()` and of alloc + insert, and a contiguous device ->
pinned host `device_put` of one prefix's bytes on an idle device (the raw link). After the
last round one prefix is evicted from the device and brought back with `acquire`; its bytes
are compared exactly with what was written (every pool, every layer).

    python benchmarks/bench_backup_decode.py --out backup_decode.json          # V4-Flash (GPU)
    python benchmarks/bench_backup_decode.py --smoke --out backup_decode.json  # tiny_v4, CPU, seconds
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
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

clock = time.perf_counter
SCENARIOS = ("none", "backup", "raw")


def pattern(seed: int, pool: int, layers, pages, nbytes: int) -> jax.Array:
    """u8[len(layers), len(pages), nbytes]: the bytes "prefill" wrote at (layer, page, offset)
    of pool number `pool`; a hash of the position, so any page's bytes can be recomputed."""
    u32 = jnp.uint32
    l = jnp.asarray(layers, u32)[:, None, None]
    p = jnp.asarray(pages, u32)[None, :, None]
    o = jax.lax.iota(u32, nbytes)[None, None, :]
    salt = u32((seed * 131 + pool) * 0x27D4EB2F & 0xFFFFFFFF)
    h = l * u32(0x9E3779B1) ^ p * u32(0x85EBCA77) ^ o * u32(0xC2B2AE3D) ^ salt
    h = (h ^ (h >> 15)) * u32(0x2C1B3C6D)
    h = (h ^ (h >> 12)) * u32(0x297A2D39)
    return ((h ^ (h >> 15)) & u32(0xFF)).astype(jnp.uint8)


def fill(cache: hc.HiCache, seed: int) -> None:
    """Every page of every pool gets its `pattern` bytes (on the device, in place)."""
    pools = cache.device_pools
    for k, spec in enumerate(cache.layout.byte_pools):
        arr = pools[spec.name]
        if arr.dtype != jnp.uint8 or arr.ndim != 3:
            raise ValueError(f"pool {spec.name!r} is {arr.dtype}{list(arr.shape)}; this benchmark fills u8 pages")
        L, P, n = arr.shape
        pools[spec.name] = jax.jit(lambda a, k=k: pattern(seed, k, np.arange(L), np.arange(P), n),
                                   donate_argnums=0, out_shardings=arr.sharding)(arr)
    cache.set_device_pools(pools)


def touches(layout) -> list[list[tuple[str, int]]]:
    """Per model layer, the (pool, pool layer) pairs it reads and writes: each pool's layers
    are spread over the model's layers, each touched once per step."""
    n = layout.model.num_hidden_layers
    out = [[] for _ in range(n)]
    for spec in layout.byte_pools:
        first = {}
        for l in range(n):
            first.setdefault(l * spec.num_layers // n, l)
        for j, l in first.items():
            out[l].append((spec.name, j))
    return out


def make_model(cache: hc.HiCache, tokens: int, hidden: int, ffn: int):
    """A jitted decode step: (pools, weights, x, kv_table, swa_table, pos) -> (pools, i32[tokens])."""
    layout, anchor = cache.layout, cache.anchor
    plan = touches(layout)
    specs = {s.name: s for s in layout.byte_pools}
    slot = {s.name: max(1, min(s.page_bytes // layout.page_size, 2 * hidden)) for s in layout.byte_pools}

    def step(pools, w1, w2, x, kv_table, swa_table, pos):
        def table(name):
            return kv_table if specs[name].allocator == anchor else swa_table
        # attention-like reads of the request's pages, every layer of every pool (all reads
        # come before the writes, so XLA updates the donated pools in place, without copies)
        seen = {name: pools[name][:, table(name)].astype(jnp.float32).sum(axis=(1, 2)) for name in specs}
        rows = {name: [] for name in specs}
        for l, pairs in enumerate(plan):
            x = x + sum((seen[name][j] * 1e-9 for name, j in pairs), jnp.float32(0)).astype(x.dtype)
            h = jax.nn.gelu(x @ w1[l])
            y = (x + h @ w2[l]).astype(jnp.float32)
            x = (y * jax.lax.rsqrt((y * y).mean(-1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)
            row = jax.lax.bitcast_convert_type(x[0], jnp.uint8).reshape(-1)
            for name, j in pairs:
                rows[name].append(row[:slot[name]])
        out = dict(pools)
        for name, spec in specs.items():  # append one token's slot to the request's last page, every layer
            offset = (pos % (spec.page_bytes // slot[name])) * slot[name]
            update = jnp.stack(rows[name])[:, None, :]
            out[name] = jax.lax.dynamic_update_slice(pools[name], update, (jnp.int32(0), table(name)[-1], offset))
        return out, jnp.argmax(x, axis=-1).astype(jnp.int32)

    model = jax.jit(step, donate_argnums=0)
    n = layout.model.num_hidden_layers
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    w1 = (jax.random.normal(k1, (n, hidden, ffn), jnp.float32) * hidden ** -0.5).astype(jnp.bfloat16)
    w2 = (jax.random.normal(k2, (n, ffn, hidden), jnp.float32) * ffn ** -0.5).astype(jnp.bfloat16)
    x = jax.random.normal(k3, (tokens, hidden), jnp.float32).astype(jnp.bfloat16)
    return model, (w1, w2, x)


def prefix_bytes(layout, pages: int) -> int:
    window = min(pages, layout.window_pages()) if layout.swa_pool else 0
    return pages * layout.page_bytes_of(layout.anchor.name) + (
        window * layout.page_bytes_of(layout.swa_pool.name) if window else 0)


class Bench:
    def __init__(self, args):
        self.args = args
        layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{args.config}.json"))
        self.window = layout.window_pages() if layout.swa_pool else 0
        inserts = -(-args.steps // args.insert_every)
        kv = inserts * args.prefix_pages               # one round's prefixes stay on device and host
        swa = inserts * self.window
        cfg = hc.HiCacheConfig(device_pages=kv + args.read_pages + 2,
                               swa_device_pages=swa + self.window + 2 if self.window else None,
                               host_pages={"kv": kv + 2, **({"swa": swa + 2} if self.window else {})},
                               write_policy="write_through",
                               transfer=hc.TransferConfig(host_memory_limit_bytes=1 << 40))
        t = clock()
        self.cache = cache = hc.HiCache(layout, cfg)
        self.setup_s = {"cache": clock() - t}
        self.layout, self.rng = layout, np.random.default_rng(args.seed)
        t = clock()
        fill(cache, args.seed)
        jax.block_until_ready(cache.device_pools)
        self.setup_s["fill"] = clock() - t
        # the decoding request's own pages: held for the whole run, never inserted
        self.held = cache.alloc(args.read_pages, self.window)
        swa = self.held.get(cache.swa_allocator, np.zeros(1, np.int32)) if self.window else np.zeros(1, np.int32)
        self.tables = (jnp.asarray(self.held[cache.anchor]), jnp.asarray(swa))
        self.model, self.weights = make_model(cache, args.tokens, args.hidden, args.ffn)
        self.nbytes = prefix_bytes(layout, args.prefix_pages)
        dev = jax.devices()[0]
        self.to_host = jax.sharding.make_single_device_sharding(dev, memory_kind="pinned_host")
        self.block = jax.jit(lambda: jnp.ones(self.nbytes, jnp.uint8),
                             out_shardings=jax.sharding.make_single_device_sharding(dev, memory_kind="device"))()
        self.pos = 0
        self.last_prefix = None

    def insert_prefix(self) -> None:
        """A prefilled prefix joins the tree (its pages hold their `pattern` bytes)."""
        cache, P, page = self.cache, self.args.prefix_pages, self.layout.page_size
        tokens = self.rng.integers(1, 1 << 30, P * page, dtype=np.int64).astype(np.int32)
        grant = cache.alloc(P, self.window)
        if grant is None:
            raise RuntimeError("bench: no device room for a prefix (sizes are computed to avoid this)")
        swa = {P - self.window + i: int(p) for i, p in enumerate(grant[cache.swa_allocator])} if self.window else None
        res = cache.insert(tokens, grant[cache.anchor], swa)
        if res.new_len != P * page:
            raise RuntimeError(f"bench: prefix not inserted whole: {res}")
        self.last_prefix = (tokens, grant)

    def round(self, scenario: str) -> dict:
        args, cache = self.args, self.cache
        pace = args.pace_mib << 20 if scenario == "paced" else None
        cache.pace_backups(pace)
        before = cache.stats()
        times, step_calls, inserts, in_flight = [], [], [], []
        flying, puts = 0, []
        t_round = clock()
        for i in range(args.steps):
            t0 = clock()
            due = i % args.insert_every == 0
            if scenario in ("backup", "paced") and due:
                self.insert_prefix()
                inserts.append(clock() - t0)
            pools, out = self.model(cache.device_pools, *self.weights, *self.tables, jnp.int32(self.pos))
            self.pos += 1
            cache.set_device_pools(pools)
            if scenario == "raw" and due:
                puts = [jax.device_put(self.block, self.to_host)]   # the previous one is dropped once done
            t1 = clock()
            report = cache.step()
            step_calls.append(clock() - t1)
            flying += (report.dispatched_backup_tokens > 0) - sum(c.direction is hc.Direction.BACKUP for c in report.completed)
            in_flight.append(flying > 0)
            out.block_until_ready()
            times.append(clock() - t0)
        t_drain = clock()
        cache.drain()
        jax.block_until_ready(puts)
        end = clock()
        after = cache.stats()
        moved = sum(after.backup_bytes.values()) - sum(before.backup_bytes.values())
        n0, s0 = before.durations.get("backup", (0, 0.0))
        n1, s1 = after.durations.get("backup", (0, 0.0))
        return {"step_ms": float(np.median(times)) * 1e3, "mean_step_ms": float(np.mean(times)) * 1e3,
                "max_step_ms": float(np.max(times)) * 1e3, "steps_ms": [round(t * 1e3, 3) for t in times],
                "step_call_us": float(np.median(step_calls)) * 1e6,
                "insert_us": float(np.median(inserts)) * 1e6 if inserts else 0.0,
                "in_flight_share": float(np.mean(in_flight)), "drain_ms": (end - t_drain) * 1e3,
                "backup_bytes": int(moved), "round_s": end - t_round, "transfers": n1 - n0, "transfer_s": s1 - s0}

    def reset(self) -> None:
        """Every prefix leaves the device and the host: the next round starts from one free run."""
        cache = self.cache
        cache.drain()
        cache.evict(10 ** 6, 10 ** 6 if self.window else 0)
        cache.evict_host(10 ** 6, 10 ** 6 if self.window else 0)

    def contiguous_s(self) -> float:
        t = clock()
        jax.block_until_ready(jax.device_put(self.block, self.to_host))
        return clock() - t

    def same_bytes(self) -> bool:
        """Evict the last prefix from the device, `acquire` it back, compare every pool's bytes
        with the pattern written at its original pages."""
        cache, (tokens, grant) = self.cache, self.last_prefix
        cache.drain()
        cache.evict(10 ** 6, 10 ** 6 if self.window else 0)
        prefix = cache.acquire(np.append(tokens, 7).astype(np.int32))
        try:
            if prefix.length != len(tokens) or prefix.host_tokens != len(tokens):
                return False
            pools = cache.device_pools
            for k, spec in enumerate(self.layout.byte_pools):
                now, was = ((prefix.device_pages, grant[cache.anchor]) if spec.allocator == cache.anchor
                            else (prefix.swa_pages, grant[cache.swa_allocator]))
                if len(now) != len(was):
                    return False
                arr = pools[spec.name]
                want = pattern(self.args.seed, k, np.arange(arr.shape[0]), np.asarray(was), arr.shape[2])
                if not bool(jnp.array_equal(arr[:, jnp.asarray(now)], want)):
                    return False
            return True
        finally:
            cache.unlock(prefix.lock)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="deepseek_v4_flash", help="model config (configs/NAME.json): the pools")
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds after one warm-up round")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per scenario per round")
    ap.add_argument("--prefix-pages", type=int, default=512, help="kv pages of each inserted prefix")
    ap.add_argument("--insert-every", type=int, default=1, help="steps between inserted prefixes")
    ap.add_argument("--read-pages", type=int, default=64, help="kv pages the decoding request reads")
    ap.add_argument("--tokens", type=int, default=2048, help="rows of the per-layer MLP")
    ap.add_argument("--hidden", type=int, default=4096, help="the per-layer MLP's input and output width")
    ap.add_argument("--ffn", type=int, default=8192, help="the per-layer MLP's inner width")
    ap.add_argument("--pace-mib", type=int, default=0,
                    help="also run the `paced` scenario with backup_bytes_per_step = this many MiB (0: not)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the prefixes' bytes")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, tiny MLP, few steps: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_backup_decode.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    args.out = args.out or default_out("bench_backup_decode.json", args.smoke)
    if args.smoke:
        args.config, args.rounds, args.steps, args.prefix_pages = "tiny_v4", 2, 4, 4
        args.read_pages, args.tokens, args.hidden, args.ffn = 2, 8, 64, 128
    global SCENARIOS
    if args.pace_mib < 0:
        sys.exit(f"--pace-mib must be >= 0, got {args.pace_mib}")
    if args.pace_mib:
        SCENARIOS = ("none", "backup", "paced", "raw")
    b = Bench(args)
    print(f"{args.config}: prefix {args.prefix_pages} pages = {b.nbytes / 1e6:.1f} MB every {args.insert_every} "
          f"step(s); MLP {args.tokens} x {args.hidden} x {args.ffn}; {args.steps} steps per scenario; "
          f"setup {', '.join(f'{k} {v:.1f} s' for k, v in b.setup_s.items())}", flush=True)
    rounds = []
    for r in range(args.rounds + 1):                  # round 0 compiles and warms up
        order = SCENARIOS if r % 2 == 0 else SCENARIOS[::-1]
        row = {}
        for scenario in order:
            row[scenario] = b.round(scenario)
            b.reset()
        row["contiguous_ms"] = float(np.median([b.contiguous_s() for _ in range(3)])) * 1e3
        if r:
            rounds.append(row)
        steps = " ".join(f"{s} {row[s]['step_ms']:.2f}" for s in SCENARIOS)
        print(f"round {r}{' (warm-up)' if not r else ''}: step ms {steps}; backups in flight at "
              f"{row['backup']['in_flight_share']:.0%} of steps; contiguous {row['contiguous_ms']:.2f} ms", flush=True)
    # the byte check needs the backups of a round on the host: one more backup round, kept
    b.round("backup")
    exact = b.same_bytes()
    b.reset()
    b.cache.free(b.cache.anchor, b.held[b.cache.anchor])
    if b.window:
        b.cache.free(b.cache.swa_allocator, b.held[b.cache.swa_allocator])

    def med(f):
        return round(float(np.median([f(r) for r in rounds])), 4)
    bk = lambda r: r["backup"]
    result = {
        "date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]),
        "config": b.layout.model.name, "prefix_bytes": b.nbytes, "setup_s": b.setup_s,
        "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "step_ms": {s: med(lambda r, s=s: r[s]["step_ms"]) for s in SCENARIOS},
        "slowdown_backup": med(lambda r: r["backup"]["step_ms"] / r["none"]["step_ms"]),
        "slowdown_raw": med(lambda r: r["raw"]["step_ms"] / r["none"]["step_ms"]),
        **({"slowdown_paced": med(lambda r: r["paced"]["step_ms"] / r["none"]["step_ms"]),
            "paced_in_flight_share": med(lambda r: r["paced"]["in_flight_share"]),
            "paced_max_step_ms": med(lambda r: r["paced"]["max_step_ms"]),
            "backup_max_step_ms": med(lambda r: r["backup"]["max_step_ms"])} if "paced" in SCENARIOS else {}),
        "backup_in_flight_share": med(lambda r: bk(r)["in_flight_share"]),
        "backup_GBps_round": med(lambda r: bk(r)["backup_bytes"] / bk(r)["round_s"] / 1e9),
        "backup_GBps_per_transfer": med(lambda r: bk(r)["backup_bytes"] / max(bk(r)["transfer_s"], 1e-12) / 1e9),
        "contiguous_GBps": med(lambda r: b.nbytes / r["contiguous_ms"] * 1e-6),
        "step_call_us": {s: med(lambda r, s=s: r[s]["step_call_us"]) for s in SCENARIOS},
        "insert_us": med(lambda r: bk(r)["insert_us"]),
        "exact": bool(exact), "rounds": rounds,
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"median step ms: none {result['step_ms']['none']:.3f}, backup {result['step_ms']['backup']:.3f} "
          f"(x{result['slowdown_backup']:.3f}), raw device_put {result['step_ms']['raw']:.3f} "
          f"(x{result['slowdown_raw']:.3f})" + (f", paced {result['step_ms']['paced']:.3f} "
                                               f"(x{result['slowdown_paced']:.3f})" if args.pace_mib else ""))
    print(f"backups: {result['backup_GBps_round']:.2f} GB/s over the round, {result['backup_GBps_per_transfer']:.2f} "
          f"GB/s per transfer; contiguous device_put {result['contiguous_GBps']:.2f} GB/s; in flight at "
          f"{result['backup_in_flight_share']:.0%} of steps; step() {result['step_call_us']['backup']:.0f} us "
          f"(none: {result['step_call_us']['none']:.0f} us), insert {result['insert_us']:.0f} us; exact {exact}")
    b.cache.close()
    if not exact:
        sys.exit("bench_backup_decode: restored bytes differ from what was written")


if __name__ == "__main__":
    main()
