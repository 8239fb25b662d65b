"""Our tree (A, `hicache_jax.tree.TreeCore`) against sglang-jax's radix caches (B), in ONE process.

Optional peer benchmark: it needs sglang-jax's python tree, named by the environment variable
`SGLJAX_PYTHON` (e.g. `/path/to/sglang-jax/python`); without it, or when `sgl_jax` cannot be
imported from there, it prints one line and exits with status 2. No project test runs it.

    layout    A                                        B
    tiny_gqa  TreeCore(write_back)                     RadixCache(None, None, page_size=256)
    tiny_v4   TreeCore(write_back), one SWA page kept  SWARadixCache(None, <stand-in allocator>,
              for the last page of each prompt          sliding_window_size=128, page_size=256)

Method (both trees live in the same process and are timed in the same loop):

1. Build. The seeded trace of `benchmarks/tree_trace.py` (8,192-token prompts, page 256) is
   fed to both prompt by prompt, the way a serving loop handles a request that arrives as a
   Python list of token ids: match (prompt + 1 token), lock the matched prefix, allocate the
   rest (untimed), insert what was computed, unlock. A converts the list to an i32 array
   once per request (`np.asarray`, timed and charged to the request) and passes that array
   to its match and insert; B takes `RadixKey`s over the list. For each step the two
   implementations run back to back and the order alternates from one prompt to the next;
   conversion, match, lock+unlock and insert are timed separately, and `request` adds up
   conversion + match + insert per prompt (B: match + insert).
   B's insert gets what `cache_finished_req` gives it in a server: the i32 per-token KV indices
   of the prompt (here A's page table expanded to tokens, so both trees hold the same pages and
   the matched indices can be compared exactly), `prev_prefix_len` = its matched length and,
   for SWA, `swa_evicted_seqlen` = all but the last page (A keeps an SWA page for the last page
   only). The SWA stand-in allocator has no-op `free`/`free_swa` (calls counted) and a
   `full_to_swa_index_mapping` covering every index, marking the last page of every prompt as
   SWA-mapped (what `inc_lock_ref`/`dec_lock_ref`/`evict` read).
2. Match. The same random prompts (+1 token) are matched in passes, `--repeats` of each kind:
   `ndarray` (A given an i32 array) and `list` (A given the Python list, which it converts
   inside the call). In every pass each side is timed exactly once per prompt, back to back,
   the order alternating from one prompt to the next; B always gets a `RadixKey` over the
   list. Inputs are prepared outside the timers. Matched lengths and indices must agree
   (`mismatches`).

    SGLJAX_PYTHON=/path/to/sglang-jax/python SGLJAX_COMMIT=<sha> \\
        python benchmarks/peer_tree.py --out benchmarks/results/peer_tree_cpu.json
    SGLJAX_PYTHON=... python benchmarks/peer_tree.py --smoke      # a few hundred prompts
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hicache_jax as hc  # noqa: E402
from benchmarks.bench_tree import DEFAULT_TRACE, cpu_model, load_trace  # noqa: E402
from benchmarks.outputs import default_out  # noqa: E402
from hicache_jax.tree import TreeCore  # noqa: E402

PAGE = 256
WINDOW = 128
clock = time.perf_counter


def import_peer():
    """sgl_jax's caches from $SGLJAX_PYTHON, or exit 2 with one line."""
    where = os.environ.get("SGLJAX_PYTHON")
    if not where:
        print("peer_tree: set SGLJAX_PYTHON to sglang-jax's python/ folder (optional peer benchmark; skipped)")
        sys.exit(2)
    sys.path.insert(0, where)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        from sgl_jax.srt.mem_cache import base_prefix_cache, radix_cache, swa_radix_cache
        from sgl_jax.srt.mem_cache.allocator import SWATokenToKVPoolAllocator
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer to compare with
        print(f"peer_tree: cannot import sgl_jax from SGLJAX_PYTHON={where} ({type(e).__name__}: {e})")
        sys.exit(2)
    return base_prefix_cache, radix_cache, swa_radix_cache, SWATokenToKVPoolAllocator


