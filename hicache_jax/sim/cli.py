"""`python -m hicache_jax.sim`: size device, host and shared storage tiers for N instances on a trace.

    python -m hicache_jax.sim --trace traces/conversation_trace.jsonl.gz \\
        --config configs/deepseek_v4_flash.json --instances 8 --route affinity \\
        --device-tokens 1M --host-tokens 4M --storage-tokens 32M

A Mooncake-format trace is replayed through N instances, each a real `TreeCore` with
real allocators and policies, on a simulated clock (transfers: bytes over link rates;
prefill: tokens over a compute rate). Sizes are tokens of anchor capacity (2000000, 2M,
512k), bytes (64GiB, 80GB; the `--*-gib` flags take GiB) or 'unlimited'; each tier also
holds `--window-ratio` window (SWA) pages per anchor page. `--sweep FLAG=A,B,C` runs once
per value of any flag and prints a table; `--plot FILE` draws hit rate and TTFT against
it. The last line is JSON: requests, instances, hit_rate {device, host, storage, total},
bytes_moved, ttft_ms, prefill_tokens_saved, and more. No jax is imported.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from hicache_jax.config import (HiCacheConfig, PrefetchPolicy, StorageConfig, StorageWritePolicy, WritePolicyName,
                                load_model_config)
from hicache_jax.layout import build_layout
from hicache_jax.sim.config import ROUTES, Rates, SimConfig
from hicache_jax.sim.fleet import check_fits, simulate
from hicache_jax.sim.report import plot_sweep, summary, sweep_table
from hicache_jax.sim.sizing import GIB, TierSize, tier_pages
from hicache_jax.trace import read_trace
from hicache_jax.window_policy import DEFAULT_WINDOW_POLICY, WindowPolicy

TIERS = ("device", "host", "storage")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hicache_jax.sim", description=__doc__, formatter_class=_Formatter)
    ap.add_argument("--trace", required=True, help="Mooncake-format trace: JSON lines, plain or .gz")
    ap.add_argument("--config", required=True, help="model config JSON (configs/...): bytes per page per pool")
    ap.add_argument("--limit", type=int, default=None, help="only the first N requests of the trace")
    ap.add_argument("--max-input-tokens", type=int, default=None, help="cut every prompt to this many tokens")
    for tier, what in (("device", "per instance (required)"), ("host", "per instance (required)"),
                       ("storage", "shared by every instance (absent: no storage tier)")):
        g = ap.add_mutually_exclusive_group()
        g.add_argument(f"--{tier}-tokens", dest=tier, type=str, default=None, metavar="SIZE",
                       help=f"{tier} tier {what}: tokens (2M), bytes (64GiB) or 'unlimited'")
        g.add_argument(f"--{tier}-gib", dest=tier, type=lambda s: f"{s}GiB", default=None, metavar="GIB",
                       help=f"{tier} tier {what}, in GiB of memory (window pages included)")
    ap.add_argument("--window-ratio", type=float, default=0.25,
                    help="window (SWA) pages each tier holds per anchor page (layouts with a sliding window)")
    ap.add_argument("--instances", type=int, default=1, help="serving instances")
    ap.add_argument("--route", default="affinity", choices=ROUTES, help="how requests are spread over instances")
    ap.add_argument("--load-bound", type=int, default=4,
                    help="affinity: only instances with at most this many requests more than the least loaded")
    ap.add_argument("--window-policy", default=DEFAULT_WINDOW_POLICY, metavar="POLICY",
                    help="page boundaries that keep their SWA pages: every, ends, or ends+every_N")
    ap.add_argument("--write-policy", default="write_through", choices=[p.value for p in WritePolicyName],
                    help="when device pages are backed up to the host tier")
    ap.add_argument("--load-back-threshold", type=int, default=10, help="smallest host hit loaded back, in tokens")
    ap.add_argument("--storage-write-policy", default="write_through", choices=[p.value for p in StorageWritePolicy],
                    help="store host copies when their backup lands, or when the host tier evicts them")
    ap.add_argument("--prefetch-policy", default="timeout", choices=[p.value for p in PrefetchPolicy],
                    help="how long a request waits for pages being read from storage (StorageConfig's timeouts)")
    ap.add_argument("--prefill-tokens-per-s", type=float, default=Rates.prefill_tokens_per_s,
                    help="prefill rate of one instance (an assumption: measure your model)")
    ap.add_argument("--host-link-gbps", type=float, default=Rates.host_link_bytes_per_s / 1e9,
                    help="device <-> host GB/s, each direction (H200: V4-Flash backup 45.1, load 44.1)")
    ap.add_argument("--storage-read-gbps", type=float, default=Rates.storage_read_bytes_per_s / 1e9,
                    help="storage -> host GB/s per instance (H200 machine, Mooncake over loopback TCP)")
    ap.add_argument("--storage-write-gbps", type=float, default=Rates.storage_write_bytes_per_s / 1e9,
                    help="host -> storage GB/s per instance (H200 machine, Mooncake over loopback TCP)")
    ap.add_argument("--storage-lookup-ms", type=float, default=Rates.storage_lookup_s * 1e3,
                    help="one storage lookup (how many pages of a prompt the store holds)")
    ap.add_argument("--serial", action="store_true",
                    help="ignore timestamps: each request starts after the one before and its transfers landed")
    ap.add_argument("--seed", type=int, default=0, help="seed of random routing")
    ap.add_argument("--sweep", default=None, metavar="FLAG=A,B,C",
                    help="run once per value of FLAG (any flag above, e.g. host-tokens=1M,4M,16M) and tabulate")
    ap.add_argument("--plot", default=None, metavar="PNG", help="with --sweep: draw hit rate and TTFT against FLAG")
    ap.add_argument("--quiet", action="store_true", help="no progress and no summary; only the JSON line")
    return ap


@dataclasses.dataclass(frozen=True)
class Plan:
    """One run the flags describe: its config, and each tier's size as given."""

    config: SimConfig
    sizes: dict


