"""Requests for `bench_hits.py`, built through the public API as a serving loop builds them:
a prompt's whole pages are allocated, written (random bytes on every pool, standing for
the model's output) and inserted, reusing on device what an earlier turn left there; a
hit is then checked byte for byte against what was written into each logical page.

Also what every timed call is measured with (`Probe`): the transfer programs it called
(`HiCache.on_program_call`), the compilations it ran (`CompileCounter`) and the bytes it
loaded (the cache's counters); and the raw-link reference (`bench_api.link_copy`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

import hicache_jax as hc

clock = time.perf_counter
# The profiler's name of a timed call (profile_hits.py finds it); a ':' would cut the name short.
HIT_MARK = "hit."
EVERY = 10 ** 6          # "every page": what `evict` / `evict_host` are asked to free


_ODD = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646D, 0xFD7046C5, 0xB55A4F09)


@functools.cache
def _fill_program(sharding):
    """One program writing pseudo-random bytes into a pool's pages (the pool stays where it
    was): (pool, i32[n] pages, u32 seed) -> (pool, values[layers, n, ...]). The bytes are a
    hash of the seed and of each element's place, cheap to compile (jax.random's are not)."""
    def fill_pages(pool, pages, seed):
        shape = (pool.shape[0], pages.shape[0], *pool.shape[2:])
        h = seed * jnp.uint32(_ODD[0])
        for axis in range(len(shape)):
            h = h + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(_ODD[1 + axis % 7])
        for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B)):
            h = (h ^ (h >> shift)) * jnp.uint32(mul)
        h = h ^ (h >> 16)
        bits = h.astype(jnp.uint8 if pool.dtype == jnp.uint8 else jnp.uint16)
        values = jax.lax.bitcast_convert_type(bits, pool.dtype)
        return pool.at[:, pages].set(values), values
    return jax.jit(fill_pages, donate_argnums=0, out_shardings=(sharding, sharding))


def fill(cache: hc.HiCache, grant: dict[str, np.ndarray], seed: int) -> dict[str, jax.Array]:
    """Pseudo-random bytes (of `seed`, each pool its own) in the granted device pages of
    every pool; returns them, `{pool: values[layers, granted pages, ...]}` (pools with no
    granted page left out). One program per pool and page count, compiled once."""
    pools, written = cache.device_pools, {}
    for i, spec in enumerate(cache.layout.byte_pools):
        pages = jnp.asarray(grant.get(spec.allocator, np.zeros(0, np.int32)))
        if pages.size == 0:
            continue
        pool = pools[spec.name]
        pools[spec.name], written[spec.name] = _fill_program(pool.sharding)(
            pool, pages, jnp.uint32((seed * 64 + i) % 2 ** 32))
    cache.set_device_pools(pools)
    return written


@dataclasses.dataclass
class Request:
    """A prompt whose whole pages are in the cache, and the bytes written into them."""

    tokens: np.ndarray                                          # i32[pages * page_size]
    kv: list[tuple[int, dict[str, jax.Array]]]                  # (first logical page, {pool: values})
    window: dict[int, dict[str, jax.Array]]                     # logical page -> {pool: values[layers, 1, ...]}

    def prompt(self, more: np.ndarray | None = None) -> np.ndarray:
        """The prompt of a later request: these tokens, then `more` (default: one token)."""
        return np.concatenate([self.tokens, np.ones(1, np.int32) if more is None else more]).astype(np.int32)


def tokens(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 50_000, n).astype(np.int32)


def compute(cache: hc.HiCache, toks: np.ndarray, seed: int, before: Request | None = None,
            stops: tuple[int, ...] = ()) -> Request:
    """Insert `toks` (whole pages) as a serving loop does once it computed them. `before`: an
    earlier turn whose pages are still on device; they are matched and locked (`acquire`)
    and reused, the rest allocated and written. The windows of page boundaries `stops` and
    of the end are kept (the window's pages this request computed)."""
    page, window = cache.layout.page_size, cache.window_pages
    n = len(toks) // page
    held = cache.acquire(np.append(toks, 1).astype(np.int32)) if before is not None else None
    reused = held.length // page if held is not None else 0
    if before is not None and (reused != len(before.tokens) // page or held.host_tokens):
        raise RuntimeError(f"the earlier turn's {len(before.tokens) // page} pages were not all on device: "
                           f"{reused} matched, {held.host_tokens} tokens from the host")
    win = sorted({p for b in (*stops, n) for p in range(max(reused, b - window), b)}) if window else []
    grant = cache.alloc(n - reused, len(win))
    if grant is None:
        raise RuntimeError(f"no device room for {n - reused} pages (+{len(win)} window pages)")
    written = fill(cache, grant, seed)
    alloc = {s.name: s.allocator for s in cache.layout.byte_pools}
    kv = [*(before.kv if before else []),
          (reused, {p: v for p, v in written.items() if alloc[p] == cache.anchor})]
    win_of = dict(before.window) if before else {}
    for i, p in enumerate(win):
        win_of[p] = {name: v[:, i:i + 1] for name, v in written.items() if alloc[name] == cache.swa_allocator}
    keep = {p: int(grant[cache.swa_allocator][i]) for i, p in enumerate(win)} if window else None
    pages = grant[cache.anchor] if held is None else np.concatenate([held.device_pages, grant[cache.anchor]])
    res = cache.insert(toks, pages, keep)
    if res.new_len != (n - reused) * page:
        raise RuntimeError(f"insert took {res.new_len} new tokens, expected {(n - reused) * page}")
    if held is not None:
        cache.unlock(held.lock)
    return Request(np.asarray(toks, np.int32), kv, win_of)


@jax.jit
def _same_bits(pool, pages, want):
    """Whether `pool[:, pages]` equals `want` bit for bit (random bytes in a float pool hold
    NaNs, which `==` calls unequal)."""
    as_bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[want.dtype.itemsize]
    got = pool[:, pages]
    return jnp.array_equal(jax.lax.bitcast_convert_type(got, as_bits), jax.lax.bitcast_convert_type(want, as_bits))


def restored(cache: hc.HiCache, prefix, request: Request) -> bool:
    """Every byte of the prefix's pages, every pool, equals what `request` wrote into its
    logical pages: kv pages 0 .. n-1 and the SWA pages of the trailing window."""
    pools, n = cache.device_pools, prefix.length // cache.layout.page_size
    device = np.asarray(prefix.device_pages)
    for first, values in request.kv:
        for name, want in values.items():
            hi = min(n, first + want.shape[1])
            if hi > first and not _same_bits(pools[name], jnp.asarray(device[first:hi]),
                                             want if hi - first == want.shape[1] else want[:, :hi - first]):
                return False
    swa = np.asarray(prefix.swa_pages)
    if len(swa) != min(n, cache.window_pages):
        return False
    for logical, page in zip(range(n - len(swa), n), swa.tolist()):
        if logical not in request.window:
            return False
        for name, want in request.window[logical].items():
            if not _same_bits(pools[name], jnp.asarray([page], jnp.int32), want):
                return False
    return True


def to_host(cache: hc.HiCache) -> None:
    """Every unlocked prefix off the device (a backed-up one keeps its host copy; under
    write-back an unbacked one is backed up first), transfers landed. Queued backups land
    first: a prefix under a backup is locked until it ends."""
    cache.drain()
    cache.evict(EVERY, EVERY if cache.window_pages else 0)
    cache.drain()


def forget(cache: hc.HiCache) -> None:
    """Every unlocked prefix out of the cache, device and host."""
    to_host(cache)
    cache.evict_host(EVERY, EVERY if cache.window_pages else 0)


def counted(cache: hc.HiCache, what: str) -> int:
    """A counter of the cache summed over pools / directions (`backup_transfers`, `load_bytes`)."""
    s = cache.stats()
    return s.transfers.get("backup", 0) if what == "backup_transfers" else sum(s.load_bytes.values())


class Probe:
    """Times calls of one cache until the device is done, and counts what each did: the
    transfer programs called (`on_program_call`), compilations, bytes loaded. `keep` off
    (warm-up rounds): the call runs and is checked, but nothing is recorded."""

    def __init__(self, cache: hc.HiCache):
        self.cache, self.keep = cache, True
        self.calls: list[tuple[str, float, float]] = []   # each transfer program of the timed call: label, called, returned
        self.waited: float | None = None                   # when the last `jax.block_until_ready` inside it returned
        self.compiles = hc.CompileCounter()
        self.seen: dict[str, dict[str, list]] = {}
        cache.on_program_call(self._hook)

    def _hook(self, label, program, *args):
        called = clock()
        out = program(*args)
        self.calls.append((label, called, clock()))
        return out

    @contextlib.contextmanager
    def _waits_seen(self):
        """While inside, each `jax.block_until_ready` (the cache's wait for its loads) notes
        when it returned (`waited`): the device's work was done by then."""
        real = jax.block_until_ready

        def noted(x):
            out = real(x)
            self.waited = clock()
            return out
        jax.block_until_ready = noted
        try:
            yield
        finally:
            jax.block_until_ready = real

    def time(self, name: str, call):
        """(seconds, what `call()` returned); records dispatches, compiles, bytes loaded under `name`."""
        loaded = counted(self.cache, "load_bytes")
        jax.block_until_ready(self.cache.device_pools)
        self.calls.clear()
        self.waited = None
        self.compiles.reset()
        with jax.profiler.TraceAnnotation(HIT_MARK + name):     # the call, to its device work done (profile_hits.py)
            t = clock()
            with self._waits_seen():
                out = call()
            returned = clock()
            jax.block_until_ready(self.cache.device_pools)
            took = clock() - t
        if self.keep:
            rec = self.seen.setdefault(name, {"dispatches": [], "compiles": [], "loaded_bytes": [], "programs": [],
                                              "calls_s": [], "held_s": [], "waited_s": [], "returned_s": []})
            # host time: to each transfer program's call, how long each call held the host, to
            # the end of the call's last wait, and until `call` returned
            rec["calls_s"].append([called - t for _, called, _ in self.calls])
            rec["held_s"].append([back - called for _, called, back in self.calls])
            if self.waited is not None:
                rec["waited_s"].append(self.waited - t)
            rec["returned_s"].append(returned - t)
            rec["dispatches"].append(len(self.calls))
            rec["compiles"].append(self.compiles.count)
            rec["loaded_bytes"].append(counted(self.cache, "load_bytes") - loaded)
            rec["programs"] = sorted(Counter(label.split("[")[0] for label, *_ in self.calls).items())
        return took, out
