"""Host hits as real traffic makes them, through the public API, each paired round by round
with a contiguous pinned-host -> device `device_put` of the same bytes in the same process
(the order alternates each round; medians; ratio = contiguous ms / hit ms). Every hit,
warm-up rounds included, is compared byte for byte with what was written into its pages,
every pool; `"exact": true` only if all of them were equal.

bench_api.py times one prefix backed up alone and hit whole. Here the hit is shaped by how
it was backed up and by what the next request shares (P = --pages, the kv pages hit):

    whole_block       write-through; one prefix of P pages, backed up alone; evict, acquire it
    write_back_batch  write-back; 4 prompts of P pages inserted, then evicted by one `evict`
                      call, so one backup batch writes them all; acquire one of the last 3
                      (rotating): the hit covers P of the batch's 4P host pages
    shared_prompt     write-through; a conversation S + T (P + P pages, windows kept at the
                      ends of S and T) backed up as one node; the hit is S + other text, so it
                      covers S only: the first half of that backup (the tree splits the node)
    shared_again      the same, but one S + T backed up once and S hit every round by another
                      question, evicted in between: a system prompt many requests share, its
                      host rows the same block's each time (its host views kept, if any)
    multi_turn        write-back; turn 1 (P/2 pages) inserted, turn 2 (turn 1 + the rest of
                      P pages) inserted reusing turn 1's device pages, both evicted together;
                      turn 3 (turn 2 + more) hits turn 1 + turn 2 whole (two nodes; P = 1:
                      1 + 1 pages)
    first_vs_repeat   write-through; each round a new prefix is backed up, then hit once
                      (first) and, evicted again, once more (repeat); ratio first / repeat
    batched           write-through; N prompts of P pages, each backed up alone; all acquired
                      by one `acquire_many` and by N `acquire`s; the
                      reference is one `device_put` of all N prefixes' bytes

The modes that build per round (shared_prompt, multi_turn, first_vs_repeat) write a new
prefix each round and remove it afterwards, so every measured hit is the first split or
load of a fresh backup. `dispatches`: transfer programs the timed call ran (counted with
`HiCache.on_program_call`); `compiles`: compilations inside timed calls (0 after warm-up);
`loaded_bytes`: what the cache counted as loaded, equal to the bytes of the reference;
`programs`: the transfer programs of the last measured call, by label; `backup_transfers`:
the backups that wrote what the hit reads (1: one batch).

    python benchmarks/bench_hits.py --out hits.json                 # GPU: V4-Flash, V4.1-Flash, Gemma 3 270M
    python benchmarks/bench_hits.py --modes batched --pages 16 --batch 1,4,16 --out batched.json
    python benchmarks/bench_hits.py --smoke --out hits.json         # tiny_v4, tiny_gqa: CPU, seconds
"""
from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_api import link_copy, prefix_bytes  # noqa: E402
from hit_requests import (  # noqa: E402
    Probe,
    compute,
    counted,
    forget,
    restored,
    to_host,
    tokens,
)
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

import hicache_jax as hc  # noqa: E402

MODES = ("whole_block", "write_back_batch", "shared_prompt", "shared_again", "multi_turn", "first_vs_repeat",
         "batched")
BATCH_PROMPTS = 4          # write_back_batch: prompts evicted together
FUSE_AFTER = 4     # each mode's hits repeat one shape of pieces: they opt into its fused program
WARM = FUSE_AFTER  # warm-up rounds: the shape's program starts compiling at its FUSE_AFTER-th load
                   # (compiled before the measured rounds)


def make_cache(config: str, policy: str, kv_pages: int, window_pages: int, **transfer) -> hc.HiCache:
    """A cache holding `kv_pages` kv pages and `window_pages` SWA pages on device and on the
    host, 2 spare of each (the trailing windows a mode keeps: `window_pages`); `transfer`:
    `TransferConfig` fields given on the command line."""
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{config}.json"))
    swa = layout.swa_pool.name if layout.swa_pool else None
    return hc.HiCache(layout, hc.HiCacheConfig(
        device_pages=kv_pages + 2, swa_device_pages=window_pages + 2 if swa else None,
        host_pages={layout.anchor.name: kv_pages + 2, **({swa: window_pages + 2} if swa else {})},
        write_policy=policy, load_back_threshold=1,
        transfer=hc.TransferConfig(host_memory_limit_bytes=1 << 40, fuse_after=FUSE_AFTER,
                                   **transfer)))


