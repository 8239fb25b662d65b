"""The decode matrix's table for BENCHMARKS.md, from the JSON lines the GPU suite writes.

`tests/gpu/test_decode_gpu.py` appends each case's JSON (examples/decode.py's last line, with
the case's seed, pages and layer groups) to the file `HICACHE_GPU_RESULTS` names; `.ci/gpu
suite` sets it. Per case this prints whether it was identical, what it compiled while
serving, how many deferred loads the step landed, and the cached run's TTFT (median, p99,
max and max / median over every request; p99 by rank, the
request at or above 99 % of them), the recompute run's max / median (the same process
serving the same requests with no cache: over the bound too, the device was slow, not
the cache), with the host-hit requests' median TTFT in the
cached and in the recompute run, and how much of the slowest request's TTFT the garbage
collector took (examples/gc_pauses.py), how many transfer programs it ran for the
first time in the process (examples/program_runs.py), which request it was, its host hit
and the time of the cache's calls before its first forward (step, acquire, alloc).

    python benchmarks/decode_table.py benchmarks/results/gpu/decode_gpu.jsonl
    python benchmarks/decode_table.py RESULTS.jsonl --out table.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import numpy as np

BOUND = 2.0     # what a served TTFT should keep after warm-up: its max at most this many times the median
COLUMNS = ("config", "seed", "device/host pages", "write policy", "layer groups", "identical",
           "compiles while serving", "landed by the step", "TTFT median / p99 / max", "max / median",
           "recompute max / median",
           "host hits: cache median", "same requests, recompute median", "GC in the slowest request (ms)",
           "programs first run in the slowest request", "slowest request: # / host-hit tokens / cache calls (ms)")


def summarise(case: dict) -> dict:
    """One table row's values from one case's JSON line."""
    cached, recompute = case["ttft_ms_cache"], case["ttft_ms_recompute"]
    hits = [i for i, h in enumerate(case["host_hit_per_request"]) if h > 0]
    median = statistics.median(cached)
    gc_ms = case.get("gc_ms_in_ttft_cache")      # absent in results of before the GC was timed
    slowest = cached.index(max(cached))
    calls_ms = case.get("cache_calls_ms_in_ttft")  # absent in results of before the cache's calls were timed
    return {
        "config": case["config"], "seed": case["seed"], "device_pages": case["device_pages"],
        "host_pages": case["host_pages"], "write_policy": case["write_policy"],
        "layer_groups": case["layer_groups"], "identical": case["identical"],
        "compiles_while_serving": case["compiles_while_serving"],
        "landed_by_step": case.get("deferred_loads", {}).get("step", 0),
        "ttft_ms": {"median": median, "p99": float(np.percentile(cached, 99, method="higher")), "max": max(cached)},
        "max_over_median": max(cached) / median,
        "recompute_max_over_median": max(recompute) / statistics.median(recompute),
        "host_hit_requests": len(hits),
        "host_hit_ttft_ms_median": {"cache": statistics.median(cached[i] for i in hits) if hits else None,
                                    "recompute": statistics.median(recompute[i] for i in hits) if hits else None},
        "gc_ms_slowest": None if gc_ms is None else gc_ms[slowest],
        "first_runs_slowest": None if "first_program_runs_in_ttft" not in case
        else case["first_program_runs_in_ttft"][slowest],
        "slowest": {"request": slowest, "host_hit_tokens": case["host_hit_per_request"][slowest],
                    "cache_calls_ms": None if calls_ms is None else calls_ms[slowest]},
    }


def markdown(rows: list[dict]) -> str:
    def ms(v):
        return "—" if v is None else f"{v:.1f}"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * 6 + "---:|" * 2 + "---|" + "---:|" * 6 + "---|"]
    for r in rows:
        t, h, w = r["ttft_ms"], r["host_hit_ttft_ms_median"], r["slowest"]
        lines.append("| " + " | ".join(map(str, (
            r["config"], r["seed"], f"{r['device_pages']}/{r['host_pages']}", r["write_policy"],
            "blocking" if r["layer_groups"] is None else r["layer_groups"],
            "yes" if r["identical"] else "**no**", r["compiles_while_serving"], r["landed_by_step"],
            f"{t['median']:.1f} / {t['p99']:.1f} / {t['max']:.1f}", f"{r['max_over_median']:.2f}",
            f"{r['recompute_max_over_median']:.2f}",
            ms(h["cache"]), ms(h["recompute"]), ms(r["gc_ms_slowest"]),
            "—" if r["first_runs_slowest"] is None else r["first_runs_slowest"],
            f"{w['request']} / {w['host_hit_tokens']} / {ms(w['cache_calls_ms'])}"))) + " |")
    return "\n".join(lines)


def bound_line(rows: list[dict]) -> str:
    """How many cases hold the TTFT bound (max <= 2 x median), naming those that do not."""
    over = [f"{r['config']} {r['seed']} {r['write_policy']} {r['layer_groups'] or 'blocking'}: "
            f"{r['max_over_median']:.2f} (request {r['slowest']['request']})"
            for r in rows if r["max_over_median"] > BOUND]
    slow = sum(r["recompute_max_over_median"] > BOUND for r in rows)
    return (f"TTFT max <= {BOUND:g} x median in {len(rows) - len(over)} of {len(rows)} cases"
            + (f"; over: {'; '.join(over)}" if over else "")
            + f"; the recompute runs (no cache, same processes) over it in {slow} of {len(rows)}")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=pathlib.Path, help="the JSON lines file HICACHE_GPU_RESULTS named")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    try:
        cases = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        ap.error(f"cannot read {args.results}: {e}")
    if not cases:
        ap.error(f"{args.results} holds no case")
    order = lambda c: (c["config"], c["seed"], c["write_policy"], -1 if c["layer_groups"] is None else c["layer_groups"])
    rows = [summarise(c) for c in sorted(cases, key=order)]
    print(markdown(rows))
    print(bound_line(rows), file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
