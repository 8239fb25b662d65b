"""L3 storage benchmark: put/get GB/s of DeepSeek V4-Flash page objects per backend, each
beside a raw sequential file write/read of the same bytes on the same disk, in the same run.

    python benchmarks/bench_storage.py                     # 128 kv + 16 SWA pages, 5 rounds
    python benchmarks/bench_storage.py --dir /mnt/disk     # store and raw files there
    python benchmarks/bench_storage.py --smoke             # seconds, for CI

Pages are host rows of the V4-Flash layout (`configs/deepseek_v4_flash.json`): a kv page is
c4 + c4_indexer + c128 over 43 layers (0.998 MB in 3 objects), an SWA page is swa + the two
compressor state pools (8.16 MB in 3 objects). Bytes counted are the objects' payloads.

Method, per backend and page kind, every round (the order of raw and store alternates):
- raw write: the same payload bytes, from the same rows, written to one new file with
  sequential `write`s and one `fsync`; store put: `StorageTier.put_pages` of fresh keys
  (checksums, the skip-existing `contains`, the engine), then for tensorstore an `fsync` of
  every file of the store, so both sides end with the bytes on disk.
- then each file is dropped from the page cache (`posix_fadvise(DONTNEED)` after the fsync;
  the VM's host may still cache the disk, which this cannot reach);
- raw read: `readinto` the destination rows' segments; store get: `get_pages` into them
  (checksums verified). GB/s are medians over rounds; ratios are medians of per-round ratios.
Mooncake keeps objects in memory (the loopback holder's segment): its numbers are the TCP
loopback path and stand beside the same disk figures only as a reference.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("MC_LOG_LEVEL", "WARNING")   # Mooncake's client logs every call at INFO otherwise
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hicache_jax as hc  # noqa: E402
from outputs import default_out  # noqa: E402  (results/ or $OUT, never the repository root)
from hicache_jax.storage import StorageConfig, StorageTier, open_backend  # noqa: E402


def fsync_and_drop(paths) -> None:
    """Make the files durable, then drop their pages from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(directory: pathlib.Path) -> list[str]:
    return [str(p) for p in directory.rglob("*") if p.is_file()]


def segments_of(rows: np.ndarray, layout) -> list[memoryview]:
    return [memoryview(rows[i, s.offset:s.offset + s.nbytes]) for i in range(rows.shape[0]) for s in layout.spans]


def raw_write(path: pathlib.Path, rows, layout) -> float:
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for piece in segments_of(rows, layout):
            f.write(piece)
        os.fsync(f.fileno())
    return time.perf_counter() - t


def raw_read(path: pathlib.Path, rows, layout) -> float:
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        for piece in segments_of(rows, layout):
            if f.readinto(piece) != piece.nbytes:
                raise RuntimeError(f"bug: short read of {path}")
    return time.perf_counter() - t


def one_round(tier, store_dir, raw_path, allocator, rows, out, seed, raw_first) -> dict:
    layout = tier.rows[allocator]
    n = rows.shape[0]
    tokens = np.random.default_rng(seed).integers(0, 100_000, n * tier.layout.page_size, dtype=np.int32)
    pages = tier.page_hashes(tokens)
    ids = list(range(n))
    r: dict = {}

    def store_put():
        t = time.perf_counter()
        op = tier.put_pages(allocator, pages, rows, ids)
        op.wait()
        r["put_s"] = time.perf_counter() - t
        if op.result().written != n * len(layout.spans):
            raise RuntimeError(f"put wrote {op.result()}")
        t = time.perf_counter()
        if store_dir is not None:
            fsync_and_drop(files_under(store_dir))
        r["put_fsync_s"] = r["put_s"] + time.perf_counter() - t

    def store_get():
        out[:] = 0
        t = time.perf_counter()
        op = tier.get_pages(allocator, pages, out, ids)
        op.wait()
        r["get_s"] = time.perf_counter() - t
        if op.result().served != n or not all(np.array_equal(a, b) for a, b in
                                              zip(segments_of(out, layout), segments_of(rows, layout))):
            raise RuntimeError(f"get served {op.result()} or the bytes differ")

    def raw_put():
        r["raw_write_s"] = raw_write(raw_path, rows, layout)
        fsync_and_drop([raw_path])

    def raw_get():
        r["raw_read_s"] = raw_read(raw_path, out, layout)

    for step in ((raw_put, store_put, raw_get, store_get) if raw_first else (store_put, raw_put, store_get, raw_get)):
        step()
    raw_path.unlink()
    t = time.perf_counter()   # kv: every page's objects; SWA: the window before page n
    hit = tier.exists_prefix(pages) == n if allocator == tier.anchor else tier.window_present(pages, n)
    r["exists_hit_us"] = (time.perf_counter() - t) * 1e6
    t = time.perf_counter()
    miss = tier.usable_prefix(tier.page_hashes(tokens[::-1].copy()))
    r["lookup_miss_us"] = (time.perf_counter() - t) * 1e6
    if not hit or miss != 0:
        raise RuntimeError(f"lookups missed stored pages ({hit}) or found absent ones ({miss})")
    return r


