"""The fleet planner's prediction checked against real processes.

`RealFleet` starts N worker processes (this file run as a script), each a real `HiCache`
(jax on the CPU, the transfer engine, host tier and storage link included) whose storage
tier is one shared store (a loopback `mooncake_master`). A coordinator routes a slice of a
trace over them with the simulator's own `Router`, asking each process its tree's coverage
of the prompt, and each process serves the request the way the simulator does:

    step -> acquire (match, storage prefetch, lock, load back) -> alloc -> insert the
    prompt's whole pages with the SWA pages the window policy keeps -> free the rest ->
    unlock -> step -> drain

`drain` after every request (and one request at a time) makes every transfer, storage
writes included, land before the next request starts: the simulator's serial mode, where
timing decides nothing. Each process answers with the tokens of its prompt that came from
device, host and storage.

Protocol: one JSON command per line on the worker's stdin; answers are the stdout lines
that start with `ANSWER` (anything else a library prints there is ignored).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ANSWER = "@@answer "


def worker(argv: list[str]) -> int:
    """One serving process: builds its cache, then answers commands until stdin ends."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import hicache_jax as hc
    from hicache_jax.trace import read_trace, request_tokens

    ap = argparse.ArgumentParser()
    for flag in ("--config", "--trace", "--storage", "--window-policy", "--host-pages", "--model-id"):
        ap.add_argument(flag, required=True)
    for flag in ("--limit", "--max-input-tokens", "--device-pages", "--swa-device-pages"):
        ap.add_argument(flag, type=int, required=True)
    args = ap.parse_args(argv)
    layout = hc.build_layout(hc.load_model_config(ROOT / args.config))
    vocab = layout.model.vocab_size
    prompts = [request_tokens(r, vocab, max_tokens=args.max_input_tokens)
               for r in read_trace(ROOT / args.trace, limit=args.limit)]
    policy = hc.WindowPolicy.parse(args.window_policy)
    cache = hc.HiCache(layout, hc.HiCacheConfig(device_pages=args.device_pages,
                                                swa_device_pages=args.swa_device_pages,
                                                host_pages=json.loads(args.host_pages),
                                                storage=hc.StorageConfig(url=args.storage, model_id=args.model_id,
                                                                         prefetch_policy="wait_complete",
                                                                         call_timeout_s=30.0)))
    page, swa_alloc = layout.page_size, cache.swa_allocator

    def serve(tokens: np.ndarray) -> dict:
        cache.step()
        prefix = cache.acquire(tokens)
        first, total = prefix.length // page, -(-len(tokens) // page)
        grant = cache.alloc(total - first, total - first if swa_alloc else 0)
        anchor = prefix.device_pages.tolist() + grant[cache.anchor].tolist()
        whole = len(tokens) // page
        keep = {}
        if swa_alloc:
            window, new_swa = prefix.swa_pages, grant[swa_alloc].tolist()
            swa = {first - len(window) + i: int(p) for i, p in enumerate(window)}
            swa.update({first + i: p for i, p in enumerate(new_swa)})
            keep = {q: swa[q] for q in sorted(policy.keep_pages(len(tokens), page, cache.window_pages, first))}
            unused = [p for p in new_swa if p not in keep.values()]
            if unused:
                cache.free(swa_alloc, unused)
        cache.insert(tokens[: whole * page], anchor[:whole], keep)
        if len(anchor) > whole:
            cache.free(cache.anchor, anchor[whole:])
        cache.unlock(prefix.lock)
        cache.step()
        cache.drain()
        return {"device": prefix.device_tokens, "host": prefix.host_tokens - prefix.storage_tokens,
                "storage": prefix.storage_tokens}

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "coverage":       # what the router asks: the Instance.coverage rule
            tokens = prompts[cmd["req"]]
            answer = {"pages": cache._core.coverage(tokens[: max(0, (len(tokens) - 1) // page * page)])}
        elif cmd["op"] == "serve":
            answer = serve(prompts[cmd["req"]])
        elif cmd["op"] == "check":
            cache.check_invariants()
            s = cache.stats()
            answer = {"storage_failures": sum(n for r in s.storage.failures.values() for n in r.values())}
        else:
            raise ValueError(f"unknown command {cmd!r}")
        print(ANSWER + json.dumps(answer), flush=True)
    cache.close()
    return 0


class RealFleet:
    """N worker processes sharing one store (see the module docstring); `close()` ends them."""

    def __init__(self, instances: int, log_dir: pathlib.Path, **options):
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "MC_LOG_LEVEL": "WARNING"}
        self.logs = [open(log_dir / f"worker{i}.log", "w") for i in range(instances)]
        self.procs = [subprocess.Popen([sys.executable, __file__, *argv], cwd=ROOT, env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
                      for log in self.logs]

    def ask(self, i: int, **cmd) -> dict:
        proc = self.procs[i]
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER):])
        self.logs[i].flush()
        raise RuntimeError(f"worker {i} ended without answering {cmd}: see {self.logs[i].name}")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in self.logs:
            log.close()


def run_real(fleet: RealFleet, router, requests: int) -> list[tuple[int, int, int, int]]:
    """Route and serve requests 0 .. requests-1 one at a time: (instance, device, host,
    storage tokens) per request. Loads are all 0 between requests (each one ends before
    the next is routed), as in the simulator's serial mode."""
    out = []
    for k in range(requests):
        i = router.pick(lambda j: fleet.ask(j, op="coverage", req=k)["pages"], lambda j: 0)
        got = fleet.ask(i, op="serve", req=k)
        out.append((i, got["device"], got["host"], got["storage"]))
    return out


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
