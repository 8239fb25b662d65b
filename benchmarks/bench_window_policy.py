"""Host bytes per cached token against hit rate, for each window policy, on the decode workload.

Runs the requests of `examples/decode.py` through the cache once per (config, write
policy, window policy), and once with no cache per config (every policy's tokens and
logits must equal that run's). Per run: the bytes written to the host tier per token
backed up, the SWA pages backed up per kv page, and the hit rate (prompt tokens found on
device or host / prompt tokens served). The tiny models' window pages have the same page
size (256 tokens) and window (1 page) as DeepSeek V4-Flash, so the SWA pages per kv page
carry over; the V4-Flash column prices them at its real page sizes (from its layout):

    V4-Flash bytes per token = (kv page bytes + SWA page bytes * SWA pages per kv page) / 256

    python benchmarks/bench_window_policy.py --out window_policy.json     # CPU, minutes
    python benchmarks/bench_window_policy.py --smoke --out result.json    # CPU, seconds
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hicache_jax as hc  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

# decode.py's own defaults (a 512-token system prompt: 2 pages; turns of about one page), a
# longer system prompt of 7 whole pages and a bit, whose boundary no small N divides, and
# long turns (2-4K-token first messages, ~3-page follow-ups)
WORKLOADS = {
    "decode": [],
    "long_system": ["--system-tokens", "1800", "--max-pages", "16", "--device-pages", "16", "--host-pages", "128"],
    "long_turns": ["--system-tokens", "1800", "--user-tokens", "2000", "--followup-tokens", "700",
                   "--max-pages", "32", "--device-pages", "32", "--host-pages", "256"],
}
SMOKE = {"decode": ["--requests", "6", "--turns", "2", "--gen-tokens", "4", "--preempt-every", "3"]}
POLICIES = "every,ends,ends+every_2,ends+every_4,ends+every_8,ends+every_16"


def flash_bytes_per_token(layout: hc.PoolLayout, window_per_kv: float) -> float:
    """Host bytes per cached token of `layout` when `window_per_kv` SWA pages go with each kv page."""
    kv = layout.page_bytes_of(layout.anchor.name)
    swa = layout.page_bytes_of(layout.swa_pool.name) if layout.swa_pool else 0
    return (kv + swa * window_per_kv) / layout.page_size


def run_config(config: str, workload: str, extra: list[str], write_policies: list[str], policies: list[str],
               flash: hc.PoolLayout) -> list[dict]:
    from examples import decode
    from examples.tiny_models import make_model
    base = ["--config", str(ROOT / "configs" / f"{config}.json"), "--quiet", *extra]
    args = decode.parse_args(base)
    model = make_model(args.layout, seed=args.seed, max_pages=args.max_pages)
    cache = decode.make_cache(args)
    decode.warm_up(model, cache)
    plain = decode.serve(args, model, cache, pools=cache.empty_device_pools())   # the same for every policy
    cache.close()
    runs = []
    for write in write_policies:
        for name in policies:
            args = decode.parse_args([*base, "--write-policy", write, "--window-policy", name])
            cache = decode.make_cache(args)
            cache.warmup(args.max_pages)
            decode.warm_up(model, cache)
            t0 = time.perf_counter()
            outs = decode.serve(args, model, cache)
            seconds = time.perf_counter() - t0
            r = decode.outcome_fields(cache, outs, plain)
            cache.close()
            per_kv = r["backup_window_tokens"] / r["backup_tokens"] if r["backup_tokens"] else 0.0
            runs.append({
                "config": config, "workload": workload, "write_policy": write, "window_policy": args.policy.name,
                "identical": r["identical"], "hit_tokens": r["hit_tokens"], "hit_rate": r["hit_rate"],
                "prompt_tokens": r["hit_tokens"] + r["recomputed_tokens"],
                "device_hit_tokens": r["device_hit_tokens"], "host_hit_tokens": r["host_hit_tokens"],
                "backup_tokens": r["backup_tokens"], "backup_window_tokens": r["backup_window_tokens"],
                "backup_bytes": r["backup_bytes"], "load_bytes": r["load_bytes"],
                "host_bytes_per_cached_token": r["host_bytes_per_cached_token"],
                "window_pages_per_kv_page": round(per_kv, 4),
                "flash_host_bytes_per_cached_token": round(flash_bytes_per_token(flash, per_kv), 1),
                "dropped_tokens": r["dropped_tokens"], "seconds": round(seconds, 2)})
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="tiny_v4,tiny_v41", help="model configs (configs/NAME.json), comma-separated")
    ap.add_argument("--write-policies", default="write_through,write_back",
                    help="decode.py's --write-policy values, comma-separated")
    ap.add_argument("--policies", default=POLICIES, help="window policies, comma-separated")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {list(WORKLOADS)}, comma-separated")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, a short workload, three policies")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/window_policy.json, or .../smoke/ with --smoke)")
    args = ap.parse_args(argv)
    args.out = args.out or default_out("window_policy.json", args.smoke)
    configs, writes, policies = (s.split(",") for s in (args.configs, args.write_policies, args.policies))
    for name in policies:
        try:
            hc.WindowPolicy.parse(name)
        except ValueError as e:
            ap.error(f"--policies: {e}")
    unknown = sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        ap.error(f"--workloads: no workload {unknown[0]!r} (workloads: {list(WORKLOADS)})")
    workloads = {w: WORKLOADS[w] for w in args.workloads.split(",")}
    if args.smoke:
        configs, writes, workloads = ["tiny_v4"], ["write_back"], SMOKE
        policies = ["every", "ends", hc.DEFAULT_WINDOW_POLICY]
    import jax
    flash = hc.build_layout(hc.load_model_config(ROOT / "configs" / "deepseek_v4_flash.json"))
    results = {"jax": jax.__version__, "device": str(jax.devices()[0]), "machine": platform.machine(),
               "cpus": os.cpu_count(), "default": hc.DEFAULT_WINDOW_POLICY,
               "flash_page_bytes": {"kv": flash.page_bytes_of(flash.anchor.name),
                                    "swa": flash.page_bytes_of(flash.swa_pool.name)},
               "runs": []}
    print(f"{'config':9} {'workload':12} {'write':14} {'window policy':14} {'same':>5} {'hit rate':>8} "
          f"{'SWA/kv':>6} {'B/token':>8} {'V4-Flash B/token':>16}")
    for config in configs:
        for workload, extra in workloads.items():
            for r in run_config(config, workload, extra, writes, policies, flash):
                results["runs"].append(r)
                print(f"{config:9} {workload:12} {r['write_policy']:14} {r['window_policy']:14} "
                      f"{str(r['identical']):>5} {r['hit_rate']:8.3f} {r['window_pages_per_kv_page']:6.2f} "
                      f"{r['host_bytes_per_cached_token']:8.0f} {r['flash_host_bytes_per_cached_token']:16,.0f}",
                      flush=True)
            with open(args.out, "w") as f:      # after every workload: a cut-off run keeps what it has
                json.dump(results, f, indent=1)
    print(f"wrote {args.out}")
    return 0 if all(r["identical"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
