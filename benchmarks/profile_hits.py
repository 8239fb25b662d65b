"""The device timeline of traffic-shaped host hits: `bench_hits.py`'s modes run under
`jax.profiler.trace`, and the trace summarised where the time goes on the accelerator.

For each (mode, pages, requests) it runs `bench_hits.run` (every hit byte-checked, paired
with a contiguous copy), its measured rounds inside a profiler trace written as a Perfetto
JSON (`marked_calls`: how many calls of each side the trace holds), then keeps the
device events grouped by name (count, median and total microseconds) and, for each timed
side (`hit`; the batched mode's `one_by_one` and `acquire_many`), the device events of its
last call, in order: its DMAs, slice fusions, joins and unpack kernels (`hits`), and each
stream's count, first start, last end and busy time in that window (`streams`), and the
host's events of at least `HOST_MIN_US` inside the call (`host`: the Python, the copies
handed to the runtime, the waits, on which thread and when; the first `HOST_KEPT`) and every
jitted program's call in it (`program_calls`: when each was called and how long the call
held the host). A timed
call is marked on the host's timeline (`hit.<side>`, `hit_requests.Probe.time`, from the
call to the device done), so its window holds the early copies and reads it started before
its load program. Without marks the last hit's window is anchored on a load program
(`load_block`, `load_pieces`, `plan_load`, `fused_load`): from the host's last call of one
(a host event whose name or arguments carry the program's function or module name), else
back from the last device event named after one, else back from the trace's end (`anchor`
says which). On a CPU the trace has no device events; the run still checks that it works.

    python benchmarks/profile_hits.py --out profile_hits.json      # V4-Flash: whole block vs parts
    python benchmarks/profile_hits.py --smoke --out profile_hits.json
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import gzip
import json
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_hits  # noqa: E402
from hit_requests import HIT_MARK  # noqa: E402  (the host's mark of a timed call, Probe.time)
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

# (mode, kv pages per prefix, requests): a whole block against the hits on parts of blocks
RUNS = [("whole_block", 256, 1), ("shared_prompt", 256, 1), ("multi_turn", 256, 1), ("batched", 16, 16),
        ("whole_block", 1, 1), ("shared_prompt", 1, 1)]
SMOKE_RUNS = [("shared_prompt", 4, 1), ("batched", 1, 4)]   # tiny_v4, one round (CPU, CI)
WINDOW_US = 15_000
LOAD_PROGRAMS = ("load_block", "load_pieces", "plan_load", "fused_load")
LEAD_US = 500            # a side's window starts this long before its call
HOST_MIN_US = 20         # a marked call's host events kept: those at least this long
HOST_KEPT = 600          # and at most this many


def timelines(trace: dict) -> tuple[list[dict], list[dict], dict]:
    """The complete events on accelerator timelines and on the host's, each by time, and
    {(pid, tid): thread name}."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    complete = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    on_device = [e for e in complete if "/device:" in processes.get(e.get("pid"), "")]
    on_host = [e for e in complete if "/device:" not in processes.get(e.get("pid"), "")]
    return on_device, on_host, threads


def _window(events: list[dict], host: list[dict]) -> tuple[float, float, str]:
    """(start, end, anchor) of the last hit's window: from the host's last call of a load
    program (a jit's host event carries its function's name; on a GPU the device events carry
    fusion names), or else back from the end of the last device event so named, or else
    back from the trace's end."""
    named = lambda e: e["name"] + json.dumps(e.get("args", {}))      # XLA puts the module's name in args
    calls = [e for e in host if any(name in named(e) for name in LOAD_PROGRAMS)]
    if calls:
        return calls[-1]["ts"], calls[-1]["ts"] + WINDOW_US, "host: " + calls[-1]["name"][:100]
    loads = [e for e in events if any(name in e["name"] for name in LOAD_PROGRAMS)]
    last = max(loads or events, key=lambda e: e["ts"] + e["dur"])
    end = last["ts"] + last["dur"]
    return end - WINDOW_US, end, last["name"][:100] if loads else "trace end"


def _events(events: list[dict], threads: dict, start: float, end: float, at: float) -> list[dict]:
    """The device events starting in [start, end), times from `at`."""
    return [{"at_us": round(e["ts"] - at, 1), "dur_us": round(e["dur"], 1),
             "stream": str(threads.get((e["pid"], e["tid"]), e["tid"])), "name": e["name"][:100]}
            for e in events if start <= e["ts"] < end]


def _host_events(host: list[dict], threads: dict, mark: dict, keep) -> list[dict]:
    """The host's events inside the marked call `mark` that `keep(event)` keeps, times from it."""
    end = mark["ts"] + mark["dur"]
    return [{"at_us": round(e["ts"] - mark["ts"], 1), "dur_us": round(e["dur"], 1),
             "thread": str(threads.get((e["pid"], e["tid"]), e["tid"])), "name": e["name"][:100]}
            for e in host if mark["ts"] <= e["ts"] < end and e is not mark and keep(e)]


def streams(events: list[dict]) -> dict[str, dict]:
    """Per stream of a window's events (times from the call): how many, the first start, the
    last end, and the time busy (overlaps counted once): the gaps between a call's DMAs and its
    kernels, and when its last work ended."""
    out = {}
    for name in sorted({e["stream"] for e in events}):
        spans = sorted((e["at_us"], e["at_us"] + e["dur_us"]) for e in events if e["stream"] == name)
        busy, reach = 0.0, spans[0][0]
        for start, end in spans:
            busy += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        out[name] = {"count": len(spans), "first_us": spans[0][0], "last_end_us": round(reach, 1),
                     "busy_us": round(busy, 1)}
    return out


