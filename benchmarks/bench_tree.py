"""Tree-core benchmark: match_prefix / insert / evict on a large prefix-sharing tree.

Runs on the seeded trace of `benchmarks/tree_trace.py` (8K-token prompts, page 256, each
sharing a long page-aligned prefix with an earlier one). Builds the tree the way a serving
loop does (match, allocate the rest, insert), then times each operation and prints p50/p99
per operation; writes JSON (default: benchmarks/results/bench_tree.json).

    python benchmarks/bench_tree.py --out benchmarks/results/tree_cpu.json   # 70,000 prompts (~95K nodes)
    python benchmarks/bench_tree.py --smoke        # seconds, for CI
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hicache_jax as hc  # noqa: E402
from benchmarks.outputs import default_out  # noqa: E402
from hicache_jax.tree import TreeCore  # noqa: E402

DEFAULT_TRACE = ROOT / "benchmarks" / "tree_trace.py"


def load_trace(path: pathlib.Path):
    """The `make_trace` of the trace generator at `path` (default: this repository's)."""
    spec = importlib.util.spec_from_file_location("tree_trace", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_trace


def cpu_model() -> str:
    """The CPU's model name (lscpu's "Model name"), or what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e6, q))


def build(core: TreeCore, prompts, page: int, swa: bool, insert_us: list, sizes: list):
    for i, p in enumerate(prompts):
        q = np.concatenate([p, p[-1:]])                       # one more token: whole prompt can hit
        m = core.match_prefix(q)
        n_new = (len(p) - m.device_len) // page
        need = {"kv": n_new, **({"swa": 1} if swa else {})}
        got = core.alloc_device(need)
        table = np.concatenate([m.device_pages, got["kv"]])
        window = {"swa": {len(p) // page - 1: int(got["swa"][0])}} if swa else None
        t = time.perf_counter()
        core.insert(p, table, window)
        insert_us.append(time.perf_counter() - t)
        sizes.append(core.tree.num_nodes)


def run(layout_name: str, num_prompts: int, prompt_tokens: int, make_trace, seed: int) -> dict:
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{layout_name}.json"))
    page = layout.page_size
    swa = layout.swa_pool is not None
    t0 = time.perf_counter()
    prompts = make_trace(num_prompts=num_prompts, prompt_tokens=prompt_tokens, page=page, seed=seed)
    trace_s = time.perf_counter() - t0
    cap = num_prompts * prompt_tokens // page + 16
    pages = {"kv": cap, **({"swa": num_prompts + 16} if swa else {})}
    # write-back: inserts measure the tree alone; evictions back up and demote (host big enough)
    core = TreeCore(layout, device_pages=pages, host_pages=pages, write_policy="write_back")
    insert_s, sizes = [], []
    t0 = time.perf_counter()
    build(core, prompts, page, swa, insert_s, sizes)
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed + 1)
    match_s = []
    for i in rng.integers(0, len(prompts), size=min(5000, len(prompts))):
        q = np.concatenate([prompts[i], prompts[i][-1:]])
        t = time.perf_counter()
        core.match_prefix(q)
        match_s.append(time.perf_counter() - t)
    tail = len(insert_s) // 10
    evict_s, evict_pages = [], []
    for _ in range(min(2000, core.tree.num_nodes // 2)):
        t = time.perf_counter()
        r = core.evict_device({"kv": 8})
        evict_s.append(time.perf_counter() - t)
        evict_pages.append(r.device_pages)
        while (b := core.take_backup_batch()) is not None:   # write-back demotions: ack at once
            core.ack_backup(b.ack_id)
    per_page = [s / n for s, n in zip(evict_s, evict_pages) if n]
    return {
        "layout": layout_name, "prompts": num_prompts, "prompt_tokens": prompt_tokens,
        "nodes": sizes[-1], "trace_s": round(trace_s, 2), "build_s": round(build_s, 2),
        "match_us": {"p50": pct(match_s, 50), "p99": pct(match_s, 99), "n": len(match_s)},
        "insert_us": {"p50": pct(insert_s[-tail:], 50), "p99": pct(insert_s[-tail:], 99),
                      "p50_first_tenth": pct(insert_s[:tail], 50), "n": tail},
        "evict_us": {"p50": pct(evict_s, 50), "p99": pct(evict_s, 99), "per_page_p50": pct(per_page, 50),
                     "pages_per_call": float(np.mean(evict_pages)) if evict_pages else 0.0, "n": len(evict_s)},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=70_000, help="prompts of the trace the tree is built from")
    ap.add_argument("--prompt-tokens", type=int, default=8192, help="tokens per prompt (a multiple of the page)")
    ap.add_argument("--layouts", default="tiny_gqa,tiny_v4", help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE,
                    help="a trace generator module with make_trace(num_prompts, prompt_tokens, page, seed)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the trace and of the prompts matched")
    ap.add_argument("--smoke", action="store_true", help="300 prompts of 2,048 tokens: seconds, for CI")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_tree.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.prompts, args.prompt_tokens = 300, 2048
    args.out = args.out or default_out("bench_tree.json", args.smoke)
    make_trace = load_trace(args.trace)
    results = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "numpy": np.__version__,
               "cpu": cpu_model(), "cores": os.cpu_count(), "trace": str(args.trace.relative_to(ROOT))
               if args.trace.is_relative_to(ROOT) else str(args.trace), "seed": args.seed, "runs": []}
    print(f"{'layout':10} {'nodes':>7} {'match p50/p99 us':>18} {'insert p50/p99 us':>19} "
          f"{'insert p50 1st 10%':>19} {'evict p50 us (pages)':>22} {'per page':>9}")
    for name in args.layouts.split(","):
        r = run(name, args.prompts, args.prompt_tokens, make_trace, args.seed)
        results["runs"].append(r)
        m, i, e = r["match_us"], r["insert_us"], r["evict_us"]
        print(f"{name:10} {r['nodes']:>7} {m['p50']:>8.1f} / {m['p99']:>7.1f} {i['p50']:>9.1f} / {i['p99']:>7.1f} "
              f"{i['p50_first_tenth']:>19.1f} {e['p50']:>12.1f} ({e['pages_per_call']:.1f}) {e['per_page_p50']:>9.1f}",
              flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
