"""`HiCache`: the object a JAX serving loop embeds; its API, over three parts:

    TreeCore      (tree/)            the control plane: what is cached where, what moves
    PrefixReads   (prefix_reads.py)  a prompt's prefix matched, pinned and loaded back
    DataPlane     (data_plane.py)    the device pools, and transfers started and ended

Every call checks its arguments (ValueError naming the value, nothing changed) before it
asks a part. Serving-loop contract (README): match -> lock -> (load_back -> wait) -> alloc
-> model steps with `device_pools` / `set_device_pools` -> insert + free -> unlock;
`step()` once per iteration. No call blocks on a transfer except `wait`, `drain`,
`acquire` / `acquire_many` (their own loads), and `acquire` / `alloc` when they come up
short while transfers are in flight (a slow link must not turn into a refusal a fast one
would not have given).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np
from prometheus_client import CollectorRegistry

from hicache_jax import cache_snapshot, validate
from hicache_jax.cache_seams import CacheSeams
from hicache_jax.config import HiCacheConfig
from hicache_jax.data_plane import DataPlane
from hicache_jax.layout import PoolLayout
from hicache_jax.metrics import StatsCollector
from hicache_jax.outcomes import LoadBack, Prefix, StepReport
from hicache_jax.prefix_reads import PrefixReads
from hicache_jax.storage import StorageBackend
from hicache_jax.storage_link import StorageLink, open_store
from hicache_jax.transfer import TransferEngine
from hicache_jax.tree import EvictResult, InsertResult, LoadCost, LockId, MatchResult, NodeId, Tier, TreeCore, as_tokens


class HiCache(CacheSeams):
    """A hierarchical KV cache for one model layout (see module docstring)."""

    def __init__(self, layout: PoolLayout, config: HiCacheConfig, mesh: jax.sharding.Mesh | None = None, *,
                 engine: TransferEngine | None = None, clock: Callable[[], float] = time.monotonic,
                 storage: StorageBackend | None = None):
        if not isinstance(layout, PoolLayout):
            raise ValueError(f"HiCache takes a PoolLayout, got {type(layout).__name__}")
        if not isinstance(config, HiCacheConfig):
            raise ValueError(f"HiCache takes a HiCacheConfig, got {type(config).__name__}")
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise ValueError(f"HiCache's mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
        if not callable(clock):
            raise ValueError(f"HiCache's clock must be a callable returning seconds, got {clock!r}")
        self.layout, self.config = layout, config
        device, host = config.page_counts(layout)
        self._core = TreeCore(layout, device_pages=device, host_pages=host, write_policy=config.write_policy,
                             write_threshold=config.write_through_threshold,
                             load_back_threshold=config.load_back_threshold,
                             load_cost=LoadCost(config.recompute_seconds_per_token, config.link_bytes_per_second,
                                                config.load_overhead_seconds),
                             prefetch_share=config.storage.prefetch_share)
        self._engine = engine if engine is not None else TransferEngine(
            layout, device, host, mesh, config.transfer)
        self._swa = layout.swa_pool.name if layout.swa_pool is not None else None
        self._storage = None
        if storage is not None or config.storage.enabled:
            if not any(host.values()):
                raise ValueError(f"a storage tier ({storage or config.storage.url!r}) needs a host tier: "
                                 f"host pages are {host}")
            backend = storage if storage is not None else open_store(config.storage)
            tp = mesh.shape.get("tp", 1) if mesh is not None else 1
            self._storage = StorageLink(layout, config, self._core, self._engine, backend, tp)
        self._data = DataPlane(layout, config, self._core, self._engine, clock, self._storage)
        self._reads = PrefixReads(layout, config, self._core, self._data)
        self._registry = CollectorRegistry(auto_describe=True)
        self._registry.register(StatsCollector(self.stats, lambda: self._data.counters.settled().durations,
                                              tuple(p.name for p in layout.byte_pools)))

    # -- what a serving loop needs to know --------------------------------------------------
    @property
    def anchor(self) -> str:
        """The anchor allocator's name: the key of a grant's (and a table's) anchor pages."""
        return self._core.anchor

    @property
    def swa_allocator(self) -> str | None:
        """The sliding-window allocator's name (`swa_pages` everywhere), or None without one."""
        return self._swa

    @property
    def window_pages(self) -> int:
        """SWA pages the trailing window of a prefix needs (0 without a sliding window)."""
        return self.layout.window_pages() if self._swa else 0

    def empty_device_pools(self) -> dict[str, jax.Array]:
        """Zero-filled pools of the same shapes and placement as `device_pools`, owned by the
        caller (e.g. to run the model with no cache at all)."""
        return self._engine.init_device_pools()

    def warmup(self, max_pages: int | None = None) -> None:
        """Compile the transfer programs of every plan of up to `max_pages` pages per chunk,
        ahead of the first transfer, and run each once on pages that move nothing (on one
        device: a GPU loads a program's kernels at its first run), and keep every one-page
        index on the device, so no hit hands its page index over (see
        `TransferEngine.warmup` and `warm_runs`). The pools' bytes are unchanged."""
        if max_pages is not None:
            validate.count("max_pages", max_pages, minimum=1)
        self._engine.warmup(max_pages)
        self._data.warm_runs()
        self._data.warm_landings()

    def landing_examples(self):
        """One `Landing` of every shape a deferred load can hand to a step, landing nothing:
        run the serving loop's step on each at warm-up (as on a request's first prefill
        chunk), so that no host hit compiles the step while serving. An iterator: each
        holds a pinned block of its size until dropped."""
        return self._engine.landing_examples()

    # -- device pools ----------------------------------------------------------------------
    @property
    def device_pools(self) -> dict[str, jax.Array]:
        """`{pool: jax.Array}` the model reads and writes (donate them, then `set_device_pools`)."""
        return dict(self._data.pools)

    def set_device_pools(self, pools: Mapping[str, jax.Array], landed=None) -> None:
        """Adopt the pools a jitted step returned; wrong pools raise ValueError, nothing changes.
        `landed`: the `Landing` of a deferred load that this step landed (`Landing.schedule`)."""
        self._data.adopt(pools, landed)

    # -- read path (prefix_reads.py) --------------------------------------------------------------
    def match_prefix(self, tokens) -> MatchResult:
        """The longest usable prefix on device, and how much more a load-back would bring."""
        return self._checked(self._reads.match(as_tokens(tokens)))

    def load_back(self, match: MatchResult, deferred: bool = False) -> LoadBack:
        """Bring the host part of `match` to the device, all or nothing.

        Refused (the caller recomputes) below the threshold, when the cost model says
        recomputing is faster, when another load owns a node, or without device space.
        `deferred`: leave its largest whole host block of a landing size to the model's next
        step (`LoadBack.landing`).
        """
        if not isinstance(match, MatchResult):
            raise ValueError(f"load_back takes a MatchResult, got {type(match).__name__}")
        return self._checked(self._reads.load_back(match, patient=False, deferred=validate.flag("deferred", deferred)))

    def acquire(self, tokens, load_back: bool = True, deferred: bool = False) -> Prefix:
        """match -> lock -> (load_back -> wait) in one call: the usable prefix, pinned.

        Blocks while its own load-back is in flight, and for backups in flight when it
        comes up short of device room or matches host copies they still write; a loop that
        serves other requests meanwhile uses `match_prefix` / `load_back` / `step` itself.
        A failed or refused load leaves the device part of the match, still pinned.
        `deferred`: do not wait for the load; its largest whole host block of a landing size
        goes into the model's next step (`Prefix.landing`, see `Landing`). A load that leaves
        nothing to the step (`landing` None) moved at once and is waited for like a blocking one.
        """
        validate.flag("acquire's load_back", load_back)
        deferred = validate.flag("deferred", deferred)
        return self._checked(self._reads.acquire(as_tokens(tokens), load_back, deferred))

    def acquire_many(self, token_seqs, load_back: bool = True, deferred: bool = False) -> list[Prefix]:
        """`acquire` for several requests at once (a step's admitted requests): one `Prefix`
        each, in order, each with the same contract as `acquire`'s (its own lock; a refused
        or failed load leaves its device part, still pinned). Their host loads start as one
        transfer (their plans merged), then are waited for together: one dispatch, not one
        per request. A request that matches nodes an earlier one of the call is loading
        waits for those loads first and finds them on the device, as it would after one
        `acquire` each; hits are counted as `acquire` would count them.
        `deferred`: the last transfer may leave one block to the model's next step; every
        `Prefix` whose load is in it carries that `Landing`, which one step lands for all.
        `token_seqs`: a list or tuple of token sequences (each as `acquire` takes them, not
        empty); anything else raises ValueError before anything changes."""
        seqs = validate.token_seqs(token_seqs, as_tokens)
        validate.flag("acquire_many's load_back", load_back)
        deferred = validate.flag("deferred", deferred)
        return self._checked(self._reads.acquire_many(seqs, bool(load_back), deferred))

    def wait(self, load: LoadBack) -> bool:
        """Block until `load` lands; True if its pages are valid, False if it failed (recompute).
        Either way its lock stays held until the caller unlocks it."""
        if not isinstance(load, LoadBack):
            raise ValueError(f"wait takes a LoadBack, got {type(load).__name__}")
        return self._checked(self._reads.wait(load))

    # -- write path and pages -----------------------------------------------------------------
    def alloc(self, pages: int, swa_pages: int = 0) -> dict[str, np.ndarray] | None:
        """Held device pages for a request: {allocator: i32[n]} (the SWA pool's entry present
        whenever the layout has one), all or nothing, or None when even eviction cannot free
        enough (a bad count raises ValueError). Pages a queued backup has yet to read and pages
        a load fills are not evictable: while short, this dispatches the queued backups (read
        pages are evictable before the copy lands) and tries again, then waits for the loads
        (landing deferred loads no step took) and unread backups and tries again, so a refusal
        does not depend on the link's speed or a failure; `device_room()` then says what each
        allocator could give. The pages are the caller's until `insert` or `free`."""
        need = validate.page_needs(self._core.anchor, self._swa, pages, swa_pages)
        device = self._core.ledger.allocators(Tier.DEVICE)
        if any(n > device[a].capacity - self._core.held_pages(a) for a, n in need.items()):
            return None     # more than every page not held by a request: waiting cannot help
        got = self._core.alloc_device(need)
        self._data.flush_demotions()
        while got is None and self._data.free_room():
            got = self._core.alloc_device(need)
            self._data.flush_demotions()
        return self._checked(got)

    def device_room(self) -> dict[str, int]:
        """Per allocator, the pages `alloc` could grant: free + the tree's pages no lock pins."""
        return self._core.device_room()

    def free(self, allocator: str, pages) -> None:
        """Give back held device pages not given to `insert` (i32 page ids of `allocator`, e.g.
        `cache.anchor`); pages not held by a request raise ValueError, nothing freed."""
        self._core.free_device(allocator, pages)
        self._checked(None)

    def insert(self, tokens, device_pages, swa_pages: Mapping[int, int] | None = None) -> InsertResult:
        """Register a request's computed pages (whole pages only); see `Inserter.insert`.
        `swa_pages`: {logical page: held SWA page} whose window data the tree should keep."""
        return self._checked(self._core.insert(tokens, device_pages, validate.windows(self._swa, swa_pages)))

    def retract(self, tokens, device_pages, swa_pages: Mapping[int, int] | None = None) -> int:
        """A request leaves mid-flight: keep its whole pages, free the rest; return the
        length to resume from. State inside an unfinished page (the V4.1 ratio-2 pair ring,
        an unfinished C128 chunk, draft KV) is request-scoped and never backed up: the
        request recomputes from the returned length, it is never half-restored."""
        swa = validate.page_map("swa_pages", swa_pages)
        if swa and self._swa is None:
            validate.windows(self._swa, swa)          # names the mistake
        return self._checked(self._core.retract(as_tokens(tokens), validate.page_ids("device_pages", device_pages),
                                                self._swa, swa))

    def lock(self, node: NodeId) -> LockId:
        """Pin the prefix ending at `node` (a `MatchResult.device_node`) on device until
        `unlock`: its pages and its window's SWA pages are not evicted meanwhile. Lock right
        after `match_prefix`, before anything else can evict. A node whose pages are not
        (or no longer) on device raises ValueError."""
        return self._checked(self._core.lock(node))

    def unlock(self, lock: LockId) -> None:
        """Release a lock from `lock`, `acquire` (`Prefix.lock`) or `load_back` (`LoadBack.lock`)."""
        self._core.unlock(lock)
        self._checked(None)

    def evict(self, num_pages: int, swa_pages: int = 0) -> EvictResult:
        """Free at least `num_pages` anchor and `swa_pages` SWA device pages now, least
        recently used first (locked prefixes never): backed-up pages stay on the host,
        unbacked ones are backed up first under write-back, else dropped and counted.
        Returns what was freed (less when too little is evictable)."""
        res = self._core.evict_device(validate.page_needs(self._core.anchor, self._swa, num_pages, swa_pages,
                                                         "num_pages"))
        self._data.flush_demotions()
        return self._checked(res)

    def evict_host(self, num_pages: int, swa_pages: int = 0) -> int:
        """Free at least `num_pages` anchor and `swa_pages` SWA host pages now, least recently
        used host leaves first (a leaf's every pool at once); returns the anchor pages freed
        (less when too little is evictable). The storage tier, if any, keeps what it stored."""
        need = validate.page_needs(self._core.anchor, self._swa, num_pages, swa_pages, "num_pages")
        return self._checked(self._core.evict_host(need))

    def pace_backups(self, bytes_per_step: int | None) -> None:
        """From now on, cut write-through backups into pieces of at most `bytes_per_step` and
        send that much per `step()` (None: whole batches, at once); see `TransferConfig`."""
        if bytes_per_step is not None:
            validate.count("bytes_per_step", bytes_per_step, minimum=1)
        transfer = dataclasses.replace(self.config.transfer, backup_bytes_per_step=bytes_per_step)
        self.config = self._data.config = dataclasses.replace(self.config, transfer=transfer)

    # -- the step boundary ------------------------------------------------------------------
    def step(self) -> StepReport:
        """Dispatch this step's backups (paced: `TransferConfig.backup_bytes_per_step`); apply
        every transfer that ended."""
        return self._checked(self._data.step())

    def drain(self) -> None:
        """Dispatch what is queued and wait for every transfer in flight."""
        self._data.drain()
        self._checked(None)

    def save_snapshot(self, directory, overwrite: bool = False) -> int:
        """Write the host tier's cached prefixes and the tree above them to `directory`
        (orbax), for a planned restart; returns the nodes saved. Drains first."""
        return cache_snapshot.save(self, directory, overwrite)

    def restore_snapshot(self, directory) -> int:
        """Bring a snapshot of a cache of the same layout (and `StorageConfig.model_id`) into this
        one, which must be empty: its prefixes come back host-only. Returns the nodes restored."""
        return self._checked(cache_snapshot.restore(self, directory))

    def close(self) -> None:
        """Stop the storage tier's I/O threads (the cache is not used afterwards)."""
        if self._storage is not None:
            self._storage.close()

    def _checked(self, value):
        if self.config.check_invariants:
            self.check_invariants()
        return value
