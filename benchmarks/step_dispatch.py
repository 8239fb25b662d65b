"""How long a batched model step holds the host, by how its loop over the slots is built.

The examples' batched step (`ChunkModel.forward_batch`) loops over its slots with a traced
trip count. On a GPU, XLA's runtime reads a dynamic loop's condition back to the host each
iteration unless the loop runs inside a command buffer, so the call returns only when the
device is nearly done, and whatever the host does next (the cache's calls, the scheduler)
cannot overlap the step. This probe times, for tiny V4 at `--batch` slots with `--count` of
them computed (decode rows), each way of building that step:

    traced          the examples' step as it is (step_compiler_options())
    traced_cmdbuf   the same, its WHILE and CONDITIONAL ops allowed into command buffers
    static_cond     a loop of B iterations, each slot behind lax.cond(i < count)
    static_cond_cmdbuf  the same in command buffers
    static_all      a loop of B iterations computing every slot, those past count on a trash
                    page (no condition: nothing waits on the device; their compute is the price)

and reports, per way, the median host time until the call returned (`dispatch_ms`) and until
the step was done (`done_ms`), and whether its logits and pools equal the traced step's bit
for bit. A way XLA refuses to compile is reported with its error. On a CPU every way runs
inside its call (no overlap to find): the run checks the bits and the probe's own code.

    python benchmarks/step_dispatch.py --out step_dispatch.json      # GPU
    python benchmarks/step_dispatch.py --smoke --out /tmp/s.json     # CPU: 4 slots, 3 computed, 2 rounds
"""
from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from outputs import default_out  # noqa: E402

import hicache_jax as hc  # noqa: E402
from examples.tiny_models import SlotBatch, make_model  # noqa: E402