class Hits:
    """One (config, mode, pages[, N]) run on a cache of its own: the rounds, the checks."""

    def __init__(self, cache: hc.HiCache, seed: int):
        self.cache, self.probe, self.seed = cache, Probe(cache), seed
        self.page = cache.layout.page_size
        self.checked, self.exact = 0, True
        self.times: dict[str, list[float]] = {}
        self.nbytes = 0
        self.on_measured = None     # called once, before the first measured round (profile_hits.py traces from there)

    def fresh(self, pages: int) -> np.ndarray:
        """The tokens of `pages` new pages, shared with no earlier prompt."""
        self.seed += 1
        return tokens(self.seed, pages * self.page)

    def other_question(self, turn: np.ndarray) -> np.ndarray:
        """One page of new text whose first token differs from `turn`'s: another question
        after the same system prompt."""
        other = self.fresh(1)
        other[0] = turn[0] + 1
        return other

    def hit(self, name: str, request, prompt, pages: int) -> float:
        """Time `acquire(prompt)`, which must bring `pages` kv pages from the host; check its
        bytes against `request`, unlock. Returns seconds."""
        took, prefix = self.probe.time(name, lambda: self.cache.acquire(prompt))
        self.check(prefix, request, pages)
        self.cache.unlock(prefix.lock)
        return took

    def check(self, prefix, request, pages: int) -> None:
        want = pages * self.page
        if prefix.refused is not None or prefix.length != want or prefix.host_tokens != want:
            raise RuntimeError(f"hit of {prefix.length} tokens ({prefix.host_tokens} from the host, refused: "
                               f"{prefix.refused}), expected {want} from the host")
        self.exact &= restored(self.cache, prefix, request)
        self.checked += 1

    def rounds(self, rounds: int, warm: int, one_round) -> None:
        """`warm` + `rounds` rounds; `one_round(r)` sets the round up and returns its sides,
        functions that time one or more calls (-> {name: seconds}), run in an order rotated
        each round (with two sides: hit first, then the reference first, and so on)."""
        for r in range(warm + rounds):
            self.probe.keep = r >= warm
            if r == warm:
                self.cache.wait_compiles()     # the warm-up's new load shapes, compiled in the background
                if self.on_measured is not None:
                    self.on_measured()
            sides = one_round(r)
            shift = r % len(sides)
            for fn in sides[shift:] + sides[:shift]:
                for name, seconds in fn().items():
                    if r >= warm:
                        self.times.setdefault(name, []).append(seconds)

    def reference(self, nbytes: int):
        """The round's contiguous side, a `device_put` of `nbytes`: what every hit must load."""
        self.nbytes, timed = nbytes, link_copy(nbytes)
        return lambda: {"contiguous": timed()}

    def side(self, name: str) -> dict:
        ms = statistics.median(self.times[name]) * 1e3
        ref = statistics.median(self.times["contiguous"]) * 1e3
        rec = self.probe.seen.get(name, {})
        return {"ms": round(ms, 4), "ratio": round(ref / ms, 4),
                "paired_ratio": round(statistics.median(c / t for c, t in zip(self.times["contiguous"],
                                                                             self.times[name])), 4),
                "dispatches": int(statistics.median(rec["dispatches"])) if rec else None,
                "compiles": sum(rec.get("compiles", [])), "loaded_bytes": max(rec.get("loaded_bytes", [0])),
                "programs": rec.get("programs", []),
                # host time (ms): to the first transfer program's call, to each call and how long
                # each held the host, to the end of the last wait for the device, until the call returned
                "first_call_ms": _median_ms([c[0] for c in rec.get("calls_s", []) if c]),
                "returned_ms": _median_ms(rec.get("returned_s")), "calls_ms": _calls_ms(rec.get("calls_s", [])),
                "held_ms": _calls_ms(rec.get("held_s", [])), "waited_ms": _median_ms(rec.get("waited_s"))}