def summarize(rounds: list[dict], nbytes: int) -> dict:
    med = lambda key: statistics.median(r[key] for r in rounds)   # noqa: E731
    gbps = lambda key: nbytes / med(key) / 1e9                     # noqa: E731
    return {
        "bytes": nbytes, "rounds": len(rounds),
        "put_GBps": gbps("put_s"), "put_fsync_GBps": gbps("put_fsync_s"), "get_GBps": gbps("get_s"),
        "raw_write_GBps": gbps("raw_write_s"), "raw_read_GBps": gbps("raw_read_s"),
        "put_vs_raw_write": statistics.median(r["raw_write_s"] / r["put_fsync_s"] for r in rounds),
        "get_vs_raw_read": statistics.median(r["raw_read_s"] / r["get_s"] for r in rounds),
        "exists_hit_us": med("exists_hit_us"), "lookup_miss_us": med("lookup_miss_us"),
        "raw": rounds,
    }


def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("tensorstore", "xxhash", "mooncake-transfer-engine-non-cuda"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def cpu_model() -> str:
    try:
        return next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the store and the raw files go (default: a temp dir)")
    ap.add_argument("--backends", default="ocdbt,plain,mooncake",
                    help="stores to time, comma-separated: ocdbt and plain (tensorstore files), mooncake (loopback)")
    ap.add_argument("--kv-pages", type=int, default=128, help="V4-Flash kv pages put and got per round")
    ap.add_argument("--swa-pages", type=int, default=16, help="V4-Flash SWA pages put and got per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per store and allocator (medians reported)")
    ap.add_argument("--smoke", action="store_true", help="4 kv pages, 1 SWA page, 1 round: seconds")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="JSON path (default: benchmarks/results/bench_storage.json, or .../smoke/ with --smoke)")
    args = ap.parse_args()
    args.out = args.out or default_out("bench_storage.json", args.smoke)
    if args.smoke:
        args.kv_pages, args.swa_pages, args.rounds = 4, 1, 1
    layout = hc.build_layout(hc.load_model_config(ROOT / "configs" / "deepseek_v4_flash.json"))
    base = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench-storage-"))
    base.mkdir(parents=True, exist_ok=True)
    results = {"date": datetime.date.today().isoformat(), "machine": {
        "cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(), "dir": str(base),
        "load_average_start": os.getloadavg()},
        "versions": versions(), "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "runs": []}
    rng = np.random.default_rng(0)
    for name in args.backends.split(","):
        backend, store_dir, server = make_backend(name, base, args)
        if backend is None:
            continue
        tier = StorageTier(layout, backend, StorageConfig(call_timeout_s=600))
        for allocator, n in (("kv", args.kv_pages), ("swa", args.swa_pages)):
            fmt = tier.rows[allocator]
            rows = rng.integers(0, 256, (n, fmt.row_bytes), dtype=np.uint8)
            out = np.zeros_like(rows)
            tier.register(rows)
            tier.register(out)
            rounds = [one_round(tier, store_dir, base / "raw.bin", allocator, rows, out,
                                seed=hash((name, allocator, i)) % 2**31, raw_first=i % 2 == 0)
                      for i in range(args.rounds)]
            row = {"backend": name, "pages": allocator, "num_pages": n, **summarize(rounds, n * fmt.data_bytes)}
            results["runs"].append(row)
            print(f"{name:9s} {allocator:3s} {n:4d} pages: put {row['put_GBps']:.2f} GB/s "
                  f"(+fsync {row['put_fsync_GBps']:.2f}) vs raw write {row['raw_write_GBps']:.2f} "
                  f"(x{row['put_vs_raw_write']:.2f}); get {row['get_GBps']:.2f} vs raw read "
                  f"{row['raw_read_GBps']:.2f} (x{row['get_vs_raw_read']:.2f}); exists hit "
                  f"{row['exists_hit_us']:.0f} us, miss lookup {row['lookup_miss_us']:.0f} us", flush=True)
        tier.close()
        if server is not None:
            server.stop()
        if store_dir is not None:
            shutil.rmtree(store_dir, ignore_errors=True)
    results["machine"]["load_average_end"] = os.getloadavg()   # other work on the machine during the run
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")


def make_backend(name: str, base: pathlib.Path, args):
    """(backend, its directory on disk or None, a server to stop or None); None when unavailable."""
    if name in ("ocdbt", "plain"):
        store_dir = base / f"store-{name}"
        shutil.rmtree(store_dir, ignore_errors=True)
        url = f"file://{store_dir}" + ("?layout=plain" if name == "plain" else "")
        return open_backend(url, timeout_s=600), store_dir, None
    if name == "mooncake":
        try:
            from hicache_jax.storage import MooncakeServer
            segment = int(1.2 * args.rounds * (args.kv_pages * 998_400 + args.swa_pages * 8_160_256)) + (64 << 20)
            server = MooncakeServer.start(segment_bytes=segment)
        except ImportError as e:
            print(f"mooncake: skipped ({e})")
            return None, None, None
        return open_backend(server.url), None, server
    raise ValueError(f"unknown backend {name!r}; known: ocdbt, plain, mooncake")


if __name__ == "__main__":
    main()
