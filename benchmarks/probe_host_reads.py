"""Ways to read rows of a pinned-host block onto the device, each against a contiguous copy.

A host hit that covers part of a host block (a shared prompt backed up inside a longer
conversation) reads a slice of that block; a hit of several requests, or of several turns
backed up apart, reads several blocks and joins them. On the H200 such loads ran at
0.82-0.86 of the link at 256 pages and a whole block at 0.92-1.01 (BENCHMARKS.md,
"Traffic-shaped hits on the H200"). This probe times the candidate ways to move the same
rows, without the cache around them, so that one run on a GPU says which to build:

    contiguous        `jax.device_put` of a separate host array of exactly the rows (the reference)
    whole_array_jit   the same array moved inside a jit (`device_put(h, Space.Device)`)
    dynamic_slice     a slice of the block at a traced start, moved inside a jit (the engine's way today)
    static_slice      the same slice at a start fixed when the program is compiled
    block_then_slice  the whole block moved inside a jit, then sliced on the device (moves more bytes:
                      worth it only where the block is not much larger than the rows)
    split_slices      the slice as four dynamic slices, moved and joined on the device
    granules_G        the block kept as arrays of G rows; the arrays that hold the rows are moved
                      whole inside one jit and joined on the device (G = each of --granules)
    list_put_G        the same arrays moved by one `jax.device_put` of a list, then joined by a jit
    view_put          the rows as a DLPack view into the block (`hicache_jax.pools.host_views.rows_view`: no copy, made
                      each call), moved by `jax.device_put`: one DMA of exactly the rows
    view_jit          the same view moved inside a jit compiled for its shape

Each row count is read from blocks of each --block-rows at least twice its size (the
shared prompt of a two-page conversation is half of a two-row block). Each round times
every way once, in a rotating order, and a contiguous copy of the same bytes beside it;
the ratio is contiguous ms / way ms (1.0: as fast as the link allows), the
median over rounds. Every way's rows are checked equal to the block's. The optimized HLO of
each jitted way is summarised (how many async copies, dynamic slices, fusions it has) and,
with --hlo-dir, written out: it says whether XLA moved the rows by DMA or read host memory
from a kernel.

    python benchmarks/probe_host_reads.py --out probe.json                  # V4-Flash kv pages
    python benchmarks/probe_host_reads.py --smoke --out probe.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from flags import count, number_list  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from pairing import paired_rounds  # noqa: E402

from hicache_jax.pools.host_views import rows_view  # noqa: E402

_DEVICE = jax.memory.Space.Device
HLO_MARKERS = {"copy_start": r"\bcopy-start\b", "dynamic_slice": r"\bdynamic-slice\b",
               "fusion": r"\bfusion\(", "custom_call": r"\bcustom-call\(", "host_space": r"S\(5\)"}


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--row-bytes", type=count, default=998_208,
                    help="bytes per row, a multiple of 4 (default: a V4-Flash kv page, 998,208 B)")
    ap.add_argument("--block-rows", type=number_list(), default=[2, 32, 512],
                    help="rows of the host blocks read from, comma-separated: each with every --rows at most half of it")
    ap.add_argument("--rows", type=number_list(), default=[1, 16, 256], help="rows read per load, comma-separated")
    ap.add_argument("--granules", type=number_list(), default=[1, 16],
                    help="rows per array for the granules_G and list_put_G ways, comma-separated")
    ap.add_argument("--rounds", type=count, default=20, help="timed rounds per row count")
    ap.add_argument("--hlo-dir", type=pathlib.Path, default=None, help="write each jitted way's optimized HLO here")
    ap.add_argument("--smoke", action="store_true", help="small rows and blocks, two rounds (CI)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="result JSON (default: benchmarks/results/probe_host_reads.json, or $OUT)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.row_bytes, args.block_rows, args.rows, args.granules, args.rounds = 4096, [2, 64], [1, 16], [1, 8, 16], 2
    if args.row_bytes % 4:
        ap.error(f"--row-bytes must be a multiple of 4; got {args.row_bytes}")
    if not pairs(args):
        ap.error(f"no --rows is at most half of a --block-rows; got {args.rows} and {args.block_rows}")
    return args


def pairs(args) -> list[tuple[int, int]]:
    """(block rows, rows read) of every run: each block with every row count at most half of it."""
    return [(r, n) for r in args.block_rows for n in args.rows if 2 * n <= r]


class Ways:
    """The ways to read `n` rows at `start` of a host block (module docstring), each a
    callable returning the rows on the device, and the HLO of the jitted ones."""

    def __init__(self, block: jax.Array, values: np.ndarray, n: int, start: int, granules: list[int],
                 device_sharding):
        self.n, self.start = n, start
        self.hlo: dict[str, str] = {}
        host = block.sharding         # host arrays are made from `values` (the block's), never by slicing on the host
        stop = start + n
        self.rows = jax.device_put(values[start:stop], host)       # the same rows, their own host array
        index = jax.device_put(np.array([start], np.int32), device_sharding)
        ways: dict[str, Callable[[], jax.Array]] = {
            "contiguous": lambda: jax.device_put(self.rows, device_sharding)}
        ways["whole_array_jit"] = self._jit("whole_array_jit", lambda h: jax.device_put(h, _DEVICE), self.rows)
        ways["dynamic_slice"] = self._jit(
            "dynamic_slice", lambda b, s: jax.device_put(jax.lax.dynamic_slice_in_dim(b, s[0], n, 0), _DEVICE),
            block, index)
        ways["static_slice"] = self._jit("static_slice", lambda b: jax.device_put(b[start:stop], _DEVICE), block)
        ways["block_then_slice"] = self._jit(
            "block_then_slice", lambda b, s: jax.lax.dynamic_slice_in_dim(jax.device_put(b, _DEVICE), s[0], n, 0),
            block, index)
        if n % 4 == 0:
            quarter = n // 4
            ways["split_slices"] = self._jit("split_slices", lambda b, s: jnp.concatenate(
                [jax.device_put(jax.lax.dynamic_slice_in_dim(b, s[0] + k * quarter, quarter, 0), _DEVICE)
                 for k in range(4)]), block, index)
        for g in granules:
            if g > n or n % g or start % g:
                continue
            arrays = [jax.device_put(values[lo:lo + g], host) for lo in range(start, stop, g)]
            ways[f"granules_{g}"] = self._jit(
                f"granules_{g}", lambda *hs: _join([jax.device_put(h, _DEVICE) for h in hs]), *arrays)
            joined = jax.jit(lambda *xs: _join(xs))
            ways[f"list_put_{g}"] = (lambda arrays=arrays, joined=joined:
                                     joined(*jax.device_put(arrays, device_sharding)))
        self.view_memory_kind = self.view_error = None
        try:            # a runtime that will not share the block's memory loses these two ways, not the run
            view = rows_view(block, start, stop)
            self.view_memory_kind = view.sharding.memory_kind
            view_move = self._jit("view_jit", lambda h: jax.device_put(h, _DEVICE), view)
        except (RuntimeError, TypeError, ValueError, BufferError) as e:   # JaxRuntimeError is a RuntimeError
            self.view_error = f"{type(e).__name__}: {e}"
        else:
            ways["view_put"] = lambda: jax.device_put(rows_view(block, start, stop), device_sharding)
            ways["view_jit"] = lambda: view_move(rows_view(block, start, stop))
        self.ways = ways

    def _jit(self, name: str, fn: Callable, *args) -> Callable[..., jax.Array]:
        """`fn` compiled for `args`; called with no arguments it runs on them, else on those given."""
        compiled = jax.jit(fn).lower(*args).compile()
        self.hlo[name] = compiled.as_text() or ""
        return lambda *given: compiled(*(given or args))


def _join(parts) -> jax.Array:
    """Arrays of rows, one after the other (one array: itself)."""
    return jnp.concatenate(list(parts)) if len(parts) > 1 else parts[0]


def hlo_summary(text: str) -> dict[str, int]:
    return {name: len(re.findall(pattern, text)) for name, pattern in HLO_MARKERS.items()}


def timed(fn: Callable[[], jax.Array]) -> tuple[float, jax.Array]:
    t = time.perf_counter()
    out = fn()
    out.block_until_ready()
    return (time.perf_counter() - t) * 1e3, out


def probe(block: jax.Array, expected: np.ndarray, n: int, args, device_sharding) -> dict:
    rows = block.shape[0]
    start = rows // 2 - (rows // 2) % n                   # inside the block, aligned to n
    ways = Ways(block, expected, n, start, args.granules, device_sharding)
    want = expected[start:start + n]
    for name, way in ways.ways.items():                   # warm up (compile) and check the bytes
        for _ in range(2):
            _, out = timed(way)
        if not np.array_equal(np.asarray(out), want):
            raise SystemExit(f"probe: way {name} read other bytes than the block holds at rows {start}..{start + n}")
    ms, ratios = paired_rounds(ways.ways, args.rounds, timed)
    if args.hlo_dir is not None:
        args.hlo_dir.mkdir(parents=True, exist_ok=True)
        for name, text in ways.hlo.items():
            (args.hlo_dir / f"{name}_{n}of{rows}rows.hlo.txt").write_text(text)
    return {"block_rows": rows, "rows": n, "start": start, "bytes": n * args.row_bytes,
            "view_memory_kind": ways.view_memory_kind, "view_error": ways.view_error,
            "ways": {w: {"ms_p50": statistics.median(ms[w]),
                         **({"ratio_p50": statistics.median(ratios[w])} if w in ratios else {}),
                         **({"hlo": hlo_summary(ways.hlo[w])} if w in ways.hlo else {})}
                     for w in ways.ways}}


def main(argv=None) -> dict:
    args = parse(argv)
    device = jax.devices()[0]
    host_sharding = jax.sharding.make_single_device_sharding(device, memory_kind="pinned_host")
    device_sharding = jax.sharding.make_single_device_sharding(device, memory_kind="device")
    words = args.row_bytes // 4
    rng = np.random.default_rng(0)
    runs = []
    for rows, n in pairs(args):
        expected = rng.integers(0, 2**32, (rows, words), dtype=np.uint32)
        run = probe(jax.device_put(expected, host_sharding), expected, n, args, device_sharding)
        runs.append(run)
        print(f"{n:5d} of {rows:5d} rows ({run['bytes'] / 1e6:8.1f} MB): " + ", ".join(
            f"{w} {v['ms_p50']:.3f} ms" + (f" ({v['ratio_p50']:.2f})" if "ratio_p50" in v else "")
            for w, v in run["ways"].items()), file=sys.stderr)
    result = {"device": device.device_kind, "platform": device.platform, "jax": jax.__version__,
              "row_bytes": args.row_bytes, "rounds": args.rounds,
              "exact": True, "runs": runs}
    out = args.out or default_out("probe_host_reads.json", args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"device": result["device"], "jax": result["jax"], "exact": True,
                      "ratios": {f"{r['rows']}/{r['block_rows']}": {w: round(v["ratio_p50"], 3)
                                                                    for w, v in r["ways"].items() if "ratio_p50" in v}
                                 for r in runs}}))
    return result


if __name__ == "__main__":
    main()
