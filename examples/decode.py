"""Serve multi-turn conversations with a tiny model through HiCache; check against recompute.

    python examples/decode.py --config configs/tiny_v4.json

Conversations share a long system prompt; each turn appends the model's answer and a new
user message, so every turn's prompt extends the previous one. Requests run round-robin
over conversations with a device pool too small to keep them all, so prefixes are backed
up, evicted and loaded back. The same requests then run with no cache (full recompute);
every generated token and every logit must be bit-identical. The last line is JSON;
exit status 0 only when `identical` is true.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import hicache_jax as hc  # noqa: E402
from examples import cli, gc_pauses, program_runs  # noqa: E402
from examples.serving_loop import Outcome, run_cached, run_uncached  # noqa: E402
from examples.tiny_models import make_model  # noqa: E402


# With --overlap, a host block of 1, 2, 4 or 8 pages (a chunk of the tiny models) goes to the
# step: every host hit the workload brings lands inside a prefill step, none waits.
LANDING_BUCKETS = 4


def workload(args, vocab: int):
    """[(conversation, turn, prompt, preempt_at)] in arrival order, seeded."""
    rng = np.random.default_rng(args.seed)
    words = lambda n: rng.integers(1, vocab, n).astype(np.int32)
    system = words(args.system_tokens)
    convs = -(-args.requests // args.turns)
    firsts = [words(args.user_tokens + int(rng.integers(0, args.user_tokens))) for _ in range(convs)]
    follow = [[words(args.followup_tokens + int(rng.integers(0, 64))) for _ in range(args.turns)] for _ in range(convs)]
    order = [(c, t) for t in range(args.turns) for c in range(convs)][: args.requests]
    return system, firsts, follow, order


def serve(args, model, cache: hc.HiCache, pools=None) -> list[Outcome]:
    """Run the workload through `cache`, or, given `pools` of the same shapes, with no cache."""
    cached = pools is None
    system, firsts, follow, order = workload(args, model.vocab_size)
    history = {}          # conversation -> tokens so far (prompt + answers)
    outs: list[Outcome] = []
    for i, (c, t) in enumerate(order):
        prev = history.get(c, np.concatenate([system, firsts[c]]))
        prompt = prev if t == 0 else np.concatenate([prev, follow[c][t]])
        preempt = args.gen_tokens // 2 if cached and args.preempt_every and (i + 1) % args.preempt_every == 0 else None
        if cached:
            out = run_cached(cache, model, prompt, args.gen_tokens, preempt_at=preempt, window_policy=args.policy,
                             overlap=args.overlap)
            if out.resume_len is not None:   # preempted: resume at once, recomputing the partial page
                out = run_cached(cache, model, prompt, args.gen_tokens, out=out, window_policy=args.policy,
                                 overlap=args.overlap)
        else:
            pools, out = run_uncached(model, pools, prompt, args.gen_tokens)
        history[c] = np.concatenate([prompt, np.asarray(out.tokens, np.int32)])
        outs.append(out)
        if args.progress:
            where = (f"device {out.device_hit:5d}  host {out.host_hit:5d}  computed {out.computed:5d}"
                     if cached else f"computed {out.computed:5d}")
            tag = " (preempted, resumed)" if out.resume_len is not None else ""
            print(f"  {'cache' if cached else 'recompute':9} req {i:3d} conv {c} turn {t}: prompt {len(prompt):5d}  "
                  f"{where}  ttft {1e3 * out.ttft_s:7.1f} ms{tag}", flush=True)
    if cached:
        cache.drain()
        cache.check_invariants()
    return outs


def warm_up(model, cache: hc.HiCache, landings: bool = False) -> None:
    """Compile every program the model runs before anything is timed, on the cache's own
    pools (same shapes and placement): its step, and with `landings` the step landing each
    shape of deferred load the cache can hand it (`HiCache.landing_examples`: they land
    nothing). Each step's logits are fetched to the host, as serving fetches them: on a GPU
    the process's first device-to-host copy pays a one-off setup. It writes page 0, which
    nothing holds yet."""
    z = np.zeros(model.max_pages, np.int32)
    tokens = np.zeros(model.chunk_size, np.int32)
    pools, logits = model.forward_chunk(cache.device_pools, z, z, tokens, 0, 1)
    np.asarray(logits)
    for landing in cache.landing_examples() if landings else ():
        pools, logits = model.forward_chunk(pools, z, z, tokens, 0, 1, landing=landing)
        np.asarray(logits)
    cache.set_device_pools(pools)


def identical(a: list[Outcome], b: list[Outcome]) -> bool:
    for x, y in zip(a, b, strict=True):
        if x.tokens != y.tokens or len(x.logits) != len(y.logits):
            return False
        if not all(np.array_equal(p.view(np.uint32), q.view(np.uint32)) for p, q in zip(x.logits, y.logits)):
            return False
    return True


def summary(cache: hc.HiCache, cached: list[Outcome], plain: list[Outcome]) -> str:
    s = cache.stats()
    lines = ["", "pool                          backup bytes    load bytes"]
    for p in cache.layout.byte_pools:
        lines.append(f"{p.name:28} {s.backup_bytes.get(p.name, 0):13,} {s.load_bytes.get(p.name, 0):13,}")
    lines += ["", f"hit tokens: device {sum(o.device_hit for o in cached):,}, host {sum(o.host_hit for o in cached):,}; "
              f"recomputed {sum(o.computed for o in cached):,} (no cache: {sum(o.computed for o in plain):,})",
              f"dropped tokens: {dict(s.dropped_tokens) or 0}; load-backs refused: {s.load_refusals or 0}",
              "", "req  ttft with cache (ms)  ttft recompute (ms)   host hit"]
    for i, (x, y) in enumerate(zip(cached, plain)):
        lines.append(f"{i:3d}  {1e3 * x.ttft_s:20.1f}  {1e3 * y.ttft_s:19.1f}  {x.host_hit:9,}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, each checked before any work starts; a bad one ends the run with one line
    naming the problem and the flag to change (examples/cli.py)."""
    ap = cli.ArgumentParser(description=__doc__, formatter_class=cli.HelpFormatter)
    ap.add_argument("--config", default="configs/tiny_v4.json",
                    help="model config JSON (a relative path not found here is looked up in the repository)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model weights and the prompts")
    ap.add_argument("--requests", type=int, default=12, help="requests in all (round-robin over conversations)")
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation")
    ap.add_argument("--device-pages", type=int, default=8, help="device tier size, in anchor pages (and SWA pages)")
    ap.add_argument("--host-pages", type=int, default=64, help="host tier size, in pages per allocator")
    ap.add_argument("--write-policy", default="write_through", choices=[p.value for p in hc.WritePolicyName],
                    help="when device pages are backed up to the host")
    ap.add_argument("--window-policy", default=hc.DEFAULT_WINDOW_POLICY, metavar="POLICY",
                    help="page boundaries that keep their SWA pages (stop points where a later request can "
                         "resume): every, ends (request ends only) or ends+every_N (and every N pages)")
    ap.add_argument("--system-tokens", type=int, default=512, help="shared system prompt length")
    ap.add_argument("--user-tokens", type=int, default=400, help="first user message: this many tokens, up to twice")
    ap.add_argument("--followup-tokens", type=int, default=120, help="follow-up message: this many tokens, up to +63")
    ap.add_argument("--gen-tokens", type=int, default=12, help="tokens generated per request")
    ap.add_argument("--max-pages", type=int, default=8, help="model context, in pages")
    ap.add_argument("--preempt-every", type=int, default=5, help="preempt every Nth request mid-decode (0: never)")
    ap.add_argument("--metrics-out", default=None, help="write the cache's Prometheus text to this file at the end")
    ap.add_argument("--storage", default=None, metavar="URL",
                    help="L3 storage tier under the host tier: file:///dir (tensorstore), mooncake://host:port "
                         "(Mooncake Store), memory:// (this process only); off when not given")
    ap.add_argument("--storage-retry-s", type=float, default=0.0, metavar="SECONDS",
                    help="keep trying to reach a --storage that is down this long at start-up (0: one attempt); "
                         "then serve without it")
    ap.add_argument("--prefetch-policy", default="wait_complete", choices=["best_effort", "wait_complete", "timeout"],
                    help="how long a request waits for pages being fetched from --storage")
    ap.add_argument("--overlap", action="store_true",
                    help="deferred load-backs: the first prefill chunk lands a host hit layer group by layer group")
    ap.add_argument("--layer-groups", type=int, default=2, help="with --overlap: the host tier's layer groups")
    ap.add_argument("--check", action="store_true", help="check the cache's invariants after every call (slow)")
    ap.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                    help="leave the heap unfrozen after warm-up (examples/gc_pauses.py: a full collection "
                         "while serving then walks every object jax and the model made)")
    ap.add_argument("--quiet", dest="progress", action="store_false", help="no per-request lines")
    args = ap.parse_args(argv)
    cli.check_range(ap, args, {"seed": (0, 2**32 - 1), "requests": (1, MAX_REQUESTS), "turns": (1, MAX_REQUESTS),
                               "device_pages": (1, None), "host_pages": (1, None),
                               "max_pages": (1, MAX_PAGES), "layer_groups": (1, None), "system_tokens": (0, MAX_TOKENS),
                               "user_tokens": (0, MAX_TOKENS), "followup_tokens": (0, MAX_TOKENS),
                               "gen_tokens": (1, MAX_TOKENS), "preempt_every": (0, None)})
    if not 0 <= args.storage_retry_s <= 3600:
        ap.error(f"--storage-retry-s must be in 0..3600 seconds, got {args.storage_retry_s}")
    try:
        args.policy = hc.WindowPolicy.parse(args.window_policy)
    except ValueError as e:
        ap.error(f"--window-policy {args.window_policy}: {e}")
    cli.check_writable(ap, "--metrics-out", args.metrics_out)
    args.layout = cli.load_layout(ap, "--config", args.config)
    model = args.layout.model
    if model.vocab_size < 2:
        ap.error(f"--config {args.config}: the example's model needs vocab_size >= 2")
    if args.overlap and args.layer_groups > model.num_hidden_layers:
        ap.error(f"--layer-groups must be in 1..{model.num_hidden_layers} (the model's layers), got {args.layer_groups}")
    try:
        config = cache_config(args)
    except ValueError as e:
        flag, value = ("--storage", args.storage) if "StorageConfig" in str(e) else ("--config", args.config)
        ap.error(f"{flag} {value}: {e}")
    cli.check_memory(ap, args.layout, config, {"device": f"--device-pages {args.device_pages}",
                                                "host": f"--host-pages {args.host_pages}"})
    pages = -(-longest_request(args) // args.layout.page_size)
    for flag, have in (("--max-pages", args.max_pages), ("--device-pages", args.device_pages)):
        if pages > have:
            ap.error(f"the longest request needs {pages} pages of context but {flag} is {have}: raise {flag} "
                     f"(or shorten the prompts: --system-tokens, --user-tokens, --followup-tokens, --turns, --gen-tokens)")
    try:   # the tiny model's own checks of the config (its weights are small: built and dropped)
        make_model(args.layout, seed=args.seed, max_pages=args.max_pages)
    except ValueError as e:
        ap.error(f"--config {args.config}: {e}")
    return args


MAX_REQUESTS = 10_000    # the workload is drawn in full before anything runs (and checked)
MAX_TOKENS = 1 << 20     # per message: far past any context, short enough to draw
MAX_PAGES = 4096         # a request's context (1M tokens); every forward gathers this many pages


def longest_request(args) -> int:
    """Tokens of the longest request (prompt + generated), from the workload's shape alone."""
    system, firsts, follow, order = workload(args, args.layout.model.vocab_size)   # the run's own draws
    history, longest = {}, 0
    for c, t in order:
        n = history.get(c, len(system) + len(firsts[c])) + (len(follow[c][t]) if t else 0)
        longest = max(longest, n + args.gen_tokens)
        history[c] = n + args.gen_tokens
    return longest


def main(argv=None) -> int:
    args = parse_args(argv)
    layout = args.layout
    model = make_model(layout, seed=args.seed, max_pages=args.max_pages)
    print(f"{layout.model.name}: {len(layout.pools)} pools, {args.requests} requests, device {args.device_pages} pages, "
          f"host {args.host_pages} pages, {args.write_policy}, jax {jax.__version__} on {jax.devices()[0].platform}",
          flush=True)
    cache = make_cache(args)
    print("compiling the transfer programs and the model (a one-off, some seconds) ...", flush=True)
    program_runs.watch(cache)         # from warm-up on: what it runs is not new while serving
    cache.warmup(args.max_pages)
    warm_up(model, cache, landings=args.overlap)
    frozen = gc_pauses.settle() if args.gc_freeze else 0
    # the step once more: the device sat idle through the collection, and the first request
    # after such a pause was the slowest of its run in most cases (BENCHMARKS.md); now it
    # follows a step, as every later request does
    warm_up(model, cache)
    compiles = hc.CompileCounter()     # from here on, nothing should compile
    full_passes, runs = gc_pauses.full_passes(), program_runs.first_runs()
    t0 = time.perf_counter()
    with_cache = serve(args, model, cache)
    t1 = time.perf_counter()
    # same model, same pool shapes and placement: the same compiled program, with no cache
    without = serve(args, model, cache, pools=cache.empty_device_pools())
    t2 = time.perf_counter()
    gc_pauses.unsettle()
    if compiles.count:
        print(f"compiled while serving: {', '.join(compiles.names)}")
    same = identical(with_cache, without)
    print(summary(cache, with_cache, without))
    print(f"\nwith cache {t1 - t0:.1f} s, recompute {t2 - t1:.1f} s; bit-identical: {same}")
    if args.metrics_out:
        pathlib.Path(args.metrics_out).write_text(cache.metrics_text())
    result, stats = outcome_fields(cache, with_cache, without), cache.stats()
    result.update(requests=args.requests, config=layout.model.name, write_policy=args.write_policy,
                  window_policy=args.policy.name, overlap=args.overlap,
                  deferred_loads=dict(stats.deferred_loads), transfer_waits=dict(stats.transfer_waits),
                  compiles_while_serving=compiles.count,
                  background_compiles=compiles.background, gc_frozen_objects=frozen,
                  gc_full_passes_while_serving=gc_pauses.full_passes() - full_passes,
                  first_program_runs_while_serving=program_runs.first_runs() - runs)
    cache.close()
    print(json.dumps(result))
    return 0 if same else 1


def make_cache(args) -> hc.HiCache:
    """The cache the flags describe."""
    return hc.HiCache(args.layout, cache_config(args))


def cache_config(args) -> hc.HiCacheConfig:
    """The cache's configuration the flags describe (ValueError naming a bad field)."""
    # the weights are random, seeded: the seed names them in storage keys
    return hc.HiCacheConfig(device_pages=args.device_pages, host_pages=args.host_pages,
                            write_policy=args.write_policy, check_invariants=args.check,
                            transfer=hc.TransferConfig(layer_groups=args.layer_groups if args.overlap else 1,
                                                       landing_buckets=LANDING_BUCKETS),
                            storage=hc.StorageConfig(url=args.storage, prefetch_policy=args.prefetch_policy,
                                                     connect_retry_s=args.storage_retry_s,
                                                     model_id=f"{args.layout.model.name}/tiny-seed{args.seed}"))


def outcome_fields(cache: hc.HiCache, with_cache: list[Outcome], without: list[Outcome]) -> dict:
    """The JSON last line's common fields: identity, where prompt tokens came from, bytes moved, TTFTs."""
    s = cache.stats()
    return {
        "identical": identical(with_cache, without),
        "host_hit_tokens": sum(o.host_hit for o in with_cache),
        "storage_hit_tokens": sum(o.storage_hit for o in with_cache),
        "device_hit_tokens": sum(o.device_hit for o in with_cache),
        "recomputed_tokens": sum(o.computed for o in with_cache),
        "no_cache_computed_tokens": sum(o.computed for o in without),
        "backup_bytes": sum(s.backup_bytes.values()),
        "load_bytes": sum(s.load_bytes.values()),
        "ttft_ms_cache": [round(1e3 * o.ttft_s, 3) for o in with_cache],
        "ttft_ms_recompute": [round(1e3 * o.ttft_s, 3) for o in without],
        "gc_ms_in_ttft_cache": [round(1e3 * o.gc_s, 3) for o in with_cache],
        "gc_ms_in_ttft_recompute": [round(1e3 * o.gc_s, 3) for o in without],
        "first_program_runs_in_ttft": [o.first_runs for o in with_cache],
        "cache_calls_ms_in_ttft": [round(1e3 * o.cache_s, 3) for o in with_cache],
        "host_hit_per_request": [o.host_hit for o in with_cache],
        "storage_hit_per_request": [o.storage_hit for o in with_cache],
        "dropped_tokens": dict(s.dropped_tokens),
        **window_fields(cache, with_cache),
    }


def window_fields(cache: hc.HiCache, with_cache: list[Outcome]) -> dict:
    """What the window policy trades: host bytes written per token backed up (kv and its
    sidecars, plus the SWA pages kept and their state rows), against prompt tokens found in
    the cache (device or host) per prompt token served (a resumed request's counted again)."""
    s = cache.stats()
    hits = sum(o.device_hit + o.host_hit for o in with_cache)
    served = hits + sum(o.computed for o in with_cache)
    # an allocator's tokens are counted on each pool that moves with it: take its first one
    backed = {a: s.backup_tokens.get(cache.layout.moving_with(a)[0].name, 0) if a else 0
              for a in (cache.anchor, cache.swa_allocator)}
    tokens = backed[cache.anchor]
    return {
        "hit_tokens": hits,
        "hit_rate": round(hits / served, 6) if served else 0.0,
        "backup_tokens": tokens,
        "backup_window_tokens": backed[cache.swa_allocator],
        "host_bytes_per_cached_token": round(sum(s.backup_bytes.values()) / tokens, 3) if tokens else 0.0,
    }


if __name__ == "__main__":
    sys.exit(main())