def summarise(trace: dict) -> dict:
    events, host, threads = timelines(trace)
    by_name = collections.defaultdict(list)
    for e in events:
        by_name[e["name"][:100]].append(e["dur"])
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:40]
    marked = [e for e in host if e["name"].startswith(HIT_MARK)]
    marks = {e["name"][len(HIT_MARK):]: e for e in marked}          # each side's last
    seen_calls = collections.Counter(e["name"][len(HIT_MARK):] for e in marked)
    hits = {}
    for side, e in (marks.items() if events else ()):
        seen = _events(events, threads, e["ts"] - LEAD_US, e["ts"] + e["dur"], e["ts"])
        hits[side] = {"call_us": round(e["dur"], 1), "streams": streams(seen), "events": seen[:200],
                      "program_calls": _host_events(host, threads, e, lambda h: h["name"].startswith("PjitFunction")),
                      "host": _host_events(host, threads, e, lambda h: h["dur"] >= HOST_MIN_US)[:HOST_KEPT]}
    window, anchor, from_call = [], None, True
    if hits:                                                     # the last marked call
        side = max(marks, key=lambda k: marks[k]["ts"])
        anchor, window = HIT_MARK + side, hits[side]["events"]
    elif events:
        start, end, anchor = _window(events, host)
        from_call = anchor.startswith("host: ")                  # times from the call, or to the end
        window = _events(events, threads, start, end, start if from_call else end)
    return {"device_events": len(events), "anchor": anchor, "marked": sorted(marks), "marked_calls": dict(seen_calls),
            "by_name": [{"name": n, "count": len(d), "median_us": round(statistics.median(d), 1),
                         "total_us": round(sum(d), 1)} for n, d in top],
            "last_hit": window[:120] if from_call else window[-120:], "hits": hits}


def profiled(config: str, mode: str, pages: int, n: int, rounds: int, transfer: dict | None = None) -> dict:
    """One run of `bench_hits.run`, its measured rounds traced (not the warm-up: its
    compilations fill the trace, and a trace that drops events keeps the wrong last call)."""
    import jax
    with tempfile.TemporaryDirectory() as folder:
        with contextlib.ExitStack() as tracing:      # the trace, once started, stops with the run
            start = lambda: tracing.enter_context(jax.profiler.trace(folder, create_perfetto_trace=True))
            row = bench_hits.run(config, mode, pages, rounds, n, 0, 1 << 40, transfer, on_measured=start)
        files = glob.glob(f"{folder}/**/perfetto_trace.json.gz", recursive=True)
        if not files:
            raise RuntimeError(f"the profiler wrote no Perfetto trace under {folder}")
        with gzip.open(files[0]) as f:
            summary = summarise(json.load(f))
    keep = ("ms", "contiguous_ms", "ratio", "exact", "dispatches")
    # the batched mode times both sides (its top-level figures are the one-by-one side's)
    sides = {side: {k: row[side].get(k) for k in ("ms", "ratio", "dispatches", "first_call_ms", "calls_ms", "held_ms",
                                                    "waited_ms", "returned_ms")}
             for side in ("one_by_one", "acquire_many") if side in row}
    return {"config": config, "mode": mode, "pages": pages, "batch": n, "rounds": rounds, "transfer": transfer or {},
            **{k: row.get(k) for k in keep}, **({"sides": sides} if sides else {}), **summary}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="deepseek_v4_flash", help="model config (configs/NAME.json)")
    ap.add_argument("--rounds", type=int, default=4, help="measured rounds per run (each hit is traced)")
    ap.add_argument("--runs", default=None,
                    help="MODE:PAGES:REQUESTS, comma-separated (default: " + ",".join(":".join(map(str, r)) for r in RUNS) + ")")
    ap.add_argument("--early-copy-mb", type=float, default=None,
                    help="TransferConfig.early_copy_bytes in MB (larger than any block: no early copies)")
    ap.add_argument("--smoke", action="store_true", help="tiny_v4, one and four pages, one round (CPU, CI; --runs given overrides its runs)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="result JSON (default: benchmarks/results/profile_hits.json, or $OUT)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        runs = [(m, int(p), int(n)) for m, p, n in (r.split(":") for r in args.runs.split(","))] if args.runs else RUNS
    except ValueError:
        ap.error(f"--runs: MODE:PAGES:REQUESTS, comma-separated, got {args.runs!r}")
    if unknown := [m for m, _, _ in runs if m not in (*bench_hits.SHAPES, "batched")]:
        ap.error(f"--runs: unknown mode {unknown[0]!r}")
    if args.smoke and not args.runs:                  # runs given override the smoke run's
        runs = SMOKE_RUNS
    transfer = bench_hits.transfer_overrides(ap, None, args.early_copy_mb)
    config, rounds = ("tiny_v4", 1) if args.smoke else (args.config, args.rounds)
    import jax
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].device_kind,
              "runs": []}
    out = args.out or default_out("profile_hits.json", args.smoke)
    for mode, pages, n in runs:
        r = profiled(config, mode, pages, n, rounds, transfer)
        result["runs"].append(r)
        sides = "".join(f", {side} {v['ms']} ms ({v['ratio']})" for side, v in r.get("sides", {}).items())
        print(f"{mode:14} {pages:4} pages x {n:2}: {r['ms']} ms, ratio {r['ratio']}{sides}, "
              f"{r['device_events']} device events", flush=True)
        pathlib.Path(out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
