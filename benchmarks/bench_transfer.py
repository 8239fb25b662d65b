"""Transfer engine benchmark: backup / load-back GB/s beside contiguous and per-page device_put.

    python benchmarks/bench_transfer.py --smoke --out DIR   # CPU, tiny models, seconds (CI)
    python benchmarks/bench_transfer.py --out DIR           # GPU: real V4-Flash and GQA sizes

Every transfer moves random, non-contiguous device pages (backup) and loads them back into
other random device pages, checked bit-exact on the device. Beside each engine number, in
the same run: a contiguous `jax.device_put` of the same bytes to/from pinned host, and a
list `device_put` of one array per page (sglang-jax's host pool design). Also measured:
the kernels against their references (their speed: bench_kernels.py), a one-page transfer of all pools, fragmented host runs, in-place checks, and the HLO
opcodes that touch host memory. Writes `transfer.json` (+ `transfer.png`) to DIR and
prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P, make_single_device_sharding  # noqa: E402

import hicache_jax as hc  # noqa: E402
import pallas_kernels as pk  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from hicache_jax.config import model_config_from_dict  # noqa: E402
from hicache_jax.plan import make_plan  # noqa: E402
from hicache_jax.config import TransferConfig  # noqa: E402
from hicache_jax.transfer import TransferEngine, hlo_host_ops  # noqa: E402
from hicache_jax.transfer.host_check import HLO_HOST_OK  # noqa: E402
from transfer_common import Bench, Contiguous, gbps, median_s, per_page, random_pools, run_pair  # noqa: E402
from transfer_kernels import kernel_correctness  # noqa: E402

REAL_GQA = {"name": "gqa-32x8x128", "model_type": "gqa", "num_hidden_layers": 32, "num_key_value_heads": 8,
            "head_dim": 128, "page_size": 256, "kv_dtype": "bfloat16"}


def first_device():
    d = jax.devices()[0]
    return make_single_device_sharding(d), make_single_device_sharding(d, memory_kind="pinned_host")


def reference(nbytes: int, pages: int, mesh=None) -> Contiguous:
    """A contiguous array of the same bytes; on a mesh, split over the ranks like the tp host buffer."""
    if mesh is None:
        return Contiguous((nbytes,), *first_device())
    tp = mesh.shape["tp"]
    row = nbytes // pages
    return Contiguous((pages, row // tp * tp), NamedSharding(mesh, P(None, "tp")),
                      NamedSharding(mesh, P(None, "tp"), memory_kind="pinned_host"))


def paired(bench: Bench, engine, pools, layout, alloc_pages: dict, rng, device_total, host_total, mesh=None, **kw):
    """`run_pair` with a contiguous reference of the same bytes, timed round by round beside it."""
    nbytes = sum(layout.page_bytes_of(a) * n for a, n in alloc_pages.items())  # the pages' bytes, no padding
    n = sum(alloc_pages.values())
    ref = reference(nbytes, n, mesh)
    pools, r = run_pair(engine, pools, layout, alloc_pages, rng, device_total, host_total, bench.reps(n),
                        reference=ref, **kw)
    del ref
    return pools, r


def sweep(bench: Bench, name: str, engine, pools, layout, alloc: str, pages_list, device_total, host_total,
          baselines: bool = True, mesh=None):
    rng = np.random.default_rng(1)
    rows = []
    for n in pages_list:
        pools, r = paired(bench, engine, pools, layout, {alloc: n}, rng, device_total, host_total, mesh)
        row = {"pages": n, "MB": r["nbytes"] / 1e6, "backup_ms": 1e3 * r["backup_s"], "load_ms": 1e3 * r["load_s"],
               **gbps(r)}
        if baselines and mesh is None:
            pd2h, ph2d = per_page(n, r["nbytes"] // n, bench.reps(n), *first_device())
            row.update(perpage_d2h_gbps=r["nbytes"] / pd2h / 1e9, perpage_h2d_gbps=r["nbytes"] / ph2d / 1e9)
        rows.append(row)
        print(fmt_row(name, row), flush=True)
        bench.results["sweeps"][name] = rows
        bench.save()
    return pools


def fmt_row(name, r):
    base = (f"{name:>14} {r['pages']:>5} pages {r['MB']:>9.1f} MB | contig D2H {r['contig_d2h_gbps']:6.2f} "
            f"H2D {r['contig_h2d_gbps']:6.2f} | backup {r['backup_gbps']:6.2f} ({r['backup_ratio']:.3f}) "
            f"load {r['load_gbps']:6.2f} ({r['load_ratio']:.3f}) | {r['backup_ms']:.3f}/{r['load_ms']:.3f} ms "
            f"exact={r['exact']}")
    if "perpage_d2h_gbps" in r:
        base += f" | per-page {r['perpage_d2h_gbps']:.2f}/{r['perpage_h2d_gbps']:.2f}"
    return base


# ---------------------------------------------------------------------------------------------
def v4_section(bench: Bench, cfg_path: str, kv_pages, swa_pages, kv_max: int, swa_max: int):
    layout = hc.build_layout(hc.load_model_config(cfg_path))
    dev_total = {"kv": 2 * kv_max, "swa": 2 * swa_max}
    host_total = {"kv": kv_max + 64, "swa": swa_max + 16}
    t = time.perf_counter()
    engine = TransferEngine(layout, dev_total, host_total,
                            config=TransferConfig(block_bytes=bench.block_bytes, kernels=bench.kernels))
    bench.results["v4_engine_init_s"] = time.perf_counter() - t
    pools = random_pools(engine, 0)
    t = time.perf_counter()
    bench.results["v4_warmup_programs"] = engine.warmup(max_pages=None if not bench.smoke else 1)
    bench.results["v4_warmup_s"] = time.perf_counter() - t
    bench.results["v4_chunk_pages"] = {a: engine.chunk_pages(a) for a in ("kv", "swa")}
    bench.results["v4_row_bytes"] = {a: engine.host.formats[a].row_bytes for a in ("kv", "swa")}  # with padding
    bench.results["kernels"] = engine.kernels

    # one page of every pool (kv + swa allocators together): latency, in 5 rounds of 20 (the spread)
    rng = np.random.default_rng(7)
    rounds = []
    for _ in range(5 if not bench.smoke else 1):
        pools, r = run_pair(engine, pools, layout, {"kv": 1, "swa": 1}, rng, dev_total, host_total,
                            20 if not bench.smoke else 2)
        rounds.append(r)
    bench.results["one_page_all_pools"] = {
        "bytes": r["nbytes"], "exact": all(x["exact"] for x in rounds),
        "backup_ms": 1e3 * float(np.median([x["backup_s"] for x in rounds])),
        "load_ms": 1e3 * float(np.median([x["load_s"] for x in rounds])),
        "rounds_backup_ms": [1e3 * x["backup_s"] for x in rounds], "rounds_load_ms": [1e3 * x["load_s"] for x in rounds]}
    print("one page, all pools:", bench.results["one_page_all_pools"], flush=True)

    # in place: the pools keep their device pointers; a backed-up run is one block
    try:
        pp = pools["deepseek_v4_c4"].unsafe_buffer_pointer()
        pools, _ = run_pair(engine, pools, layout, {"kv": 4}, rng, dev_total, host_total, 1)
        bench.results["in_place"] = {"pool_c4": pools["deepseek_v4_c4"].unsafe_buffer_pointer() == pp,
                                     "host_block_counts": engine.host.block_counts()}
    except Exception as e:
        bench.results["in_place"] = f"not checked: {e!r}"

    pools = sweep(bench, "v4_kv", engine, pools, layout, "kv", kv_pages, dev_total, host_total)
    pools = sweep(bench, "v4_swa", engine, pools, layout, "swa", swa_pages, dev_total, host_total, baselines=False)

    for n in ([256, 4096] if not bench.smoke else []):
        breakdown(bench, engine, pools, layout, n, dev_total, host_total)
    dump_hlo(bench, engine)

    # fragmented host runs (random host pages)
    n = kv_pages[-2] if len(kv_pages) > 1 else kv_pages[-1]
    pools, r = paired(bench, engine, pools, layout, {"kv": n}, rng, dev_total, host_total, fragmented=True)
    bench.results["v4_kv_fragmented"] = {"pages": n, "host_runs": r["host_runs"], **gbps(r)}
    print("fragmented:", bench.results["v4_kv_fragmented"], flush=True)
    hlo_report(bench, engine, "v4")
    del pools, engine


def breakdown(bench: Bench, engine, pools, layout, n: int, dev_total, host_total):
    """Time the pieces of one kv transfer of n pages (one chunk when n <= chunk_pages)."""
    a = "kv"
    fmt = engine.row_format(a)
    reps = bench.reps(n)
    rng = np.random.default_rng(5)
    idx = rng.permutation(dev_total[a])[:n].astype(np.int32)
    args = tuple(pools[s.name] for s in fmt.pools)
    out = {"pages": n, "bytes": n * fmt.row_bytes}
    (block,), (bigger,) = engine.host.block(a, n), engine.host.block(a, 2 * n)
    whole = jax.jit(lambda h: jax.device_put(h, jax.memory.Space.Device))
    sl = jax.jit(lambda h, o: jax.device_put(jax.lax.dynamic_slice_in_dim(h, o[0], n, 0), jax.memory.Space.Device))

    def timed(name, fn):
        out[name + "_ms"] = 1e3 * median_s(fn, reps)
    timed("host_block_dma", lambda: whole(block).block_until_ready())
    timed("host_slice_of_bigger_block", lambda: sl(bigger, np.array([n // 2], np.int32)).block_until_ready())
    gather = jax.jit(lambda s, i: pk.gather_pages(s, i, impl=engine.kernels, block_bytes=bench.block_bytes))
    timed("gather_kernel", lambda: jax.block_until_ready(gather(args, idx)))
    if n <= engine.chunk_pages(a):
        pack = engine.program(a, "pack", n)
        timed("pack_program", lambda: jax.block_until_ready(pack(args, idx)))
        timed("pack_and_device_put", lambda: jax.block_until_ready(jax.device_put(pack(args, idx), engine.host.sharding(a))))
        load = engine.program(a, "load_block", n, 0)
        state = {"p": tuple(x + 0 for x in args)}

        def l():
            state["p"], tok = load(state["p"], (block,), idx)
            tok.block_until_ready()
        timed("load_block_program", l)
    # Python work of start() outside the programs: plan check, pool check, chunking
    from hicache_jax.transfer import chunks as chunking
    from hicache_jax.transfer.plan_check import check_plan
    plan = make_plan(layout, "backup", {a: (idx, np.arange(n))})
    out["py_check_plan_us"] = 1e6 * median_s(lambda: check_plan(plan, layout, engine.device_pages, engine.host.pages), 50)
    out["py_check_pools_us"] = 1e6 * median_s(lambda: engine.check_device_pools(pools), 50)
    runs = [(r.offset, r.host_start, r.length) for r in plan.batch(a).host_runs]
    out["py_split_us"] = 1e6 * median_s(lambda: chunking.split(plan.batch(a).device_pages, runs, engine.chunk_pages(a)), 50)
    bench.results[f"breakdown_kv_{n}"] = out
    print("breakdown:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}, flush=True)


def dump_hlo(bench: Bench, engine):
    for key, compiled in engine.compiled_programs().items():
        for program in ("pack", "load_block"):
            if f":{program}[256" in key and not bench.smoke:
                with open(os.path.join(bench.out, f"hlo_{program}.txt"), "w") as f:
                    f.write(compiled.as_text())


def kv_engines_section(bench: Bench, cfg_path: str, key: str, engines, n_list, kv_max: int, rounds: int = 3):
    """Backup / load GB/s of long single-run kv transfers through engines built otherwise:
    `engines` = [(label, TransferEngine keyword arguments)] (staging caps, kernels). The
    engines take turns, `rounds` times (each turn paired with its own contiguous copies), so
    drift of the machine hits every engine alike; medians of the rounds."""
    layout = hc.build_layout(hc.load_model_config(cfg_path))
    dev_total, host_total = {"kv": 2 * kv_max, "swa": 2}, {"kv": kv_max + 64, "swa": 2}
    built = []
    for label, kw in engines:
        kw = {"block_bytes": bench.block_bytes, "kernels": bench.kernels, **kw}
        built.append((label, TransferEngine(layout, dev_total, host_total, None, TransferConfig(**kw))))
    pools = random_pools(built[0][1], 9)
    samples: dict = {}
    for r in range(rounds):
        for label, engine in built:
            rng = np.random.default_rng(4 + r)
            for n in n_list:
                pools, res = paired(bench, engine, pools, layout, {"kv": n}, rng, dev_total, host_total)
                samples.setdefault(f"{label}/n{n}", []).append(gbps(res))
                print(key, f"round {r} {label} n={n}", {k: round(v, 3) if isinstance(v, float) else v
                                                        for k, v in samples[f"{label}/n{n}"][-1].items()}, flush=True)
    out = {}
    for name, rows in samples.items():
        engine = dict(built)[name.split("/")[0]]
        out[name] = {"chunk_pages": engine.chunk_pages("kv"), "kernels": engine.kernels, "rounds": len(rows),
                     "exact": all(r["exact"] for r in rows),
                     **{k: float(np.median([r[k] for r in rows])) for k in rows[0] if k != "exact"}}
    del built
    bench.results[key] = out


def hlo_report(bench: Bench, engine: TransferEngine, name: str):
    ops, bad = {}, {}
    for label, compiled in engine.compiled_programs().items():
        found = hlo_host_ops(compiled.as_text())
        ops[label] = sorted(found)
        if found - HLO_HOST_OK:
            bad[label] = sorted(found - HLO_HOST_OK)
    bench.results[f"{name}_hlo_host_ops"] = ops
    bench.results[f"{name}_hlo_host_compute"] = bad
    print(f"{name}: HLO opcodes on host memory: {sorted(set(sum(ops.values(), [])))}; unexpected: {bad}", flush=True)


def gqa_section(bench: Bench, cfg: dict, pages, max_pages: int, mesh=None, name="gqa"):
    layout = hc.build_layout(model_config_from_dict(cfg))
    dev_total, host_total = {"kv": 2 * max_pages}, {"kv": max_pages + 8}
    engine = TransferEngine(layout, dev_total, host_total, mesh=mesh,
                            config=TransferConfig(block_bytes=bench.block_bytes, kernels=bench.kernels))
    pools = random_pools(engine, 3)
    pools = sweep(bench, name, engine, pools, layout, "kv", pages, dev_total, host_total, mesh=mesh)
    hlo_report(bench, engine, name)
    del pools, engine


def v4_mesh_section(bench: Bench, cfg_path: str, mesh, n: int):
    """Replicated pools on a mesh: one host copy on the first device, loads broadcast to every rank."""
    layout = hc.build_layout(hc.load_model_config(cfg_path))
    dev_total, host_total = {"kv": 2 * n, "swa": 8}, {"kv": n + 8, "swa": 8}
    engine = TransferEngine(layout, dev_total, host_total, mesh=mesh,
                            config=TransferConfig(block_bytes=bench.block_bytes, kernels=bench.kernels))
    pools = random_pools(engine, 5)
    rng = np.random.default_rng(3)
    ref = Contiguous((n * layout.page_bytes_of("kv"),), *first_device())  # the one host copy: GPU 0's link
    pools, r = run_pair(engine, pools, layout, {"kv": n}, rng, dev_total, host_total, bench.reps(n), reference=ref)
    # every rank holds the same bytes after the load (replicated pools stay replicated)
    same = all(bool(np.array_equal(np.asarray(s.data[:, :2]), np.asarray(pools[p].addressable_shards[0].data[:, :2])))
               for p in ("deepseek_v4_c128",) for s in pools[p].addressable_shards)
    bench.results["v4_mesh"] = {"tp": mesh.shape["tp"], "pages": n, "ranks_agree": same, **gbps(r)}
    print("v4 on mesh:", bench.results["v4_mesh"], flush=True)
    del pools, engine


def print_table(results: dict) -> None:
    print("\n| sweep | pages | MB | contig D2H / H2D GB/s | backup GB/s (ratio) | load GB/s (ratio) | "
          "per-page D2H / H2D GB/s | backup / load ms | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.get("sweeps", {}).items():
        for r in rows:
            per_page = (f"{r['perpage_d2h_gbps']:.1f} / {r['perpage_h2d_gbps']:.1f}" if "perpage_d2h_gbps" in r else "-")
            print(f"| {name} | {r['pages']} | {r['MB']:.1f} | {r['contig_d2h_gbps']:.1f} / {r['contig_h2d_gbps']:.1f} | "
                  f"{r['backup_gbps']:.1f} ({r['backup_ratio']:.2f}) | {r['load_gbps']:.1f} ({r['load_ratio']:.2f}) | "
                  f"{per_page} | {r['backup_ms']:.2f} / {r['load_ms']:.2f} | {r['exact']} |")


# ---------------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (seconds)")
    ap.add_argument("--out", default=None,
                    help="output folder for JSON and PNG (default: benchmarks/results/, or .../smoke/ with --smoke)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting sections after this many seconds")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--kernels", default="auto", help="the engine's kernels (pallas_kernels.IMPLS)")
    args = ap.parse_args(argv)
    args.out = args.out or str(default_out("", args.smoke))
    bench = Bench(args.out, args.smoke, args.budget_s)
    bench.kernels = args.kernels
    skip = set(filter(None, args.skip.split(",")))
    cfg = lambda n: os.path.join(HERE, "..", "configs", f"{n}.json")  # noqa: E731
    print("env:", bench.results["env"], flush=True)
    bench.results["triton_wide_offsets_fix"] = (pk.ensure_triton_wide_offsets()
                                                if jax.default_backend() == "gpu" else None)
    sections = []
    if args.smoke:
        sections = [
            ("kernel_correctness", kernel_correctness),
            ("v4", v4_section, cfg("tiny_v4"), [1, 4], [1], 4, 2),
            ("gqa", gqa_section, json.load(open(cfg("tiny_gqa"))), [1, 2], 2),
        ]
    else:
        sections = [
            ("kernel_correctness", kernel_correctness),
            ("v4", v4_section, cfg("deepseek_v4_flash"), [1, 16, 256, 4096], [1, 16, 256], 4096, 256),
            ("kernels_ab", kv_engines_section, cfg("deepseek_v4_flash"), "v4_kv_kernels",
             [("triton", {"kernels": "triton"}), ("mosaic_gpu", {"kernels": "mosaic_gpu"})], [256, 4096], 4096),
            ("gqa", gqa_section, REAL_GQA, [1, 16, 256], 256),
            ("caps", kv_engines_section, cfg("deepseek_v4_flash"), "v4_kv_caps",
             [(f"cap{c >> 20}MiB", {"max_staging_bytes": c}) for c in (1024 << 20, 2048 << 20)], [256, 4096], 4096),
        ]
    if jax.device_count() >= 2:
        mesh = jax.make_mesh((2,), ("tp",), devices=jax.devices()[:2])
        if args.smoke:
            sections.append(("gqa_tp2", gqa_section, json.load(open(cfg("tiny_gqa"))), [1, 2], 2, mesh, "gqa_tp2"))
        else:
            sections.append(("gqa_tp2", gqa_section, REAL_GQA, [1, 16, 256], 256, mesh, "gqa_tp2"))
            sections.append(("v4_mesh", v4_mesh_section, cfg("deepseek_v4_flash"), mesh, 256))
    for name, fn, *fargs in sections:
        if name not in skip:
            bench.section(name, fn, *fargs)
    bench.results["total_s"] = time.perf_counter() - bench.t0
    bench.save()
    try:
        from plot_transfer import plot
        plot(bench.results, os.path.join(args.out, "transfer.png"))
    except Exception as e:
        bench.results["errors"]["plot"] = repr(e)
        bench.save()
    print_table(bench.results)
    print(json.dumps({k: v for k, v in bench.results.items() if k in ("errors", "one_page_all_pools", "in_place",
                                                                     "v4_hlo_host_compute", "kernels")},
                     default=str), flush=True)
    return bench.results


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