# XLA's default command buffer types, and the same with loops and conditionals added
CMDBUF = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny_v4", help="tiny model config (configs/NAME.json) (default: tiny_v4)")
    ap.add_argument("--batch", type=int, default=16, help="slots of the step, B (default: 16)")
    ap.add_argument("--count", type=int, default=12, help="slots computed (default: 12)")
    ap.add_argument("--rounds", type=int, default=50, help="timed calls per way (default: 50)")
    ap.add_argument("--smoke", action="store_true", help="4 slots, 3 computed, 2 rounds (flags given override)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/step_dispatch.json)")
    args = ap.parse_args(argv)
    if args.smoke:
        given = set(argv if argv is not None else sys.argv[1:])
        for flag, value in (("--batch", 4), ("--count", 3), ("--rounds", 2)):
            if flag not in given:
                setattr(args, flag[2:], value)
    if not 1 <= args.count <= args.batch:
        ap.error(f"--count must be in 1..--batch ({args.batch}), got {args.count}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def static_step(model, cond: bool):
    """The traced step's body over all B slots, a loop of known trip count. `cond`: each
    slot behind lax.cond(i < count). Else every slot is computed, those past `count` on the
    trash page their tables point at, their logits zeroed: nothing waits on the device's
    values, and their compute is the price."""
    def step(params, pools, slots):
        def slot(i, carry):
            pools, out = carry
            pools, _, last = model._forward(params, pools, slots.anchor_pages[i], slots.swa_pages[i],
                                            slots.tokens[i], slots.start[i], slots.valid[i], slots.logits[i], None)
            last = last.astype(jnp.float32) if cond else jnp.where(i < slots.count, last.astype(jnp.float32), 0.0)
            return pools, jax.lax.dynamic_update_index_in_dim(out, last, i, 0)

        def body(i, carry):
            if not cond:
                return slot(i, carry)
            return jax.lax.cond(i < slots.count, functools.partial(slot, i), lambda c: c, carry)
        out = jnp.zeros((slots.tokens.shape[0], model.vocab_size), jnp.float32)
        return jax.lax.fori_loop(0, slots.tokens.shape[0], body, (pools, out))
    return step


def ways(model):
    base = hc.step_compiler_options()
    cmdbuf = {**base, "xla_gpu_enable_command_buffer": CMDBUF} if jax.default_backend() == "gpu" else None
    out = {"traced": (model._forward_batch, base), "static_cond": (static_step(model, cond=True), base),
           "static_all": (static_step(model, cond=False), base)}
    if cmdbuf is not None:     # a GPU flag: other backends reject it
        out |= {"traced_cmdbuf": (model._forward_batch, cmdbuf),
                "static_cond_cmdbuf": (static_step(model, cond=True), cmdbuf)}
    return out


def make_inputs(model, batch: int, count: int, pool_pages: int):
    """Decode rows for `count` sequences on pages of their own, the other slots on the
    last page (the trash page, which no computed slot uses), garbage pools (fixed seed)."""
    rng = np.random.default_rng(0)
    C, M = model.chunk_size, model.max_pages
    pools = {}
    for name, (shape, dtype) in model.pool_shapes(pool_pages, pool_pages).items():
        dt = np.dtype(jnp.dtype(dtype))
        raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        pools[name] = raw.view(dt).reshape(shape)
    pages = np.arange(batch * M, dtype=np.int32).reshape(batch, M) % pool_pages
    pages[count:] = pool_pages - 1                           # slots not computed: the trash page only
    start = np.full(batch, C * (M // 2), np.int32)          # a decode row half way through the context
    slots = SlotBatch(count=np.int32(count), tokens=rng.integers(1, model.vocab_size, (batch, C)).astype(np.int32),
                      start=start, valid=np.full(batch, C // 2, np.int32), anchor_pages=pages,
                      swa_pages=pages, logits=np.ones(batch, np.bool_))
    return pools, slots


def measure(fn, params, pools_np, slots, rounds: int) -> dict:
    """Median host ms until `fn` returned and until its outputs were ready; the last outputs."""
    dispatch, done, out = [], [], None
    for r in range(rounds + 2):                   # 2 untimed: compile, first run
        pools = {k: jnp.asarray(v) for k, v in pools_np.items()}
        jax.block_until_ready(pools)
        t = time.perf_counter()
        out = fn(params, pools, slots)
        returned = time.perf_counter()
        jax.block_until_ready(out)
        finished = time.perf_counter()
        if r >= 2:
            dispatch.append(returned - t)
            done.append(finished - t)
    return {"dispatch_ms": round(statistics.median(dispatch) * 1e3, 3),
            "done_ms": round(statistics.median(done) * 1e3, 3), "out": out}


def equal(a, b, trash: int) -> bool:
    """(pools, logits) bit for bit (the garbage pools hold NaNs, which == would call
    different), the pools' trash page left out (`static_all` writes it)."""
    (pa, la), (pb, lb) = a, b
    if la.tobytes() != lb.tobytes() or pa.keys() != pb.keys():
        return False
    return all(np.delete(np.asarray(pa[k]), trash, axis=1).tobytes() == np.delete(np.asarray(pb[k]), trash, axis=1).tobytes()
               for k in pa)


def main(argv=None) -> int:
    args = parse_args(argv)
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / f"{args.config}.json"))
    model = make_model(layout, seed=0, max_pages=16)
    pool_pages = args.batch * model.max_pages + 1
    pools_np, slots = make_inputs(model, args.batch, args.count, pool_pages)
    rows, reference = {}, None
    for name, (step, options) in ways(model).items():     # "traced" first: the reference
        try:
            fn = jax.jit(step, donate_argnums=(1,), compiler_options=options)
            got = measure(fn, model.params, pools_np, slots, args.rounds)
        except Exception as e:          # noqa: BLE001  (a way XLA refuses: reported, the others still run)
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name:20} error: {rows[name]['error'][:120]}", file=sys.stderr)
            continue
        out = got.pop("out")
        pools, logits = out
        if reference is None:
            reference = (pools, np.asarray(logits)[:args.count])
        got["identical"] = equal((pools, np.asarray(logits)[:args.count]), reference, trash=pool_pages - 1)
        rows[name] = got
        print(f"{name:20} dispatch {got['dispatch_ms']:8.3f} ms  done {got['done_ms']:8.3f} ms  "
              f"identical {got['identical']}", file=sys.stderr)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].device_kind,
              "config": args.config, "batch": args.batch, "count": args.count, "rounds": args.rounds, "ways": rows,
              "identical": "error" not in rows["traced"]
                           and all(r["identical"] for r in rows.values() if "error" not in r)}
    out = pathlib.Path(args.out) if args.out else default_out("step_dispatch.json", smoke=args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
