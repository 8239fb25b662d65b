"""A transfer engine wrapper that fails or lags on demand, the way a real transfer can, and
the helpers that build a cache over it and check that it gives every page back."""
import time

import jax
import numpy as np

import hicache_jax as hc
from hicache_jax.transfer import TransferEngine
from hicache_jax.tree import Tier
from hicache_jax.plan import Direction


class InjectedFailure(RuntimeError):
    pass


class FailingHandle:
    def __init__(self, plan):
        self.plan, self.nbytes, self.seconds = plan, 0, None

    def done(self):
        raise InjectedFailure("injected: transfer failed on the device")

    wait = done


class HangingHandle:
    """A transfer whose completion never arrives."""

    def __init__(self, plan):
        self.plan, self.nbytes, self.seconds = plan, 0, None

    def done(self):
        return False

    def wait(self):
        raise InjectedFailure("injected: waited on a transfer that never completes")


class SlowHandle:
    """A transfer that is never seen done by polling, only by waiting: a slow link."""

    def __init__(self, handle):
        self.handle, self.plan, self.nbytes, self.seconds = handle, handle.plan, handle.nbytes, None

    def done(self):
        return False

    def wait(self):
        self.handle.wait()


class FaultyEngine:
    """Delegates to a real engine; `fail_start`, `fail_done` and `hang` hold directions
    ("backup"/"load") whose next transfer raises at start, fails at completion (leaving
    garbage where it wrote), or never completes; every transfer of a direction in `slow`
    completes only when waited on."""

    def __init__(self, engine):
        self.engine = engine
        self.fail_start, self.fail_done, self.hang, self.slow = set(), set(), set(), set()
        self.started = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def start(self, plan, pools, deferred=False):
        d = plan.direction.value
        if d in self.fail_start:
            self.fail_start.discard(d)
            raise InjectedFailure(f"injected: {d} failed to start")
        pools, handle = self.engine.start(plan, pools, deferred=deferred)
        self.started.append(d)
        if handle.landing is not None:   # a model step lands it: no fault to inject on the link
            return pools, handle
        if d in self.fail_done:
            self.fail_done.discard(d)
            handle.wait()
            pools = self._spoil(plan, pools)
            return pools, FailingHandle(plan)
        if d in self.hang:
            self.hang.discard(d)
            return pools, HangingHandle(plan)
        if d in self.slow:
            return pools, SlowHandle(handle)
        return pools, handle

    def _spoil(self, plan, pools):
        """Leave garbage where the failed transfer was writing."""
        layout = self.engine.layout
        if plan.direction is Direction.BACKUP:
            for batch in plan.batches:
                for h in batch.host_pages.tolist():
                    garbage = {p: np.full((layout.pool(p).num_layers, *layout.pool(p).page_shape), 0xAB, np.uint8)
                               .view(np.uint8 if layout.pool(p).dtype == "uint8" else np.uint16)
                               for p in batch.pools}
                    self.engine.write_host_page(batch.allocator, h, _typed(layout, garbage))
            return pools
        out = dict(pools)
        for batch in plan.batches:
            for name in batch.pools:
                arr = np.array(out[name])
                arr.view(np.uint8)[:, batch.device_pages] = 0xAB
                out[name] = jax.device_put(arr, out[name].sharding)
        return out


def faulty_cache(layout, config, slow=(), clock=time.monotonic, storage=None):
    """A HiCache over a `FaultyEngine` wrapping a real one; directions in `slow` start slow."""
    faulty = FaultyEngine(TransferEngine(layout, *config.page_counts(layout), None, config.transfer))
    faulty.slow.update(slow)
    return hc.HiCache(layout, config, engine=faulty, clock=clock, storage=storage), faulty


def empty_everything(cache):
    """Drain, evict both tiers: every page of every allocator must be free again."""
    cache.drain()
    for _ in range(8):
        cache.evict(10 ** 6, 10 ** 6 if cache.swa_allocator else 0)
        cache.drain()
        cache._core.evict_host(dict.fromkeys(cache._core.components.names, 10 ** 6))
    cache.check_invariants()
    assert cache._core.tree.num_nodes == 0
    for alloc in [*cache._core.ledger.allocators(Tier.DEVICE), *cache._core.ledger.allocators(Tier.HOST)]:
        assert alloc.num_free == alloc.capacity, alloc


def _typed(layout, pages):
    import ml_dtypes
    out = {}
    for name, arr in pages.items():
        dtype = layout.pool(name).dtype
        out[name] = arr.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else arr
    return out