def build(args, ap: argparse.ArgumentParser, layout, requests) -> Plan:
    """The SimConfig the flags describe; a bad flag ends the run through `ap.error`."""
    for name in ("limit", "max_input_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.instances < 1:
        ap.error(f"--instances must be >= 1, got {args.instances}")
    if args.load_bound < 0 or args.load_back_threshold < 0 or args.seed < 0:
        ap.error("--load-bound, --load-back-threshold and --seed must be >= 0")
    if not args.window_ratio >= 0:
        ap.error(f"--window-ratio must be >= 0, got {args.window_ratio}")
    try:
        policy = WindowPolicy.parse(args.window_policy)
    except ValueError as e:
        ap.error(f"--window-policy: {e}")
    try:
        rates = Rates(args.host_link_gbps * 1e9, args.storage_read_gbps * 1e9, args.storage_write_gbps * 1e9,
                      args.storage_lookup_ms / 1e3, args.prefill_tokens_per_s)
    except ValueError as e:
        ap.error(f"a rate flag (--host-link-gbps, --storage-*-gbps, --storage-lookup-ms, --prefill-tokens-per-s): {e}")
    page = layout.page_size
    cut = args.max_input_tokens
    unlimited = sum(-(-(r.input_length if cut is None else min(r.input_length, cut)) // page) for r in requests) + 1
    sizes, pages = {}, {}
    for tier in TIERS:
        text = getattr(args, tier)
        if text is None:
            if tier != "storage":
                ap.error(f"--{tier}-tokens (or --{tier}-gib) is required")
            continue
        try:
            sizes[tier] = TierSize.parse(text)
        except ValueError as e:
            ap.error(f"--{tier}-tokens / --{tier}-gib: {e}")
        pages[tier] = tier_pages(layout, sizes[tier], args.window_ratio, unlimited)
    try:
        cache = HiCacheConfig(device_pages=pages["device"][layout.anchor.name],
                              swa_device_pages=pages["device"].get(layout.swa_pool.name) if layout.swa_pool else None,
                              host_pages=pages["host"], write_policy=args.write_policy,
                              load_back_threshold=args.load_back_threshold,
                              storage=StorageConfig(write_policy=args.storage_write_policy,
                                                    prefetch_policy=args.prefetch_policy))
    except ValueError as e:
        ap.error(f"tier sizes (--device-tokens {args.device}, --host-tokens {args.host}): {e}")
    config = SimConfig(cache, args.instances, args.route, args.load_bound, pages.get("storage"), policy, rates,
                       cut, args.serial, args.seed)
    if "storage" in pages and not any(pages["host"].values()):
        ap.error(f"--storage-tokens {args.storage} needs a host tier (storage pages reach the device "
                 f"through the host): --host-tokens {args.host} gives none")
    try:
        check_fits(layout, config, requests)
    except ValueError as e:
        window = f" ({args.window_ratio} window pages per page: --window-ratio)" if layout.swa_pool else ""
        ap.error(f"--device-tokens {args.device}{window}: {e}")
    return Plan(config, sizes)


_NOT_SWEPT = ("sweep", "plot", "trace", "config", "quiet", "help", "limit")


def _sweep(spec: str, argv: list[str], ap: argparse.ArgumentParser) -> tuple[str, list[list[str]]]:
    """(the swept flag, one argv per value): `argv` without any flag setting the same
    value (--host-gib when sweeping host-tokens), then `--FLAG value`."""
    flag, sep, values = spec.partition("=")
    flag = flag.strip().lstrip("-")
    actions = {opt: a for a in ap._actions for opt in a.option_strings if a.nargs != 0}
    action = actions.get(f"--{flag}")
    values = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not values or action is None or flag in _NOT_SWEPT:
        ap.error(f"--sweep {spec!r}: expected FLAG=A,B,C with FLAG a flag that takes a value, "
                 f"e.g. host-tokens=1M,4M,16M")
    same = {opt for opt, a in actions.items() if a.dest == action.dest} | {"--sweep", "--plot"}
    base, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in same:
            skip = True
        elif arg.partition("=")[0] not in same:
            base.append(arg)
    return flag, [base + [f"--{flag}", v] for v in values]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    args = ap.parse_args(argv)
    if args.plot is not None and args.sweep is None:
        ap.error("--plot draws a sweep: give --sweep FLAG=A,B,C too")
    try:
        layout = build_layout(load_model_config(args.config))
    except (OSError, ValueError) as e:
        ap.error(f"--config {args.config}: {getattr(e, 'strerror', None) or e}")
    try:
        requests = read_trace(args.trace, limit=args.limit)
    except (OSError, ValueError) as e:
        ap.error(f"--trace {args.trace}: {getattr(e, 'strerror', None) or e}")
    if not requests:
        ap.error(f"--trace {args.trace}: no requests")
    if args.sweep is None:
        runs = [(None, build(args, ap, layout, requests))]
    else:     # every value is checked before the first run starts
        flag, argvs = _sweep(args.sweep, argv, ap)
        runs = [(a[-1], build(ap.parse_args(a), ap, layout, requests)) for a in argvs]
    if args.plot is not None:
        try:
            open(args.plot, "ab").close()
        except OSError as e:
            ap.error(f"--plot {args.plot}: cannot write there ({e.strerror})")
    results = []
    for value, plan in runs:
        tag = "" if value is None else f"{args.sweep.partition('=')[0]}={value}: "
        t0 = time.perf_counter()
        progress = None if args.quiet else (lambda done, total, tag=tag, t0=t0: print(
            f"  {tag}{done:,} / {total:,} requests ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True))
        result = simulate(requests, layout, plan.config, progress)
        results.append((value, plan, result))
        if not args.quiet:
            print(summary(layout, plan, result, tag), flush=True)
    out = results[-1][2].to_json()
    out["sizes"] = {t: str(s) for t, s in results[-1][1].sizes.items()}
    if args.sweep is not None:
        flag = args.sweep.partition("=")[0].strip().lstrip("-")
        if not args.quiet:
            print(sweep_table(flag, results), flush=True)
        out["sweep"] = {"flag": flag, "runs": [{"value": v, **_brief(r)} for v, _, r in results]}
        if args.plot is not None:
            plot_sweep(flag, results, layout, args.plot)
    print(json.dumps(out))
    return 0


def _brief(result) -> dict:
    j = result.to_json()
    return {k: j[k] for k in ("hit_rate", "ttft_ms", "bytes_moved", "tiers", "prefill_tokens_saved", "wall_s")}


__all__ = ["GIB", "main", "parser"]
