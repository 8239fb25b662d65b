"""Time to first token with HiCache vs full recompute, from the decode example.

Runs `examples/decode.py` for each config at larger sizes and summarises the requests
whose prompt was served from the host tier: their time to first token with the cache
against the same request recomputed, and the bytes moved. Writes JSON.

    python benchmarks/bench_decode.py              # GPU sizes (16K-token context)
    python benchmarks/bench_decode.py --smoke      # CPU, seconds
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples import decode  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

LARGE = ["--requests", "24", "--turns", "3", "--system-tokens", "8192", "--user-tokens", "2048",
         "--followup-tokens", "512", "--gen-tokens", "16", "--max-pages", "64", "--device-pages", "64",
         "--host-pages", "512", "--preempt-every", "0"]
SMOKE = ["--requests", "6", "--turns", "2", "--gen-tokens", "4", "--preempt-every", "0"]


def run(config: str, policy: str, extra: list[str]) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = decode.main(["--config", str(ROOT / "configs" / f"{config}.json"), "--write-policy", policy,
                            "--quiet", *extra])
    result = json.loads(buf.getvalue().strip().splitlines()[-1])
    result["exit"] = code
    hits = [i for i, h in enumerate(result["host_hit_per_request"]) if h > 0]
    if hits:
        cache = [result["ttft_ms_cache"][i] for i in hits]
        plain = [result["ttft_ms_recompute"][i] for i in hits]
        result["host_hit_requests"] = len(hits)
        result["ttft_ms_host_hit_median"] = statistics.median(cache)
        result["ttft_ms_recompute_median"] = statistics.median(plain)
        result["host_hit_tokens_median"] = statistics.median(result["host_hit_per_request"][i] for i in hits)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="tiny_v4,tiny_gqa,tiny_v41",
                    help="model configs (configs/NAME.json), comma-separated: one decode.py run each")
    ap.add_argument("--policy", default="write_through", help="decode.py's --write-policy")
    ap.add_argument("--smoke", action="store_true", help="decode.py's small sizes: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_decode.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    args.out = args.out or default_out("bench_decode.json", args.smoke)
    import jax
    results = {"jax": jax.__version__, "device": str(jax.devices()[0]), "runs": []}
    print(f"{'config':10} {'identical':>9} {'host-hit reqs':>13} {'hit tokens':>10} {'TTFT cache ms':>13} "
          f"{'TTFT recompute ms':>17} {'backup MB':>9} {'load MB':>8}")
    for config in args.configs.split(","):
        r = run(config, args.policy, SMOKE if args.smoke else LARGE)
        results["runs"].append(r)
        with open(args.out, "w") as f:      # after every config: a cut-off run keeps what it has
            json.dump(results, f, indent=1)
        print(f"{config:10} {str(r['identical']):>9} {r.get('host_hit_requests', 0):>13} "
              f"{r.get('host_hit_tokens_median', 0):>10} {r.get('ttft_ms_host_hit_median', float('nan')):>13.2f} "
              f"{r.get('ttft_ms_recompute_median', float('nan')):>17.2f} {r['backup_bytes'] / 1e6:>9.1f} "
              f"{r['load_bytes'] / 1e6:>8.1f}", flush=True)
    print(f"wrote {args.out}")
    return 0 if all(r["identical"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
