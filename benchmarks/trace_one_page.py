"""Where a one-page host hit's time goes inside the runtime: a `jax.profiler` trace of
`acquire`s of a one-page prefix (all pools), summarised from the runtime's own events.

Per `acquire` (medians, µs): the Python before the load program's call, the call itself,
the time spent handing XLA host data (`DevicePut`; zero once a hit's one-page indices are
kept on the device), the program's wait before its first instruction (for the index's copy,
when there is one), launching its instructions, the largest block's
DMA on the copy engine, and everything after the call. The profiler also traces every
Python call, which slows the Python parts 2-3x; the runtime's events much less. On the CPU
the GPU-only parts are absent (null).

    python benchmarks/trace_one_page.py --out trace_one_page.json        # V4-Flash (GPU)
    python benchmarks/trace_one_page.py --smoke --out trace.json         # tiny_v4, CPU, seconds
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import statistics
import sys
import tempfile
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
import bench_api  # noqa: E402  (the same cache and prefix as the public-path benchmark)

MARK = "one-page acquire"
CALL = "PjitFunction(jit(plan_load))"


def hits(config: str, rounds: int, trace_dir: str) -> None:
    cache = bench_api.make_cache(config, 4)
    tokens, written = bench_api.insert_prefix(cache, 1, seed=0)

    def hit():
        cache.evict(10 ** 6, 10 ** 6)
        cache.drain()
        jax.block_until_ready(cache.device_pools)
        with jax.profiler.TraceAnnotation(MARK):
            prefix = cache.acquire(tokens)
        return prefix

    for _ in range(5):   # compile and warm up outside the trace
        prefix = hit()
        cache.unlock(prefix.lock)
    if not bench_api.same_bytes(cache, prefix, written):
        sys.exit("trace_one_page: restored bytes differ from what was written")
    jax.profiler.start_trace(trace_dir)
    for _ in range(rounds):
        cache.unlock(hit().lock)
    jax.profiler.stop_trace()
    cache.close()


def summary(trace_dir: str) -> dict:
    path = next(pathlib.Path(trace_dir).rglob("*.trace.json.gz"))
    raw = json.load(gzip.open(path))
    events = sorted((e for e in raw["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in raw["traceEvents"]
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    parts: dict[str, list[float]] = {}
    for a in (e for e in events if e["name"] == MARK):
        lo, hi = a["ts"], a["ts"] + a["dur"]
        inside = [e for e in events if lo <= e["ts"] <= hi + 100 and e is not a]
        first = lambda name: next((e for e in inside if e["name"] == name), None)
        call = first(CALL)
        run, ready = first("[0] PjRtStreamExecutorRawLoadedExecutable::Execute"), first("Resolve constant globals")
        thunks = first("[0] GpuExecutable::ExecuteThunks")
        dmas = [e["dur"] for e in inside if "MemcpyH2D" in e["name"]
                and threads.get((e["pid"], e["tid"]), "").startswith("Stream")]
        got = {"acquire": a["dur"],
               "python_before_call": call["ts"] - lo if call else None,
               "call": call["dur"] if call else None,
               "index_device_put": sum(e["dur"] for e in inside if e["name"] == "DevicePut"),
               "wait_for_index_copy": ready["ts"] - run["ts"] if run and ready else None,
               "instructions_launch": thunks["dur"] if thunks else None,
               "largest_block_dma": max(dmas) if dmas else None,
               "after_call": hi - call["ts"] - call["dur"] if call else None}
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
    median = lambda vs: None if None in vs else round(statistics.median(vs), 1)
    return {"acquires": len(parts.get("acquire", [])), "median_us": {k: median(v) for k, v in parts.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="deepseek_v4_flash", help="model config (configs/NAME.json)")
    ap.add_argument("--rounds", type=int, default=30, help="one-page hits traced")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, 3 rounds: CPU, seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/trace_one_page.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.config, args.rounds = "tiny_v4", 3
    args.out = args.out or default_out("trace_one_page.json", args.smoke)
    with tempfile.TemporaryDirectory() as trace_dir:
        hits(args.config, args.rounds, trace_dir)
        result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]),
                  "config": args.config, "rounds": args.rounds, **summary(trace_dir)}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    for k, v in result["median_us"].items():
        print(f"{k:22} {'-' if v is None else f'{v:9.1f} us'}")


if __name__ == "__main__":
    main()