def summary(xs) -> dict:
    a = np.asarray(xs) * 1e6
    return {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2),
            "mean": round(float(a.mean()), 2), "n": int(a.size)}


def ratio(b, a) -> dict:
    r = np.asarray(b) / np.asarray(a)
    return {"median": round(float(np.median(r)), 2), "p10": round(float(np.percentile(r, 10)), 2),
            "p90": round(float(np.percentile(r, 90)), 2)}


def rss_gib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def token_indices(pages: np.ndarray) -> np.ndarray:
    """Per-token KV indices of a page table (what a paged server's req_to_token row holds)."""
    return (pages.astype(np.int32)[:, None] * PAGE + np.arange(PAGE, dtype=np.int32)).ravel()


class StandInSWAAllocator:
    """What SWARadixCache touches of its allocator, with no-op frees (calls counted)."""

    def __init__(self, cls, num_indices: int):
        self.obj = obj = object.__new__(cls)          # passes SWARadixCache's isinstance assert
        obj.dp_size = 1
        obj.page_size = PAGE
        obj.is_not_in_free_group = True
        # calloc'ed: only the parts that get marked take memory
        obj.full_to_swa_index_mapping = np.zeros(num_indices, dtype=np.int32)
        self.calls = {"free": 0, "free_swa": 0}
        self.freed = {"free": 0, "free_swa": 0}
        calls, freed = self.calls, self.freed

        def free(free_index, dp_rank=0):
            calls["free"] += 1
            freed["free"] += len(free_index)

        def free_swa(free_index, dp_rank=0):
            calls["free_swa"] += 1
            freed["free_swa"] += len(free_index)

        obj.free, obj.free_swa = free, free_swa

    def mark_swa(self, full_indices: np.ndarray, swa_page: int):
        self.obj.full_to_swa_index_mapping[full_indices] = swa_page * PAGE + np.arange(1, len(full_indices) + 1)


def count_b_nodes(rc) -> tuple[int, int]:
    """(nodes without the root, like TreeCore.tree.num_nodes; of which SWA tombstones)."""
    c = t = 0
    st = list(rc.root_node.children.values())
    while st:
        x = st.pop()
        c += 1
        t += bool(getattr(x, "swa_tombstone", False))
        st.extend(x.children.values())
    return c, t


