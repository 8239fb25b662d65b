"""Where the decode example's first requests spend their time to first token, each case
served alone in a process of its own (no other process on the accelerator).

`examples/decode.py` runs as it is, with its cache calls (`step`, `acquire`, `alloc`,
`insert`, `unlock`, `set_device_pools`), the model's steps (`forward`: the dispatch of one
chunk) and each request's prefill (`prefill`: its chunks up to the fetched logits of the
last) timed by wrappers that add no sync. Each case runs twice, in turn: with the example's
warm-up (`fetch`: the warm-up's logits are fetched to the host, as serving fetches them) and
with a warm-up that leaves them on the device (`no_fetch`), which is how it was before. The
JSON keeps every request's TTFT of both passes (with the cache, recomputed) and the timed
phases of the first `--phase-requests` requests.

    python benchmarks/first_requests.py --out first_requests.json      # the cases below
    python benchmarks/first_requests.py --smoke --out first_requests.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)

# (config, seed, device pages, host pages, write policy, layer groups): the GPU suite's cases
# whose TTFT max went over twice the median when three test processes shared the H200
CASES = [("tiny_gqa", 9090, 8, 32, "write_through", 4), ("tiny_gqa", 5150, 8, 32, "write_back", 2),
         ("tiny_gqa", 9090, 8, 32, "write_through", 2), ("tiny_v41", 5150, 9, 40, "write_through", 4)]
WARM_UPS = ("no_fetch", "fetch")
CACHE_CALLS = ("step", "acquire", "alloc", "insert", "unlock", "set_device_pools")


def decode_argv(case, requests: int) -> list[str]:
    config, seed, dev, host, policy, groups = case
    argv = ["--config", f"configs/{config}.json", "--seed", str(seed), "--device-pages", str(dev), "--host-pages",
            str(host), "--write-policy", policy, "--requests", str(requests), "--quiet"]
    return argv + (["--overlap", "--layer-groups", str(groups)] if groups else [])


def serve_timed(argv: list[str], warm_up: str, phase_requests: int) -> dict:
    """One decode run in this process, its phases timed; the fields `measure` keeps."""
    import jax
    import numpy as np

    import hicache_jax as hc
    from examples import decode, serving_loop

    now = {"pass": "cache", "request": -1}
    phases: list[tuple[str, int, str, float]] = []

    def timed(name, fn):
        def call(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            if 0 <= now["request"] < phase_requests:
                phases.append((now["pass"], now["request"], name, round(1e3 * (time.perf_counter() - t), 4)))
            return out
        return call

    def counted(fn, pass_name):
        def call(*args, **kwargs):
            if now["pass"] != pass_name:
                now["pass"], now["request"] = pass_name, -1
            if kwargs.get("out") is None:    # a preempted request resumes with its `out`: the same request
                now["request"] += 1
            return fn(*args, **kwargs)
        return call

    for name in CACHE_CALLS:
        setattr(hc.HiCache, name, timed(name, getattr(hc.HiCache, name)))
    serving_loop.PagedRequest.prefill = timed("prefill", serving_loop.PagedRequest.prefill)
    decode.run_cached = counted(decode.run_cached, "cache")
    decode.run_uncached = counted(decode.run_uncached, "recompute")
    make_model = decode.make_model

    def model_with_timed_steps(*args, **kwargs):
        model = make_model(*args, **kwargs)
        model.forward_chunk = timed("forward", model.forward_chunk)
        return model
    decode.make_model = model_with_timed_steps
    if warm_up == "no_fetch":
        def warm_up_without_fetch(model, cache, landings=False):
            z, tokens = np.zeros(model.max_pages, np.int32), np.zeros(model.chunk_size, np.int32)
            pools, logits = model.forward_chunk(cache.device_pools, z, z, tokens, 0, 1)
            for landing in cache.landing_examples() if landings else ():
                pools, logits = model.forward_chunk(pools, z, z, tokens, 0, 1, landing=landing)
            jax.block_until_ready(logits)
            cache.set_device_pools(pools)
        decode.warm_up = warm_up_without_fetch
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = decode.main(argv)
    result = json.loads(printed.getvalue().strip().splitlines()[-1])
    return {"rc": rc, "identical": result["identical"], "ttft_ms_cache": result["ttft_ms_cache"],
            "ttft_ms_recompute": result["ttft_ms_recompute"], "phases": phases}


def measure(case, warm_up: str, args) -> dict:
    """`case` under `warm_up` in a fresh process (a first request is first only once per process)."""
    argv = decode_argv(case, args.requests)
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps([argv, warm_up, args.phase_requests])],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"case {case} ({warm_up}) failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    cache = out["ttft_ms_cache"]
    first_prefill = [ms for run, req, name, ms in out["phases"] if (run, req, name) == ("cache", 0, "prefill")]
    return {"case": list(case), "warm_up": warm_up, **out,
            "max_over_median": round(max(cache) / statistics.median(cache), 3),
            "first_request_is_max": cache[0] == max(cache),
            "first_prefill_ms": first_prefill[0] if first_prefill else None}


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated indices into the cases (0..{len(CASES) - 1}; default: all)")
    ap.add_argument("--requests", type=int, default=12, help="requests per decode run (the example's --requests)")
    ap.add_argument("--phase-requests", type=int, default=3, help="requests whose phases are kept, from the first")
    ap.add_argument("--smoke", action="store_true", help="the first case, 4 requests (CPU, CI)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="result JSON (default: benchmarks/results/first_requests.json, or $OUT)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.requests = args.cases or "0", 4
    try:
        args.picked = [CASES[int(i)] for i in (args.cases or ",".join(map(str, range(len(CASES))))).split(",")]
    except (ValueError, IndexError):
        ap.error(f"--cases must list indices in 0..{len(CASES) - 1}, got {args.cases!r}")
    if args.requests < 2 or args.phase_requests < 1:
        ap.error(f"--requests must be >= 2 and --phase-requests >= 1, got {args.requests} and {args.phase_requests}")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.child:
        print(json.dumps(serve_timed(*json.loads(args.child))))
        return {}
    import jax
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].device_kind,
              "runs": []}
    for case in args.picked:
        for warm_up in WARM_UPS:
            run = measure(case, warm_up, args)
            result["runs"].append(run)
            print(f"{case[0]:9} seed {case[1]:5} groups {case[5]} {warm_up:8}: max/median {run['max_over_median']:.2f}, "
                  f"first {run['ttft_ms_cache'][0]:.1f} ms, first prefill {run['first_prefill_ms']} ms", flush=True)
    out = args.out or default_out("first_requests.json", args.smoke)
    pathlib.Path(out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
