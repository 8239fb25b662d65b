"""What a background compile costs a serving loop's steps, by GIL switch interval.

The transfer engine compiles some programs on a background thread while requests are
served (`hicache_jax/transfer/compile_cache.py`). Tracing and lowering are Python that holds
the GIL. The serving thread gives the GIL up at every wait (a dispatch, a fetch of the
step's tokens) and gets it back only when the holder reaches the interpreter's switch
interval. So each of its waits can cost up to that interval (the convoy effect), and the
engine shortens the interval while a background compile runs
(`compile_cache.BACKGROUND_SWITCH_INTERVAL_S`).

The loop's step here is four dispatches of a small jitted computation, each fetched
(`np.asarray`), and a little Python. It is timed alone and beside a thread that traces and
lowers a fresh 400-op program over and over, once per switch interval, taking turns.

    python benchmarks/bench_gil_convoy.py --out convoy.json
    python benchmarks/bench_gil_convoy.py --smoke --out convoy.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from flags import number_list  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from hicache_jax.transfer.compile_cache import BACKGROUND_SWITCH_INTERVAL_S  # noqa: E402


def lower_until(stop: threading.Event, ops: int) -> int:
    """Trace and lower fresh programs of `ops` operations until `stop`; how many it lowered."""
    done = 0
    while not stop.is_set():
        def program(x):            # a new function each time: nothing is cached
            for i in range(ops):
                x = jnp.sin(x) * (1.0 + i * 1e-3)
            return x
        jax.jit(program).trace(jnp.zeros((8,), jnp.float32)).lower()
        done += 1
    return done


def time_steps(steps: int) -> list[float]:
    step = jax.jit(lambda x: jnp.tanh(x @ x) * 0.5)
    x = jnp.ones((256, 256), jnp.float32)
    np.asarray(step(x))
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        for _ in range(4):                     # dispatches and waits, as a loop's step has
            np.asarray(step(x))
        sum(i * i for i in range(300))         # the loop's own Python
        out.append(time.perf_counter() - t)
    return out


def measure(interval: float, background: bool, steps: int, ops: int) -> dict:
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    stop, lowered = threading.Event(), []
    thread = threading.Thread(target=lambda: lowered.append(lower_until(stop, ops)), daemon=True)
    try:
        if background:
            thread.start()
            time.sleep(0.2)
        times = time_steps(steps)
    finally:
        stop.set()
        if background:
            thread.join()
        sys.setswitchinterval(before)
    return {"switch_interval_ms": round(interval * 1e3, 3), "background_lowering": background,
            "step_ms_p50": round(statistics.median(times) * 1e3, 3),
            "step_ms_p90": round(float(np.percentile(times, 90)) * 1e3, 3),
            "programs_lowered": lowered[0] if lowered else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", default=f"0.005,0.001,{BACKGROUND_SWITCH_INTERVAL_S}",
                    type=number_list(float, lambda v: 0 < v <= 1, "switch intervals in (0, 1] seconds"),
                    help="GIL switch intervals to try, in seconds, comma-separated (default: the "
                         "interpreter's 5 ms, 1 ms and the engine's value during a background compile)")
    ap.add_argument("--steps", type=int, default=200, help="loop steps timed per measurement (default: 200)")
    ap.add_argument("--repeats", type=int, default=2, help="turns of every measurement (default: 2)")
    ap.add_argument("--ops", type=int, default=400, help="operations per background program (default: 400)")
    ap.add_argument("--smoke", action="store_true", help="a few steps, one turn (seconds)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/gil_convoy.json)")
    args = ap.parse_args()
    intervals = args.intervals
    for name in ("steps", "repeats", "ops"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    steps, repeats, ops = (10, 1, 50) if args.smoke else (args.steps, args.repeats, args.ops)
    runs = []
    for r in range(repeats):
        for interval in intervals:
            for background in ((False, True) if r % 2 == 0 else (True, False)):
                runs.append(measure(interval, background, steps, ops))
                print(json.dumps(runs[-1]), file=sys.stderr)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "python": sys.version.split()[0],
              "device": str(jax.devices()[0]), "steps": steps, "ops": ops, "runs": runs}
    out = pathlib.Path(args.out) if args.out else default_out("gil_convoy.json", args.smoke)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"out": str(out), "runs": len(runs)}))


if __name__ == "__main__":
    main()
