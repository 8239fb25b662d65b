"""Time one Gemma 3 forward per chunk size: what prefill and decode cost with each.

Every forward of the chat example (prefill and decode) has the same fixed chunk shape, so
a decode step costs a whole chunk and a prefill pays one call per chunk. This times one
call of each chunk size, with and without the 262,144-wide head (prefill chunks before the
last skip it), on the real architecture with random weights (no GGUF needed) at a position
on page 2 with a 4-page context. Writes JSON.

    python benchmarks/bench_gemma_chunk.py                 # gemma3_270m, chunks 8..64
    python benchmarks/bench_gemma_chunk.py --smoke         # tiny_gemma3, seconds
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hicache_jax as hc  # noqa: E402
from examples.gemma.model import GemmaModel  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

MAX_PAGES = 4


def time_calls(model: GemmaModel, logits: bool, reps: int) -> float:
    """Median seconds of one forward_chunk call (full chunk, page 2), blocking on its results."""
    pools = {k: jnp.zeros(s, d) for k, (s, d) in model.pool_shapes(MAX_PAGES, MAX_PAGES).items()}
    table = np.arange(MAX_PAGES, dtype=np.int32)
    tokens = np.ones(model.chunk_size, np.int32)
    times = []
    for i in range(reps + 1):                    # the first call compiles
        start = 2 * model.page_size + (i % (model.page_size // model.chunk_size)) * model.chunk_size
        t0 = time.perf_counter()
        pools, out = model.forward_chunk(pools, table, table, tokens, start, model.chunk_size, logits=logits)
        jax.block_until_ready((pools, out))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny_gemma3, 2 calls per chunk size: seconds")
    ap.add_argument("--chunks", default="8,16,32,64", help="chunk sizes (positions per forward), comma-separated")
    ap.add_argument("--reps", type=int, default=7, help="timed calls per chunk size (the median is reported)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_gemma_chunk.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    args.out = args.out or default_out("bench_gemma_chunk.json", args.smoke)
    name = "tiny_gemma3" if args.smoke else "gemma3_270m"
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{name}.json"))
    base = GemmaModel.random(layout, seed=0, max_pages=MAX_PAGES)
    results = {"config": name, "jax": jax.__version__, "device": str(jax.devices()[0]), "cpus": os.cpu_count(),
               "load_average": os.getloadavg()[0], "runs": []}
    print(f"{name}: {'chunk':>5} {'call ms':>8} {'no head ms':>10} {'decode ms/token':>15} {'prefill ms/token':>16}")
    for chunk in (int(c) for c in args.chunks.split(",")):
        model = GemmaModel(layout, base.module, max_pages=MAX_PAGES, chunk_size=chunk)
        reps = 2 if args.smoke else args.reps
        full, body = time_calls(model, True, reps), time_calls(model, False, reps)
        run = {"chunk": chunk, "call_ms": 1e3 * full, "no_head_ms": 1e3 * body,
               "decode_ms_per_token": 1e3 * full, "prefill_ms_per_token": 1e3 * body / chunk}
        results["runs"].append(run)
        print(f"{'':{len(name) + 1}} {chunk:>5} {run['call_ms']:>8.1f} {run['no_head_ms']:>10.1f} "
              f"{run['decode_ms_per_token']:>15.1f} {run['prefill_ms_per_token']:>16.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