def _calls_ms(rounds: list[list[float]]) -> list[float]:
    """Per transfer program call, the first 8 (seconds each round: when it was called, or how
    long it held the host), in ms: the median over the rounds that made the usual (median)
    number of calls."""
    if not rounds:
        return []
    usual = sorted(map(len, rounds))[len(rounds) // 2]
    return [_median_ms([r[k] for r in rounds if len(r) == usual]) for k in range(min(8, usual))]


def _median_ms(seconds: list[float] | None) -> float | None:
    return round(statistics.median(seconds) * 1e3, 4) if seconds else None


# -- the modes: each runs its rounds on `h` and returns its own fields of the row -----------------------
def whole_block(h: Hits, pages: int, rounds: int) -> dict:
    req = compute(h.cache, h.fresh(pages), h.seed)
    h.cache.step()
    ref = h.reference(prefix_bytes(h.cache.layout, pages))

    def one_round(r):
        to_host(h.cache)
        return [lambda: {"hit": h.hit("hit", req, req.prompt(), pages)}, ref]
    h.rounds(rounds, WARM, one_round)
    return {"hit_pages": pages, "backed_up_pages": pages}


def write_back_batch(h: Hits, pages: int, rounds: int) -> dict:
    reqs = [compute(h.cache, h.fresh(pages), h.seed) for _ in range(BATCH_PROMPTS)]
    before = counted(h.cache, "backup_transfers")
    to_host(h.cache)                                # one evict: the 4 demotions share one backup batch
    batches = counted(h.cache, "backup_transfers") - before
    ref = h.reference(prefix_bytes(h.cache.layout, pages))

    def one_round(r):
        req = reqs[1 + r % (BATCH_PROMPTS - 1)]
        to_host(h.cache)
        return [lambda: {"hit": h.hit("hit", req, req.prompt(), pages)}, ref]
    h.rounds(rounds, max(WARM, BATCH_PROMPTS - 1), one_round)   # warm-up: each of the three once
    return {"hit_pages": pages, "backed_up_pages": BATCH_PROMPTS * pages, "backup_transfers": batches}


def shared_prompt(h: Hits, pages: int, rounds: int) -> dict:
    ref = h.reference(prefix_bytes(h.cache.layout, pages))
    batches = []

    def one_round(r):
        forget(h.cache)
        system = h.fresh(pages)
        turn = h.fresh(pages)
        before = counted(h.cache, "backup_transfers")
        req = compute(h.cache, np.concatenate([system, turn]), h.seed, stops=(pages,))
        to_host(h.cache)
        batches.append(counted(h.cache, "backup_transfers") - before)
        asked = np.concatenate([system, h.other_question(turn)])
        return [lambda: {"hit": h.hit("hit", req, asked, pages)}, ref]
    h.rounds(rounds, WARM, one_round)
    return {"hit_pages": pages, "backed_up_pages": 2 * pages, "backup_transfers": max(batches)}


def shared_again(h: Hits, pages: int, rounds: int) -> dict:
    system, turn = h.fresh(pages), h.fresh(pages)
    before = counted(h.cache, "backup_transfers")
    req = compute(h.cache, np.concatenate([system, turn]), h.seed, stops=(pages,))
    to_host(h.cache)
    batches = counted(h.cache, "backup_transfers") - before
    ref = h.reference(prefix_bytes(h.cache.layout, pages))

    def one_round(r):
        to_host(h.cache)
        asked = np.concatenate([system, h.other_question(turn)])
        return [lambda: {"hit": h.hit("hit", req, asked, pages)}, ref]
    h.rounds(rounds, WARM, one_round)
    return {"hit_pages": pages, "backed_up_pages": 2 * pages, "backup_transfers": batches}


def multi_turn(h: Hits, pages: int, rounds: int) -> dict:
    first = max(1, pages // 2)
    total = max(pages, first + 1)
    ref = h.reference(prefix_bytes(h.cache.layout, total))
    batches = []

    def one_round(r):
        forget(h.cache)
        turn1 = compute(h.cache, h.fresh(first), h.seed)
        turn2 = compute(h.cache, np.concatenate([turn1.tokens, h.fresh(total - first)]), h.seed, before=turn1)
        before = counted(h.cache, "backup_transfers")
        to_host(h.cache)                            # both turns' nodes demoted by one evict
        batches.append(counted(h.cache, "backup_transfers") - before)
        turn3 = turn2.prompt(h.fresh(1))
        return [lambda: {"hit": h.hit("hit", turn2, turn3, total)}, ref]
    h.rounds(rounds, WARM, one_round)
    return {"hit_pages": total, "turn_pages": [first, total - first], "backed_up_pages": total,
            "backup_transfers": max(batches)}


def first_vs_repeat(h: Hits, pages: int, rounds: int) -> dict:
    ref = h.reference(prefix_bytes(h.cache.layout, pages))

    def one_round(r):
        forget(h.cache)
        req = compute(h.cache, h.fresh(pages), h.seed)
        to_host(h.cache)

        def both():
            first = h.hit("first", req, req.prompt(), pages)
            to_host(h.cache)
            return {"first": first, "hit": h.hit("hit", req, req.prompt(), pages)}
        return [both, ref]
    h.rounds(rounds, WARM, one_round)
    first, repeat = (statistics.median(h.times[k]) for k in ("first", "hit"))
    return {"hit_pages": pages, "backed_up_pages": pages, "first": h.side("first"),
            "first_ms": round(first * 1e3, 4), "first_over_repeat": round(first / repeat, 4)}


def batched(h: Hits, pages: int, rounds: int, n: int) -> dict:
    reqs = []
    for _ in range(n):
        reqs.append(compute(h.cache, h.fresh(pages), h.seed))
        h.cache.step()                              # each prompt backed up alone
    prompts = [r.prompt() for r in reqs]
    ref = h.reference(n * prefix_bytes(h.cache.layout, pages))

    def timed(name, call):
        def fn():
            to_host(h.cache)
            took, prefixes = h.probe.time(name, call)
            for prefix, req in zip(prefixes, reqs, strict=True):
                h.check(prefix, req, pages)
                h.cache.unlock(prefix.lock)
            return {name: took}
        return fn
    sides = [timed("acquire_many", lambda: h.cache.acquire_many(prompts, load_back=True, deferred=False)),
             timed("one_by_one", lambda: [h.cache.acquire(p) for p in prompts]), ref]
    # one more warm-up round: the first one's early copies go block by block (their shared
    # program compiles in the background), so its load is of another shape than the rest
    h.rounds(rounds, WARM + 1, lambda r: sides)
    out = {"hit_pages": n * pages, "backed_up_pages": n * pages, "one_by_one": h.side("one_by_one"),
           "acquire_many": h.side("acquire_many")}
    out["many_over_one"] = round(out["acquire_many"]["ms"] / out["one_by_one"]["ms"], 4)
    return out


SHAPES = {"whole_block": whole_block, "write_back_batch": write_back_batch, "shared_prompt": shared_prompt,
          "shared_again": shared_again, "multi_turn": multi_turn, "first_vs_repeat": first_vs_repeat}


def needs(mode: str, pages: int, n: int, window: int) -> tuple[str, int, int]:
    """(write policy, kv pages, window pages) a mode's cache must hold."""
    return {"whole_block": ("write_through", pages, window),
            "write_back_batch": ("write_back", BATCH_PROMPTS * pages, BATCH_PROMPTS * window),
            "shared_prompt": ("write_through", 2 * pages, 2 * window),
            "shared_again": ("write_through", 2 * pages, 2 * window),
            "multi_turn": ("write_back", max(pages, 2), 2 * window),
            "first_vs_repeat": ("write_through", pages, window),
            "batched": ("write_through", n * pages, n * window)}[mode]


def run(config: str, mode: str, pages: int, rounds: int, n: int, seed: int, max_bytes: int,
        transfer: dict | None = None, on_measured=None) -> dict:
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{config}.json"))
    window = layout.window_pages() if layout.swa_pool else 0
    policy, kv_pages, window_pages = needs(mode, pages, n, window)
    row = {"config": layout.model.name, "mode": mode, "pages": pages, "batch": n if mode == "batched" else None,
           "write_policy": policy, "rounds": rounds}
    held = prefix_bytes(layout, kv_pages) + (window_pages - min(kv_pages, window)) * (
        layout.page_bytes_of(layout.swa_pool.name) if window else 0)
    if held > max_bytes:
        return row | {"skipped": f"holds {held / 1e9:.1f} GB, over --max-held-gb"}
    h = Hits(make_cache(config, policy, kv_pages, window_pages, **(transfer or {})), seed)
    h.on_measured = on_measured
    try:
        fields = batched(h, pages, rounds, n) if mode == "batched" else SHAPES[mode](h, pages, rounds)
        main = "one_by_one" if mode == "batched" else "hit"
        side = fields.get(main) or h.side(main)
        row |= {"bytes": h.nbytes, "ms": side["ms"],
                "contiguous_ms": round(statistics.median(h.times["contiguous"]) * 1e3, 4),
                "ratio": side["ratio"], "dispatches": side["dispatches"], **fields, main: side,
                "compiles_in_timed_calls": sum(sum(rec["compiles"]) for rec in h.probe.seen.values()),
                "checked_hits": h.checked, "exact": h.exact,
                "bytes_as_expected": all(b == h.nbytes for rec in h.probe.seen.values()
                                         for b in rec["loaded_bytes"])}
    finally:
        h.cache.close()
        del h
        gc.collect()
    return row


def transfer_overrides(ap: argparse.ArgumentParser, view_mb: str | None, early_copy_mb: float | None) -> dict:
    """The `TransferConfig` fields `--view-mb` (a number of MB or none) and `--early-copy-mb`
    set, for `make_cache`; a bad `--view-mb` is an `ap.error` naming it."""
    transfer = {}
    if view_mb is not None:
        try:
            transfer["view_bytes"] = None if view_mb == "none" else int(float(view_mb) * 1e6)
        except ValueError:
            ap.error(f"--view-mb: a number of MB or none, got {view_mb!r}")
    if early_copy_mb is not None:
        transfer["early_copy_bytes"] = int(early_copy_mb * 1e6)
    return transfer


def show(r: dict) -> None:
    n = r["batch"] if r["batch"] is not None else ""
    if "skipped" in r:
        print(f"{r['config']:20} {r['mode']:17} {r['pages']:>5} {n:>3}  skipped: {r['skipped']}", file=sys.stderr)
        return
    extra = (f"first {r['first_ms']:.3f} ms (first/repeat {r['first_over_repeat']:.3f})" if "first_ms" in r
             else f"acquire_many {r['acquire_many']['ms']:.3f} ms, ratio {r['acquire_many']['ratio']:.3f}, "
                  f"{r['acquire_many']['dispatches']} dispatches" if r.get("acquire_many") else "")
    print(f"{r['config']:20} {r['mode']:17} {r['pages']:>5} {n:>3} {r['bytes'] / 1e6:>9.2f} {r['ms']:>9.3f} "
          f"{r['contiguous_ms']:>9.3f} {r['ratio']:>6.3f} {r['dispatches']:>4} {str(r['exact']):>5}  {extra}",
          file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=None,
                    help="model configs (configs/NAME.json), comma-separated; gemma3_270m is the GQA layout "
                         "(default: deepseek_v4_flash,deepseek_v41_flash,gemma3_270m)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    ap.add_argument("--pages", default=None, help="kv pages per prefix (P), comma-separated (default: 1,16,256,4096)")
    ap.add_argument("--batch", default=None, help="batched mode: requests per step (N), comma-separated (default: 1,4,16)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="measured rounds per run (default: 30 up to 16 pages, 8 up to 256, 3 above)")
    ap.add_argument("--max-held-gb", type=float, default=32.0,
                    help="skip a run whose cache must hold more than this many GB (device and host each)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts' tokens and bytes")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny_v4 and tiny_gqa, 1 and 4 pages, batch 1 and 4, 2 rounds, every mode (flags "
                         "given override these): CPU, seconds")
    ap.add_argument("--view-mb", default=None,
                    help="TransferConfig.view_bytes in MB: parts of host blocks this large move as DLPack views "
                         "of their rows (0: every part; none: never; default: the config's)")
    ap.add_argument("--early-copy-mb", type=float, default=None,
                    help="TransferConfig.early_copy_bytes in MB (default: the config's; larger than a block: no early copies)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_hits.json, or .../smoke/ with --smoke; $OUT/ when set)")
    args = ap.parse_args()
    defaults = (("tiny_v4,tiny_gqa", "1,4", "1,4", 2) if args.smoke else
                ("deepseek_v4_flash,deepseek_v41_flash,gemma3_270m", "1,16,256,4096", "1,4,16", None))
    args.configs, args.pages, args.batch, args.rounds = (given if given is not None else default for given, default in
                                                         zip((args.configs, args.pages, args.batch, args.rounds), defaults))
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    args.out = args.out or default_out("bench_hits.json", args.smoke)
    transfer = transfer_overrides(ap, args.view_mb, args.early_copy_mb)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": str(jax.devices()[0]),
              "transfer": transfer, "runs": []}
    print(f"{'config':20} {'mode':17} {'pages':>5} {'N':>3} {'MB':>9} {'hit ms':>9} {'contig ms':>9} {'ratio':>6} "
          f"{'disp':>4} exact", file=sys.stderr)
    for config in args.configs.split(","):
        for mode in modes:
            for pages in (int(p) for p in args.pages.split(",")):
                rounds = args.rounds or (30 if pages <= 16 else 8 if pages <= 256 else 3)
                for n in ([int(b) for b in args.batch.split(",")] if mode == "batched" else [1]):
                    r = run(config, mode, pages, rounds, n, args.seed, int(args.max_held_gb * 1e9), transfer)
                    result["runs"].append(r)
                    show(r)
                    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    measured = [r for r in result["runs"] if "skipped" not in r]
    result["exact"] = bool(measured) and all(r["exact"] and r["bytes_as_expected"] for r in measured)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    if not result["exact"]:
        sys.exit("bench_hits: a hit restored other bytes than were written, or moved other bytes than expected")


if __name__ == "__main__":
    main()
