"""Where a serving loop's cache calls spend their host time.

A request's TTFT holds the cache's calls before its first forward (`step`, `acquire`,
`alloc`). On a GPU their programs and copies run after the calls return, so what a call
costs the request is host time: the transfer programs' dispatch, the `jax.device_put`s that
hand a backup's rows to the host (and small indices to the device), waits for transfers,
and the tree's and the engine's Python. This times each part inside every call:

- `decode`: `examples/decode.py`'s overlapped write-back cases (tiny V4 5150 and tiny V4.1
  9090, 2 layer groups: where a hit's `acquire` first demotes write-back pages to make
  room), per request: each call's ms and, inside it, `program` (compiled programs called),
  `device_put`, `block` (`jax.block_until_ready`) ms and counts; the rest is Python.
- `acquire_many`: 16 requests x 16 V4-Flash pages, each prefix backed up alone, acquired
  together: the call split the same way, and the time until the device is done.

Every compiled program and `device_put` that runs inside a cache call is timed (this
script wraps `jax.stages.Compiled.__call__` and `jax.device_put` for the run).

    python benchmarks/cache_calls.py --out cache_calls.json
    python benchmarks/cache_calls.py --smoke --out cache_calls.json    # CPU: tiny V4, 4 x 1
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "benchmarks")]
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

import jax  # noqa: E402

import hicache_jax as hc  # noqa: E402

clock = time.perf_counter
CALLS = ("step", "acquire", "alloc", "acquire_many")
DECODE_CASES = [("tiny_v4", 5150, 8, 32), ("tiny_v41", 9090, 9, 40)]


class CallSplit:
    """While installed, every outermost call of `CALLS` on any `HiCache` is recorded with
    the time spent inside it in programs, `device_put`s and `block_until_ready` waits."""

    def __init__(self):
        self.calls: list[dict] = []
        self._inside: str | None = None
        self._parts: collections.Counter = collections.Counter()
        self._counts: collections.Counter = collections.Counter()

    @contextlib.contextmanager
    def installed(self):
        saved = [(hc.HiCache, n, getattr(hc.HiCache, n)) for n in CALLS]
        saved += [(jax.stages.Compiled, "__call__", jax.stages.Compiled.__call__),
                  (jax, "device_put", jax.device_put), (jax, "block_until_ready", jax.block_until_ready)]
        for owner, name, fn in saved:
            setattr(owner, name, self._call(name, fn) if name in CALLS else self._part(name, fn))
        try:
            yield self
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)

    def _call(self, name, fn):
        def call(*args, **kwargs):
            if self._inside is not None:
                return fn(*args, **kwargs)
            self._inside = name
            self._parts.clear()
            self._counts.clear()
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                ms = 1e3 * (clock() - t)
                self._inside = None
                parts = {k: round(1e3 * v, 3) for k, v in self._parts.items()}
                self.calls.append({"call": name, "ms": round(ms, 3), **parts,
                                   "python": round(ms - sum(parts.values()), 3),
                                   **{"n_" + k: v for k, v in self._counts.items()}})
        return call

    def _part(self, name, fn):
        part = "program" if name == "__call__" else "block" if name == "block_until_ready" else name

        def timed(*args, **kwargs):
            if self._inside is None:
                return fn(*args, **kwargs)
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self._parts[part] += clock() - t
                self._counts[part] += 1
        return timed


def before_forward(calls: list[dict]) -> list[list[dict]]:
    """The calls a serving loop makes before each forward: a `step` directly followed by
    `acquire`, then everything up to the first `alloc` (warm-up's and resumed requests'
    included: decode's `cache_calls_ms_in_ttft` says which are requests' first forwards)."""
    out = []
    for i, c in enumerate(calls[:-1]):
        if c["call"] == "step" and calls[i + 1]["call"] == "acquire":
            group = [c]
            for later in calls[i + 1:]:
                group.append(later)
                if later["call"] == "alloc":
                    break
            out.append(group)
    return out


def decode_case(config: str, seed: int, device_pages: int, host_pages: int) -> dict:
    import decode
    split, printed = CallSplit(), io.StringIO()
    with split.installed(), contextlib.redirect_stdout(printed):
        rc = decode.main(["--config", str(ROOT / "configs" / f"{config}.json"), "--seed", str(seed),
                          "--device-pages", str(device_pages), "--host-pages", str(host_pages),
                          "--write-policy", "write_back", "--overlap", "--layer-groups", "2", "--quiet"])
    run = json.loads(printed.getvalue().strip().splitlines()[-1])
    if rc or not run["identical"]:
        raise RuntimeError(f"decode {config} {seed}: rc {rc}, identical {run['identical']}")
    groups = before_forward(split.calls)
    return {"config": config, "seed": seed, "device_pages": device_pages, "host_pages": host_pages,
            "cache_calls_ms_in_ttft": run["cache_calls_ms_in_ttft"], "host_hit_per_request": run["host_hit_per_request"],
            "before_forward": [{"ms": round(sum(c["ms"] for c in g), 3), "calls": g} for g in groups]}


def acquire_many_case(config: str, pages: int, n: int, rounds: int) -> dict:
    import bench_hits
    from hit_requests import compute, to_host
    cache = bench_hits.make_cache(config, "write_through", n * pages, 2 * n)
    hits = bench_hits.Hits(cache, 1)
    reqs = []
    for _ in range(n):
        reqs.append(compute(cache, hits.fresh(pages), hits.seed))
        cache.step()                                # each prompt backed up alone
    prompts = [r.prompt() for r in reqs]
    warm = bench_hits.WARM + 1                      # its cache fuses like bench_hits: the shape compiles in warm-up
    split, rows = CallSplit(), []
    with split.installed():
        for r in range(warm + rounds):
            to_host(cache)
            jax.block_until_ready(cache.device_pools)
            if r == warm - 1:
                cache.wait_compiles()               # the merged load's program, compiled in the background
            t = clock()
            prefixes = cache.acquire_many(prompts, load_back=True, deferred=False)
            jax.block_until_ready(cache.device_pools)
            done = 1e3 * (clock() - t)
            if any(p.host_tokens != pages * cache.layout.page_size for p in prefixes):
                raise RuntimeError("a request's prefix did not come from the host whole")
            for p in prefixes:
                cache.unlock(p.lock)
            if r >= warm:
                rows.append({**split.calls[-1], "device_done_ms": round(done, 3)})
    keys = sorted({k for row in rows for k in row if k != "call"})
    return {"config": config, "pages": pages, "requests": n, "rounds": rows,
            "median": {k: round(statistics.median(row.get(k, 0) for row in rows), 3) for k in keys}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="measured acquire_many rounds")
    ap.add_argument("--smoke", action="store_true", help="one decode case, tiny V4 4 x 1 (CPU, CI)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="result JSON (default: benchmarks/results/cache_calls.json, or $OUT)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    cases = DECODE_CASES[:1] if args.smoke else DECODE_CASES
    many = ("tiny_v4", 1, 4, 2) if args.smoke else ("deepseek_v4_flash", 16, 16, args.rounds)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].device_kind,
              "decode": [decode_case(*case) for case in cases], "acquire_many": acquire_many_case(*many)}
    for case in result["decode"]:
        slow = max(case["before_forward"], key=lambda r: r["ms"])
        print(f"{case['config']} {case['seed']}: slowest request's cache calls {slow['ms']} ms: {slow['calls']}")
    print(f"acquire_many {many[2]} x {many[1]}: {result['acquire_many']['median']}")
    out = args.out or default_out("cache_calls.json", args.smoke)
    pathlib.Path(out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
