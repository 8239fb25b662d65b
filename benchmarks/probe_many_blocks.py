"""Ways to move many whole pinned-host blocks to the device, each against one contiguous copy.

`acquire_many` of 16 requests x 16 V4-Flash pages reads 32 pinned blocks (each request's kv
block of 16 pages, 16 MB, and its sliding-window page, 8.2 MB) and took 10.2 ms against the
link's 7.45 ms for the same 386 MB as one array (BENCHMARKS.md). This probe moves the same
blocks without the cache around them, so that one GPU run says whether the blocks can move at
the link's speed at all, and in how many programs:

    contiguous     `jax.device_put` of one pinned array of all the bytes (the reference)
    puts           one `jax.device_put` per block, outside any jit
    list_put       one `jax.device_put` of the list of blocks
    one_jit        one jit moving every block (`device_put(b, Space.Device)` each), returning them
    one_jit_join   the same, each group's blocks joined on the device (as a fused load joins its pieces)
    two_programs   the first group's blocks by one jit (acquire_many's early `copy_many`), then one jit
                   taking those copies and moving the other groups' blocks, joining each group

Each round times every way once, in a rotating order, each paired with a contiguous copy
(ratio = contiguous ms / way ms, the median over rounds). Every way's bytes are checked.

    python benchmarks/probe_many_blocks.py --out probe_many.json      # 16 kv blocks and 16 SWA pages
    python benchmarks/probe_many_blocks.py --smoke --out probe_many.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from flags import count  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from pairing import paired_rounds  # noqa: E402

_DEVICE = jax.memory.Space.Device
V4_FLASH = "16x15971328,16x8160000"      # 16 kv blocks of 16 pages (998,208 B each), 16 SWA pages


def groups(text: str) -> list[tuple[int, int]]:
    """`COUNTxBYTES,...` -> [(count, bytes)], bytes a multiple of 4."""
    try:
        out = [(int(c), int(b)) for c, b in (g.split("x") for g in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"COUNTxBYTES, comma-separated, got {text!r}") from None
    if not out or any(c < 1 or b < 4 or b % 4 for c, b in out):
        raise argparse.ArgumentTypeError(f"counts >= 1 and bytes a positive multiple of 4, got {text!r}")
    return out


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=groups, default=groups(V4_FLASH),
                    help=f"groups of blocks, COUNTxBYTES comma-separated (default {V4_FLASH})")
    ap.add_argument("--rounds", type=count, default=20, help="timed rounds")
    ap.add_argument("--smoke", action="store_true", help="two small groups, two rounds (CI)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="result JSON (default: benchmarks/results/probe_many_blocks.json, or $OUT)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.blocks, args.rounds = [(3, 4096), (3, 1024)], 2
    return args


class Ways:
    """The ways of the module docstring over `blocks` (one list of pinned arrays per group),
    each a callable returning the moved bytes' device arrays."""

    def __init__(self, blocks: list[list[jax.Array]], device):
        host = blocks[0][0].sharding
        flat = [b for group in blocks for b in group]
        every = np.concatenate([np.asarray(b) for b in flat])
        whole = jax.device_put(every, host)
        join = lambda arrays: jnp.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        move = lambda arrays: [jax.device_put(a, _DEVICE) for a in arrays]
        one_jit = jax.jit(lambda *arrays: tuple(move(arrays)))
        one_jit_join = jax.jit(lambda *gs: tuple(join(move(g)) for g in gs))
        rest = jax.jit(lambda copied, *gs: (join(list(copied)), *(join(move(g)) for g in gs)))
        self.expected = every
        self.ways: dict[str, Callable[[], list[jax.Array]]] = {
            "contiguous": lambda: [jax.device_put(whole, device)],
            "puts": lambda: [jax.device_put(b, device) for b in flat],
            "list_put": lambda: jax.device_put(flat, device),
            "one_jit": lambda: list(one_jit(*flat)),
            "one_jit_join": lambda: list(one_jit_join(*blocks)),
            "two_programs": lambda: list(rest(one_jit(*blocks[0]), *blocks[1:])),
        }


def timed(fn: Callable[[], list[jax.Array]]) -> tuple[float, list[jax.Array]]:
    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t) * 1e3, out


def main(argv=None) -> dict:
    args = parse(argv)
    device = jax.sharding.make_single_device_sharding(jax.devices()[0], memory_kind="device")
    host = device.with_memory_kind("pinned_host")
    rng = np.random.default_rng(0)
    blocks = [[jax.device_put(rng.integers(0, 1 << 32, size // 4, np.uint32), host) for _ in range(n)]
              for n, size in args.blocks]
    ways = Ways(blocks, device)
    for name, way in ways.ways.items():           # warm up (compile) and check the bytes
        for _ in range(2):
            _, out = timed(way)
        got = np.concatenate([np.asarray(a).ravel() for a in out])
        if not np.array_equal(got, ways.expected):
            raise SystemExit(f"probe_many_blocks: way {name} moved other bytes than the blocks hold")
    ms, ratios = paired_rounds(ways.ways, args.rounds, timed)
    result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].device_kind,
              "blocks": [{"count": n, "bytes": b} for n, b in args.blocks], "rounds": args.rounds,
              "total_bytes": sum(n * b for n, b in args.blocks), "exact": True,   # else it stopped above
              "ways": {w: {"ms_p50": round(statistics.median(ms[w]), 4),
                           **({"ratio_p50": round(statistics.median(ratios[w]), 4)} if w in ratios else {})}
                       for w in ways.ways}}
    out = args.out or default_out("probe_many_blocks.json", args.smoke)
    pathlib.Path(out).write_text(json.dumps(result, indent=1))
    for w, v in result["ways"].items():
        print(f"{w:14} {v['ms_p50']:8.3f} ms  {v.get('ratio_p50', '')}")
    return result


if __name__ == "__main__":
    main()