def run_layout(name: str, prompts, match_idx, repeats: int, peer) -> dict:
    bpc, radix_cache, swa_radix_cache, swa_alloc_cls = peer
    RadixKey, MatchPrefixParams, InsertParams = radix_cache.RadixKey, bpc.MatchPrefixParams, bpc.InsertParams
    DecLockRefParams = bpc.DecLockRefParams
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{name}.json"))
    page, swa = layout.page_size, layout.swa_pool is not None
    assert page == PAGE, f"{name}: page {page}, the trace is cut for {PAGE}"
    n_tok = len(prompts[0])
    cap = len(prompts) * n_tok // page + 16
    pages = {"kv": cap, **({"swa": len(prompts) + 16} if swa else {})}
    core = TreeCore(layout, device_pages=pages, host_pages=pages, write_policy="write_back")
    alloc = None
    if swa:
        alloc = StandInSWAAllocator(swa_alloc_cls, cap * page + page)
        rc = swa_radix_cache.SWARadixCache(None, alloc.obj, sliding_window_size=WINDOW, page_size=page)
        b_impl = f"SWARadixCache(None, stand-in SWATokenToKVPoolAllocator, sliding_window_size={WINDOW}, page_size={page})"
    else:
        rc = radix_cache.RadixCache(None, None, page_size=page)
        b_impl = f"RadixCache(None, None, page_size={page})"

    t_match = ([], [])      # (A, B)
    t_lock = ([], [])       # lock + unlock
    t_ins = ([], [])
    t_conv = []             # A's list -> i32 array, once per request
    build_bad = 0
    t0 = clock()
    tenth = max(1, len(prompts) // 10)
    for i, p in enumerate(prompts):
        first_a = i % 2 == 0
        # -- inputs: the request's token ids as a Python list (+ one token: the whole prompt can hit)
        toks = p.tolist()
        toks.append(toks[-1])
        qb = MatchPrefixParams(key=RadixKey(toks))
        t = clock(); qa = np.asarray(toks, dtype=np.int32); t_conv.append(clock() - t)   # A's one conversion
        pa = qa[:-1]                              # the prompt, for A's insert
        del toks[-1]
        # -- match
        if first_a:
            t = clock(); ma = core.match_prefix(qa); t1 = clock(); mb = rc.match_prefix(qb); t2 = clock()
            ta, tb = t1 - t, t2 - t1
        else:
            t = clock(); mb = rc.match_prefix(qb); t1 = clock(); ma = core.match_prefix(qa); t2 = clock()
            tb, ta = t1 - t, t2 - t1
        t_match[0].append(ta); t_match[1].append(tb)
        b_len = len(mb.device_indices)
        if b_len != ma.device_len or not np.array_equal(mb.device_indices, token_indices(ma.device_pages)):
            build_bad += 1
        # -- lock the matched prefix (held while the request computes the rest)
        if first_a:
            t = clock(); lk = core.lock(ma.device_node); t1 = clock(); lr = rc.inc_lock_ref(mb.last_device_node); t2 = clock()
            la, lb = t1 - t, t2 - t1
        else:
            t = clock(); lr = rc.inc_lock_ref(mb.last_device_node); t1 = clock(); lk = core.lock(ma.device_node); t2 = clock()
            lb, la = t1 - t, t2 - t1
        # -- allocate the rest (untimed); B's value is the same pages, per token
        n_new = (len(p) - ma.device_len) // page
        got = core.alloc_device({"kv": n_new, **({"swa": 1} if swa else {})})
        table = np.concatenate([ma.device_pages, got["kv"]])
        window = {"swa": {len(p) // page - 1: int(got["swa"][0])}} if swa else None
        vb = token_indices(table)
        if swa:
            alloc.mark_swa(vb[-page:], int(got["swa"][0]))
            ib = InsertParams(key=RadixKey(toks), value=vb, prev_prefix_len=b_len,
                              swa_evicted_seqlen=max(len(p) - page, b_len))
        else:
            ib = InsertParams(key=RadixKey(toks), value=vb)
        # -- insert
        if first_a:
            t = clock(); core.insert(pa, table, window); t1 = clock(); rc.insert(ib); t2 = clock()
            ia, b_ins = t1 - t, t2 - t1
        else:
            t = clock(); rc.insert(ib); t1 = clock(); core.insert(pa, table, window); t2 = clock()
            b_ins, ia = t1 - t, t2 - t1
        t_ins[0].append(ia); t_ins[1].append(b_ins)
        # -- unlock
        db = DecLockRefParams(swa_uuid_for_lock=lr.swa_uuid_for_lock) if swa else None
        if first_a:
            t = clock(); core.unlock(lk); t1 = clock(); rc.dec_lock_ref(mb.last_device_node, db); t2 = clock()
            la, lb = la + t1 - t, lb + t2 - t1
        else:
            t = clock(); rc.dec_lock_ref(mb.last_device_node, db); t1 = clock(); core.unlock(lk); t2 = clock()
            lb, la = lb + t1 - t, la + t2 - t1
        t_lock[0].append(la); t_lock[1].append(lb)
        if (i + 1) % tenth == 0:
            print(f"[{name}] built {i + 1}/{len(prompts)} in {clock() - t0:.0f}s, "
                  f"nodes A {core.tree.num_nodes}, load {os.getloadavg()[0]:.1f}", flush=True)
    build_s = clock() - t0
    nodes_b, tomb_b = count_b_nodes(rc)
    req_a = np.add(np.add(t_conv, t_match[0]), t_ins[0])
    req_b = np.add(t_match[1], t_ins[1])
    out = {
        "layout": name, "B_impl": b_impl, "nodes_A": core.tree.num_nodes, "nodes_B": nodes_b,
        "swa_tombstone_nodes_B": tomb_b, "build_s": round(build_s, 1), "build_mismatches": build_bad,
        "rss_gib_after_build": rss_gib(),
        "build_match": {"A": summary(t_match[0]), "B": summary(t_match[1]),
                        "ratio_B_over_A": ratio(t_match[1], t_match[0])},
        "insert": {"A": summary(t_ins[0]), "B": summary(t_ins[1]), "ratio_B_over_A": ratio(t_ins[1], t_ins[0]),
                   "A_first_tenth": summary(t_ins[0][:tenth]), "B_first_tenth": summary(t_ins[1][:tenth]),
                   "A_last_tenth": summary(t_ins[0][-tenth:]), "B_last_tenth": summary(t_ins[1][-tenth:]),
                   "ratio_B_over_A_last_tenth": ratio(t_ins[1][-tenth:], t_ins[0][-tenth:])},
        "lock_unlock": {"A": summary(t_lock[0]), "B": summary(t_lock[1]),
                        "ratio_B_over_A": ratio(t_lock[1], t_lock[0])},
        "list_to_i32_conversion": summary(t_conv),
        # a request handed over as a Python list: A converts it once for its match and its insert
        "request": {"A": summary(req_a), "B": summary(req_b), "ratio_B_over_A": ratio(req_b, req_a)},
        "match_passes": [],
    }
    if alloc is not None:
        out["B_allocator_calls"] = {"calls": alloc.calls, "indices": alloc.freed}
    del t_match, t_lock, t_ins, t_conv
    print(f"[{name}] built in {build_s:.0f}s: nodes A {out['nodes_A']} B {nodes_b} ({tomb_b} tombstones), "
          f"mismatches {build_bad}; insert p50 A {out['insert']['A']['p50']} B {out['insert']['B']['p50']} us, "
          f"B/A median {out['insert']['ratio_B_over_A']['median']}; request (list in) p50 A {out['request']['A']['p50']} "
          f"B {out['request']['B']['p50']} us, B/A median {out['request']['ratio_B_over_A']['median']}; "
          f"rss {rss_gib()} GiB", flush=True)

    # -- match phase: passes of each input kind; per prompt A once and B once, order alternating
    for rep in range(repeats):
        for kind in ("ndarray", "list"):
            ta, tb = [], []
            bad = not_full = 0
            for j, i in enumerate(match_idx):
                p = prompts[int(i)]
                lst = p.tolist()
                lst.append(lst[-1])
                qa = np.asarray(lst, dtype=np.int32) if kind == "ndarray" else lst
                qb = MatchPrefixParams(key=RadixKey(lst))
                if (j + rep) % 2 == 0:
                    t = clock(); ra = core.match_prefix(qa); t1 = clock(); rb = rc.match_prefix(qb); t2 = clock()
                    ta.append(t1 - t); tb.append(t2 - t1)
                else:
                    t = clock(); rb = rc.match_prefix(qb); t1 = clock(); ra = core.match_prefix(qa); t2 = clock()
                    tb.append(t1 - t); ta.append(t2 - t1)
                if not (ra.device_len == len(rb.device_indices)
                        and np.array_equal(rb.device_indices, token_indices(ra.device_pages))):
                    bad += 1
                not_full += ra.device_len != len(p)
            r = {"repeat": rep, "A_input": kind, "A": summary(ta), "B": summary(tb), "ratio_B_over_A": ratio(tb, ta),
                 "mismatches": bad, "not_whole_prompt": int(not_full)}
            out["match_passes"].append(r)
            print(f"[{name}] match rep {rep}, A given {kind:7}: A p50/p99 {r['A']['p50']}/{r['A']['p99']}  "
                  f"B {r['B']['p50']}/{r['B']['p99']} us; B/A median {r['ratio_B_over_A']['median']} "
                  f"(p10 {r['ratio_B_over_A']['p10']}, p90 {r['ratio_B_over_A']['p90']}); mismatches {bad}, "
                  f"not whole {not_full}", flush=True)
    out["load_after"] = [round(x, 1) for x in os.getloadavg()]
    del core, rc, alloc
    gc.collect()
    return out


def git_head(path: pathlib.Path):
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head or None, bool(dirty)
    except OSError:
        return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=70_000, help="prompts of the trace both trees are built from")
    ap.add_argument("--prompt-tokens", type=int, default=8192, help="tokens per prompt (a multiple of 256)")
    ap.add_argument("--matches", type=int, default=5000, help="random trace prompts matched in each pass")
    ap.add_argument("--repeats", type=int, default=3, help="match passes of each input kind (ndarray, list)")
    ap.add_argument("--layouts", default="tiny_gqa,tiny_v4", help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE,
                    help="a trace generator module with make_trace(num_prompts, prompt_tokens, page, seed)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the trace and of the prompts matched")
    ap.add_argument("--smoke", action="store_true", help="300 prompts, 300 matches, 1 repeat (seconds)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/peer_tree.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    peer = import_peer()
    if args.smoke:
        args.prompts, args.matches, args.repeats = 300, 300, 1
    out_path = args.out or default_out("peer_tree.json", args.smoke)
    if not args.trace.exists():
        print(f"peer_tree: trace {args.trace} not found (--trace)")
        sys.exit(2)
    import jax
    cpu = cpu_model()
    hc_head, hc_dirty = git_head(ROOT)
    t0 = clock()
    prompts = load_trace(args.trace)(num_prompts=args.prompts, prompt_tokens=args.prompt_tokens, page=PAGE,
                                     seed=args.seed)
    trace_s = clock() - t0
    match_idx = np.random.default_rng(args.seed + 1).integers(0, len(prompts), size=min(args.matches, len(prompts)))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "python": platform.python_version(), "numpy": np.__version__,
        "jax": jax.__version__, "cpu": cpu, "cores": os.cpu_count(), "load_at_start": [round(x, 1) for x in os.getloadavg()],
        "A": {"impl": "hicache_jax.tree.TreeCore(write_policy='write_back')", "commit": hc_head,
              "tracked_files_modified": hc_dirty},
        "B": {"impl": "sgl_jax.srt.mem_cache RadixCache (tiny_gqa) / SWARadixCache (tiny_v4)",
              "commit": os.environ.get("SGLJAX_COMMIT"), "path_from": "SGLJAX_PYTHON"},
        "trace": str(args.trace.relative_to(ROOT)) if args.trace.is_relative_to(ROOT) else str(args.trace),
        "prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
        "page": PAGE, "swa_window_tokens": WINDOW, "seed": args.seed, "trace_s": round(trace_s, 1),
        "matches": len(match_idx), "repeats": args.repeats, "gc": "enabled",
        "method": "one process; build: per prompt (a Python list of token ids) A's list->i32 conversion, then "
                  "match / lock / insert / unlock of A and B back to back, order alternating per prompt, each step "
                  "timed separately (allocation untimed); request = conversion + match + insert (B: match + insert); "
                  "match passes: the same random prompts (+1 token), per pass A given an i32 ndarray or the Python "
                  "list, B a RadixKey over the list, each side timed once per prompt, order alternating per prompt; "
                  "inputs prepared outside timers",
    }
    print(json.dumps(meta), flush=True)
    results = {"meta": meta, "layouts": []}
    for name in args.layouts.split(","):
        results["layouts"].append(run_layout(name, prompts, match_idx, args.repeats, peer))
        meta["peak_rss_gib"] = rss_gib()
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    print(f"wrote {out_path} (peak rss {meta['peak_rss_gib']} GiB)")


if __name__ == "__main__":
    main()
