"""A stand-in serving loop for cache tests: every page's bytes are a function of its prefix.

A request for blocks b (each block one page of tokens) "computes" its missing pages by
writing seeded random bytes, unique to (pool, token prefix), into every pool it
allocated; whatever the cache hands back for a prefix, from device or host, must equal
those bytes.
"""
import functools
import hashlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import hicache_jax as hc
from conftest import CONFIGS

P = 256


def layout(name):
    return hc.build_layout(hc.load_model_config(CONFIGS / f"{name}.json"))


def seq(blocks) -> np.ndarray:
    return np.concatenate([np.full(P, 1000 + b, np.int32) + np.arange(P, dtype=np.int32) for b in blocks])


def prompt(blocks) -> np.ndarray:
    """The prompt of `blocks`: their whole pages and one token more."""
    return np.concatenate([seq(blocks), np.asarray([7], np.int32)])


def page_bytes(spec, blocks) -> np.ndarray:
    """[num_layers, *page_shape] of spec.dtype: the content of the page ending `blocks`."""
    digest = hashlib.sha256(f"{spec.name}:{tuple(blocks)}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    shape = (spec.num_layers, *spec.page_shape)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * spec.itemsize, dtype=np.uint8)
    dtype = ml_dtypes.bfloat16 if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
    return raw.view(dtype).reshape(shape)


@functools.partial(jax.jit, donate_argnums=0)
def _land_step(pools, landing):
    """A model step's landing, with no model: every layer's groups in order."""
    schedule = landing.schedule()
    x = jnp.zeros(())
    for layer in range(landing.layers):
        pools, x = schedule.before_layer(layer, pools, x)
        x = x + sum(v.reshape(-1)[0].astype(jnp.float32) for v in pools.values())
    return schedule.finish(pools)


def land_in_step(pools, landing):
    return _land_step(dict(pools), landing)


class Driver:
    def __init__(self, cache: hc.HiCache):
        self.cache, self.layout = cache, cache.layout
        self.host_hits = self.device_hits = self.storage_hits = 0

    def write(self, pages: dict[str, list[tuple[int, tuple]]]) -> None:
        """pages: allocator -> [(device page, blocks of its prefix)]; one write per pool."""
        pools = self.cache.device_pools
        for spec in self.layout.byte_pools:
            todo = pages.get(spec.allocator, [])
            if not todo:
                continue
            arr = np.array(pools[spec.name])
            for page, blocks in todo:
                arr[:, page] = page_bytes(spec, blocks)
            pools[spec.name] = jax.device_put(arr, pools[spec.name].sharding)
        self.cache.set_device_pools(pools)

    def verify(self, blocks, table, window) -> None:
        """The device bytes of every usable page equal what was written for that prefix."""
        pools = {n: np.asarray(a) for n, a in self.cache.device_pools.items()}
        first = len(table)
        for spec in self.layout.byte_pools:
            if spec.allocator == self.layout.anchor.name:
                logical = list(enumerate(table))
            else:
                logical = [(first - len(window) + j, p) for j, p in enumerate(window)]
            for i, page in logical:
                want = page_bytes(spec, blocks[: i + 1])
                got = pools[spec.name][:, int(page)]
                assert got.tobytes() == want.tobytes(), f"{spec.name}: logical page {i} (device page {page}) is wrong"

    def request(self, blocks, load=True, swa_every=False, must_fit=True, land=None, step=True) -> int:
        """Serve one prompt of `blocks` pages (+1 token); returns the tokens served from the cache.
        With `must_fit=False` a request the device cannot hold now is turned away (returns -1).
        With `step=False` the backups its insert queued stay queued (no `step()` after it).
        `land`: None, a blocking load-back; "step", a deferred one that a jitted step lands
        (`land_in_step`); "cache", a deferred one left for the cache to land (`drain`)."""
        c = self.cache
        prefix = c.acquire(prompt(blocks), load_back=load, deferred=land is not None)
        self.land(prefix.landing, land)
        self.verify(blocks, prefix.device_pages, prefix.swa_pages)   # every served page, device or host
        return self.serve(blocks, prefix, swa_every, must_fit, step)

    def request_many(self, batch, load=True, swa_every=False, land=None) -> list[int]:
        """Serve prompts of `batch` (lists of blocks) admitted together: one `acquire_many`,
        then each computed and inserted in turn; one the device cannot hold now is turned
        away (-1). Returns the tokens each was served from the cache."""
        c = self.cache
        prefixes = c.acquire_many([prompt(b) for b in batch], load_back=load, deferred=land is not None)
        assert len(prefixes) == len(batch)
        landings = {id(p.landing): p.landing for p in prefixes if p.landing is not None}
        assert len(landings) <= 1, "one landing at most per acquire_many"
        for landing in landings.values():
            self.land(landing, land)
        for blocks, prefix in zip(batch, prefixes):
            self.verify(blocks, prefix.device_pages, prefix.swa_pages)
            assert len(prefix.device_pages) * P == prefix.length
        served = []
        for i, (blocks, prefix) in enumerate(zip(batch, prefixes)):
            served.append(self.serve(blocks, prefix, swa_every, must_fit=False, step=i == len(batch) - 1))
        return served

    def land(self, landing, how) -> None:
        """A deferred load's landing: landed by a jitted step ("step") or left to the cache."""
        if landing is None:
            return
        c = self.cache
        if how == "step":
            c.set_device_pools(land_in_step(c.device_pools, landing), landed=landing)
        else:
            c.drain()

    def serve(self, blocks, prefix, swa_every=False, must_fit=True, step=True) -> int:
        """Compute the pages of `blocks` past `prefix` (acquired), insert them, unlock."""
        c = self.cache
        usable, table = prefix.length, prefix.device_pages
        self.host_hits += prefix.host_tokens
        self.storage_hits += prefix.storage_tokens
        self.device_hits += prefix.device_tokens
        first, n = usable // P, len(blocks)
        swa = c.swa_allocator
        grant = c.alloc(n - first, (n - first) if swa else 0)
        if grant is None and not must_fit:
            c.unlock(prefix.lock)
            return -1
        assert grant is not None, "device pool too small for one request"
        new = grant["kv"].tolist()
        writes = {c.anchor: [(p, tuple(blocks[: first + i + 1])) for i, p in enumerate(new)]}
        keep = {}
        if swa:
            sp = grant["swa"].tolist()
            writes[swa] = [(p, tuple(blocks[: first + i + 1])) for i, p in enumerate(sp)]
            keep = {first + i: p for i, p in enumerate(sp) if swa_every or first + i == n - 1}
            drop = [p for p in sp if p not in keep.values()]
            if drop:
                c.free(swa, drop)
        self.write(writes)
        c.insert(seq(blocks), list(table) + new, keep)
        c.unlock(prefix.lock)
        if step:
            c.step()
        return usable
