"""The tree core against an earlier revision of itself, in one process, interleaved.

Timings on a busy machine drift by tens of percent between runs, so two builds are only
comparable side by side: this loads the `hicache_jax` package of a git revision under
another name, builds both trees from the seeded trace of `benchmarks/tree_trace.py` prompt
by prompt (alternating which goes first), and times each match, insert and eviction on both, back to back. Ratios are
medians of the per-operation ratios (this tree / the base), so drift hits both alike.

    python benchmarks/tree_ab.py --base 5e2f708 --prompts 20000 --out benchmarks/results/tree_ab_cpu.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_tree import DEFAULT_TRACE, cpu_model, load_trace  # noqa: E402
from benchmarks.outputs import default_out  # noqa: E402

clock = time.perf_counter


def load_base(rev: str, into: pathlib.Path):
    """The `hicache_jax` package of git revision `rev` (or of the directory `rev`, which holds
    one: where there is no git), imported as `hicache_base`."""
    copy = pathlib.Path(rev) / "hicache_jax"
    if copy.is_dir():
        shutil.copytree(copy, into / "hicache_jax", ignore=shutil.ignore_patterns("__pycache__"))
    else:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "hicache_jax"], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    pkg = into / "hicache_base"
    (into / "hicache_jax").rename(pkg)
    for f in pkg.rglob("*.py"):
        f.write_text(re.sub(r"\bhicache_jax\b", "hicache_base", f.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module("hicache_base")


class Driver:
    """One tree core, driven the way bench_tree.py drives it, over either API generation."""

    def __init__(self, hc, layout_name: str, cap: int, windows: int):
        from_pkg = importlib.import_module(f"{hc.__name__}.tree")
        layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{layout_name}.json"))
        self.swa = layout.swa_pool is not None
        pages = {"kv": cap, **({"swa": windows} if self.swa else {})}
        self.core = from_pkg.TreeCore(layout, device_pages=pages, host_pages=pages, write_policy="write_back")
        self.mapping_api = hasattr(self.core, "components")   # insert/evict take {allocator: ...}
        self.page = layout.page_size

    def match(self, q):
        return self.core.match_prefix(q)

    def prepare(self, p, m):
        n_new = (len(p) - m.device_len) // self.page
        got = self.core.alloc_device({"kv": n_new, **({"swa": 1} if self.swa else {})})
        table = np.concatenate([m.device_pages, got["kv"]])
        swa = {len(p) // self.page - 1: int(got["swa"][0])} if self.swa else None
        return table, ({"swa": swa} if self.mapping_api and swa else swa)

    def insert(self, p, table, window):
        self.core.insert(p, table, window)

    def evict(self, pages: int):
        r = self.core.evict_device({"kv": pages} if self.mapping_api else pages)
        while (b := self.core.take_backup_batch()) is not None:
            self.core.ack_backup(b.ack_id)
        return r


def timed(fn, *args):
    t = clock()
    out = fn(*args)
    return clock() - t, out


def run(layout_name: str, base, new, prompts: list[np.ndarray], seed: int) -> dict:
    cap = sum(len(p) for p in prompts) // 256 + 16
    a, b = Driver(new, layout_name, cap, len(prompts) + 16), Driver(base, layout_name, cap, len(prompts) + 16)
    ratios = {"match": [], "insert": [], "evict": []}
    times = {k: ([], []) for k in ratios}

    def pair(op, fa, fb, i):
        (ta, _), (tb, _) = (timed(*fa), timed(*fb)) if i % 2 else tuple(reversed((timed(*fb), timed(*fa))))
        times[op][0].append(ta)
        times[op][1].append(tb)
        ratios[op].append(ta / tb)

    for i, p in enumerate(prompts):
        q = np.concatenate([p, p[-1:]])
        args = {}
        for d in (a, b):
            args[d] = d.prepare(p, d.match(q))
        pair("insert", (a.insert, p, *args[a]), (b.insert, p, *args[b]), i)
    rng = np.random.default_rng(seed + 1)
    for i, j in enumerate(rng.integers(0, len(prompts), size=min(5000, len(prompts)))):
        q = np.concatenate([prompts[j], prompts[j][-1:]])
        pair("match", (a.match, q), (b.match, q), i)
    for i in range(min(2000, a.core.tree.num_nodes // 2)):
        pair("evict", (a.evict, 8), (b.evict, 8), i)
    out = {"layout": layout_name, "nodes": a.core.tree.num_nodes}
    tail = len(prompts) // 10
    for op, r in ratios.items():
        ta, tb = times[op]
        if op == "insert":   # as bench_tree.py reports it: the last tenth, on a full tree
            r, ta, tb = r[-tail:], ta[-tail:], tb[-tail:]
        out[op] = {"ratio_median": round(float(np.median(r)), 3), "new_p50_us": round(float(np.median(ta)) * 1e6, 1),
                   "base_p50_us": round(float(np.median(tb)) * 1e6, 1), "n": len(r)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare against (or a directory holding a hicache_jax)")
    ap.add_argument("--prompts", type=int, default=20_000, help="prompts of the trace both trees are built from")
    ap.add_argument("--prompt-tokens", type=int, default=8192, help="tokens per prompt (a multiple of 256)")
    ap.add_argument("--layouts", default="tiny_gqa,tiny_v4", help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE,
                    help="a trace generator module with make_trace(num_prompts, prompt_tokens, page, seed)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the trace and of the prompts matched")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="JSON path (default: benchmarks/results/tree_ab.json)")
    args = ap.parse_args()
    args.out = args.out or default_out("tree_ab.json")
    import hicache_jax as new
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(args.base, pathlib.Path(tmp))
        prompts = load_trace(args.trace)(num_prompts=args.prompts, prompt_tokens=args.prompt_tokens, page=256,
                                         seed=args.seed)
        result = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "python": sys.version.split()[0],
                  "base": args.base, "prompts": args.prompts, "seed": args.seed, "runs": []}
        for name in args.layouts.split(","):
            r = run(name, base, new, prompts, args.seed)
            result["runs"].append(r)
            print(f"{name:9} {r['nodes']:>7} nodes  " + "  ".join(
                f"{op} {r[op]['new_p50_us']:.1f}/{r[op]['base_p50_us']:.1f} us (x{r[op]['ratio_median']:.3f})"
                for op in ("match", "insert", "evict")), flush=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
