"""Replay a request trace through a continuous-batching loop: HiCache, device-only, no cache.

    python examples/serve_trace.py --trace traces/conversation_trace.jsonl.gz \\
        --config configs/tiny_v4.json --limit 48 --max-input-tokens 2048

Requests of a Mooncake-format trace (traces/README.md) arrive by their timestamps (times
--time-scale), join a running batch of up to --max-batch sequences that one jitted step
computes together (prefill chunks beside decode steps), and leave when they have their
tokens. Prompts are token ids made from the trace's hash ids, so requests share exactly
the prefixes the trace says they share. The same replay runs three times, with the same
model step, device pages and scheduler (examples/batching):

    hicache       device pages backed by a host tier: evicted prefixes load back
    device_only   the same device pages as a prefix cache with no host tier
    no_cache      every request computes its whole prompt

and reports per run TTFT p50/p90/p99, inter-token latency, output tokens per second,
prompt tokens found per tier, bytes moved per link, and compilations while serving.
A sample of requests (--check) is recomputed alone and must be bit-identical (tokens and
logits) in every run; every request is compared across the runs too. Progress goes to
stderr; the last line is JSON; exit status 0 only when everything is identical.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

import hicache_jax as hc  # noqa: E402
from pallas_kernels import IMPLS, resolve  # noqa: E402
from examples import gc_pauses  # noqa: E402
from examples.batching.check import check, sample_indices  # noqa: E402
from examples.batching.loop import StepRecord, serve, warm_up  # noqa: E402
from examples.batching.modes import CacheCalls, CacheKind, make_cache  # noqa: E402
from examples.batching.scheduler import ADMISSIONS  # noqa: E402
from examples.batching.report import ratios, summarize, table  # noqa: E402
from examples.batching.workload import load_jobs  # noqa: E402
from hicache_jax.trace import BLOCK_TOKENS  # noqa: E402

GEMMA_270M = "gemma-3-270m"     # the config whose weights come from the GGUF file (chat.py's)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):     # one line, naming the flag and the value; nothing else
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, each checked (and the trace read) before any work starts."""
    ap = Parser(prog="serve_trace.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = " (default: %(default)s)"
    ap.add_argument("--trace", required=True, help="Mooncake-format trace: JSON lines, plain or .gz")
    ap.add_argument("--config", required=True, help="model config (tiny_v4, tiny_v41, tiny_gqa, tiny_gemma3, gemma3_270m)")
    ap.add_argument("--limit", type=int, default=None, help="serve the first N requests (default: all)")
    ap.add_argument("--max-batch", type=int, default=8, help="slots of the batched step" + d)
    ap.add_argument("--max-input-tokens", type=int, default=None, help="cut each prompt to its first T tokens")
    ap.add_argument("--max-output-tokens", type=int, default=16,
                    help="cut each request's output_length to T tokens" + d)
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="arrival = trace timestamp x X (0.5: twice as fast)" + d)
    ap.add_argument("--check", type=int, default=3, help="requests recomputed alone and compared bit for bit" + d)
    ap.add_argument("--plot", default=None, metavar="PNG", help="write TTFT CDFs and throughput over time there")
    ap.add_argument("--steps-out", default=None, metavar="JSON",
                    help="write every step of every run there (wall time by part, batch, transfer programs)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars or per-run lines")
    ap.add_argument("--device-pages", type=int, default=None,
                    help="device pages per allocator (default: half of what --max-batch requests of the "
                         "longest length need, at least one such request: under load the newest are preempted, or "
                         "with --admission reserve fewer run at once)")
    ap.add_argument("--host-pages", type=int, default=None, help="host pages per allocator (default: 8 x device)")
    ap.add_argument("--write-policy", default="write_through", choices=[p.value for p in hc.WritePolicyName],
                    help="when the HiCache run backs pages up" + d)
    ap.add_argument("--window-policy", default=None, metavar="POLICY",
                    help="stop points that keep their SWA pages (default: ends+every_N, N pages = one "
                         f"{BLOCK_TOKENS}-token trace block)")
    ap.add_argument("--admission", default="eager", choices=ADMISSIONS,
                    help="eager: admit a request when its first chunk fits (the newest are preempted as the "
                         "device fills); reserve: when the device can hold all of its pages beside what the "
                         "running ones will still take (fewer at once, no preemption)" + d)
    ap.add_argument("--schedule-ahead", action=argparse.BooleanOptionalAction, default=True,
                    help="schedule each step (admissions, acquires, loads) while the device computes the one "
                         "before; the step computes every slot, spare slots on one more device page "
                         "(examples/batching/loop.py); --no-schedule-ahead: each step in turn" + d)
    ap.add_argument("--fuse-after", type=int, default=hc.TransferConfig().fuse_after, metavar="N",
                    help="HiCache run: compile a load shape's one program at its N-th sighting, 0: never "
                         "(TransferConfig.fuse_after)" + d)
    ap.add_argument("--kernels", default="auto", choices=IMPLS,
                    help="HiCache run: the pack / unpack kernels (TransferConfig.kernels)" + d)
    ap.add_argument("--recompute-us-per-token", type=float, default=None, metavar="US",
                    help="HiCache run: load a host hit only if its bytes over the link plus --load-overhead-us "
                         "take less than recomputing its tokens at US microseconds each "
                         "(HiCacheConfig.recompute_seconds_per_token; default: load every hit)")
    ap.add_argument("--load-overhead-us", type=float, default=0.0, metavar="US",
                    help="HiCache run, with --recompute-us-per-token: the host time any load costs "
                         "(HiCacheConfig.load_overhead_seconds)" + d)
    ap.add_argument("--seed", type=int, default=0, help="seed of random weights and of token ids" + d)
    ap.add_argument("--chunk", type=int, default=None, help="Gemma only: positions per forward, a divisor of "
                                                              "the page (default 32)")
    ap.add_argument("--gguf", default=None, help="Gemma 3 270M only: the GGUF file (default: the package's)")
    args = ap.parse_args(argv)
    for name, low in (("limit", 1), ("max_batch", 1), ("max_input_tokens", 1), ("max_output_tokens", 1),
                      ("check", 0), ("device_pages", 1), ("host_pages", 1), ("seed", 0), ("chunk", 1),
                      ("fuse_after", 0)):
        v = getattr(args, name)
        if v is not None and v < low:
            ap.error(f"--{name.replace('_', '-')} must be >= {low}, got {v}")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        ap.error(f"--time-scale must be a number > 0, got {args.time_scale}")
    if args.recompute_us_per_token is not None and not (math.isfinite(args.recompute_us_per_token)
                                                        and args.recompute_us_per_token > 0):
        ap.error(f"--recompute-us-per-token must be a number > 0, got {args.recompute_us_per_token}")
    if not (math.isfinite(args.load_overhead_us) and args.load_overhead_us >= 0):
        ap.error(f"--load-overhead-us must be a number >= 0, got {args.load_overhead_us}")
    if args.load_overhead_us and args.recompute_us_per_token is None:
        ap.error("--load-overhead-us needs --recompute-us-per-token (without it every host hit is loaded)")
    config = pathlib.Path(args.config)
    if not config.exists() and not config.is_absolute() and (ROOT / config).exists():
        config = ROOT / config
    try:
        args.layout = hc.build_layout(hc.load_model_config(config))
    except (OSError, ValueError) as e:
        ap.error(f"--config {args.config}: {e.strerror if isinstance(e, OSError) else e}")
    cfg, P = args.layout.model, args.layout.page_size
    if cfg.vocab_size < 2:
        ap.error(f"--config {args.config}: the model needs vocab_size >= 2, got {cfg.vocab_size}")
    gemma = cfg.model_type == "gemma3_text"
    if args.chunk is not None and (not gemma or P % args.chunk):
        ap.error(f"--chunk {args.chunk}: only Gemma models take --chunk, a divisor of the {P}-token page"
                 if not gemma else f"--chunk {args.chunk} does not divide the {P}-token page")
    if args.gguf is not None and (cfg.name != GEMMA_270M or not pathlib.Path(args.gguf).is_file()):
        ap.error(f"--gguf {args.gguf}: " + ("no such file" if cfg.name == GEMMA_270M else
                                           f"only the {GEMMA_270M} config loads a GGUF file"))
    every = max(1, BLOCK_TOKENS // P)
    args.window_policy = args.window_policy or f"ends+every_{every}"
    try:
        args.policy = hc.WindowPolicy.parse(args.window_policy)
    except ValueError as e:
        ap.error(f"--window-policy {args.window_policy}: {e}")
    if args.plot is not None and not pathlib.Path(args.plot).resolve().parent.is_dir():
        ap.error(f"--plot {args.plot}: no directory {pathlib.Path(args.plot).resolve().parent}")
    if not pathlib.Path(args.trace).is_file():
        ap.error(f"--trace {args.trace}: no such file")
    try:
        args.jobs = load_jobs(args.trace, cfg.vocab_size, args.limit, args.max_input_tokens, args.max_output_tokens,
                              args.time_scale, seed=args.seed)
    except (OSError, ValueError, EOFError) as e:      # the reader's errors name the file and line already
        ap.error(f"--trace {e}" if str(e).startswith(args.trace) else f"--trace {args.trace}: {e}")
    if not args.jobs:
        ap.error(f"--trace {args.trace}: no requests in it")
    args.max_pages = max(j.pages(P) for j in args.jobs)
    if args.device_pages is None:
        args.device_pages = max(args.max_pages, args.max_batch * args.max_pages // 2)
    elif args.device_pages < args.max_pages:
        ap.error(f"--device-pages {args.device_pages}: the longest request needs {args.max_pages} pages "
                 f"({args.max_pages * P} tokens); raise it or cut requests (--max-input-tokens, --max-output-tokens)")
    args.host_pages = args.host_pages or 8 * args.device_pages
    return args


def build_model(args):
    """The model of --config: random tiny weights, or Gemma 3 270M's real ones (as chat.py loads them)."""
    layout = args.layout
    if layout.model.model_type != "gemma3_text":
        from examples.tiny_models import make_model
        return make_model(layout, seed=args.seed, max_pages=args.max_pages)
    from examples.gemma.model import DEFAULT_CHUNK, GemmaModel
    chunk = args.chunk or DEFAULT_CHUNK
    if layout.model.name != GEMMA_270M:
        return GemmaModel.random(layout, seed=args.seed, max_pages=args.max_pages, chunk_size=chunk)
    from examples.gemma.weights import find_gguf, load_gguf_model
    path = pathlib.Path(args.gguf) if args.gguf else find_gguf()
    model, _ = load_gguf_model(layout, path, max_pages=args.max_pages, chunk_size=chunk,
                               log=lambda line: say(args, f"  {line}"))
    return model


def say(args, line: str) -> None:
    if not args.quiet:
        print(line, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    layout, jobs, B = args.layout, args.jobs, args.max_batch
    span = jobs[-1].arrival_s - jobs[0].arrival_s
    say(args, f"{layout.model.name}: {len(jobs)} requests over {span:.1f} s (time scale {args.time_scale}), "
              f"{sum(len(j.prompt) for j in jobs):,} prompt tokens, {sum(j.gen for j in jobs):,} to generate; "
              f"{B} slots, device {args.device_pages} pages, host {args.host_pages} pages, {args.write_policy}, "
              f"window {args.policy.name}; jax {jax.__version__} on {jax.devices()[0].platform}")
    t0 = time.perf_counter()
    model = build_model(args)
    sample = sample_indices(jobs, args.check)
    rows = min(len(sample), B)
    transfer = hc.TransferConfig(kernels=args.kernels, fuse_after=args.fuse_after)
    load_cost = None if args.recompute_us_per_token is None else (args.recompute_us_per_token * 1e-6,
                                                                  args.load_overhead_us * 1e-6)
    pages = args.device_pages + args.schedule_ahead       # the trash page of a step computing every slot
    caches = {kind: make_cache(kind, layout, pages, args.host_pages, args.write_policy, transfer, load_cost)
              for kind in CacheKind}
    say(args, "compiling the transfer programs and the batched step (a one-off) ...")
    caches[CacheKind.HICACHE].warmup()    # every chunk size: a step's backups merge many requests' pages
    for cache in caches.values():
        warm_up(model, cache, B, rows, every_slot=args.schedule_ahead)
    alone_pools = caches[CacheKind.HICACHE].empty_device_pools()   # for the check: same shapes, same program
    gc_pauses.settle()                    # the collector walks none of what warm-up made
    say(args, f"  ready in {time.perf_counter() - t0:.1f} s")
    compiles = hc.CompileCounter()        # from here on, nothing should compile
    runs = {}
    for kind, cache in caches.items():
        runs[kind.value] = serve(jobs, model, CacheCalls(kind, cache, args.policy), B, sample, not args.quiet,
                                 args.admission, ahead=args.schedule_ahead)
    gc_pauses.unsettle()
    result = check(model, alone_pools, jobs, runs, sample, B, (pages - 1, pages - 1) if args.schedule_ahead else None)
    summaries = {name: summarize(run) for name, run in runs.items()}
    if compiles.count:
        print(f"compiled while serving: {', '.join(compiles.names)}", file=sys.stderr)
    for line in result.mismatches[:10]:
        print(f"NOT IDENTICAL: {line}", file=sys.stderr)
    if not args.quiet:
        print("\n" + table(summaries))
        print(f"\nidentical: {result.identical} (requests {list(result.sample)} recomputed alone; every request "
              f"compared across the runs)")
    if args.plot:
        from examples.batching.plot import plot
        plot(runs, args.plot, f"{layout.model.name}: {len(jobs)} requests of {pathlib.Path(args.trace).name}, "
                              f"{B} slots, time scale {args.time_scale}")
    if args.steps_out:
        rows = {name: [r.row() for r in run.steps] for name, run in runs.items()}
        pathlib.Path(args.steps_out).write_text(json.dumps({"fields": StepRecord.columns(), "runs": rows}))
    hi = summaries["hicache"]
    backend, interpreted = resolve(args.kernels)
    kernels = backend + (" (interpreted)" if interpreted else "")      # what the HiCache run's programs used
    out = {
        "requests": len(jobs), "config": layout.model.name, "trace": pathlib.Path(args.trace).name,
        "max_batch": max(s["max_batch"] for s in summaries.values()), "slots": B,
        "identical": result.identical, "identical_sample": result.identical_sample,
        "identical_across_runs": result.identical_across_runs, "check_sample": list(result.sample),
        "ttft_ms": {n: s["ttft_ms"] for n, s in summaries.items()},
        "itl_ms": {n: s["itl_ms"] for n, s in summaries.items()},
        "throughput_tok_s": {n: s["throughput_tok_s"] for n, s in summaries.items()},
        "hit_tokens": hi["hit_tokens"], "bytes_moved": hi["bytes_moved"],
        "compiles_while_serving": compiles.count, "background_compiles": compiles.background,
        "ratios": ratios(summaries),
        "device_pages": args.device_pages, "host_pages": args.host_pages, "max_pages": args.max_pages,
        "chunk": model.chunk_size, "time_scale": args.time_scale, "max_input_tokens": args.max_input_tokens,
        "max_output_tokens": args.max_output_tokens, "write_policy": args.write_policy,
        "window_policy": args.policy.name, "admission": args.admission,
        "schedule_ahead": args.schedule_ahead, "fuse_after": transfer.fuse_after,
        "recompute_us_per_token": args.recompute_us_per_token, "load_overhead_us": args.load_overhead_us,
        "kernels": kernels,
        "platform": jax.devices()[0].platform, "jax": jax.__version__,
        "runs": summaries,
    }
    for cache in caches.values():
        cache.close()
    print(json.dumps(out))
    return 0 if result.identical else 1


if __name__ == "__main__":
    sys.exit(main())
