"""What a simulated fleet is: frozen settings, checked at construction.

Each instance is configured by a real `HiCacheConfig` (device and host pages per
allocator, write policy, load-back threshold, storage write and prefetch policies), the
same object a serving process would build, so the simulated tree takes the decisions the
real cache takes. Around it: how many instances, how requests are routed, the shared
storage tier's size, and the rates that turn bytes and tokens into time.

Default rates come from BENCHMARKS.md's H200 measurements where there is one:
host <-> device 45 GB/s (a 256-page V4-Flash backup 45.1, load 44.1 GB/s), storage ->
host 1.94 GB/s and host -> storage 1.11 GB/s (Mooncake Store over loopback TCP on the
H200 machine; an RDMA network is faster), a storage lookup 0.7 ms (a Mooncake miss
lookup there). The prefill rate is an assumption, not a measurement: 10,000 prompt
tokens per second per instance; pass your own.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hicache_jax import validate
from hicache_jax.config import HiCacheConfig
from hicache_jax.window_policy import DEFAULT_WINDOW_POLICY, WindowPolicy

ROUTES = ("random", "round_robin", "affinity")


@dataclasses.dataclass(frozen=True)
class Rates:
    """How long things take on one instance. Bytes per second per link direction (each
    direction is its own FIFO queue), tokens per second of prefill, seconds per lookup."""

    host_link_bytes_per_s: float = 45e9            # device <-> host (PCIe), each direction
    storage_read_bytes_per_s: float = 1.94e9       # storage -> host
    storage_write_bytes_per_s: float = 1.11e9      # host -> storage
    storage_lookup_s: float = 0.7e-3               # one `usable_prefix` round trip
    prefill_tokens_per_s: float = 10_000.0         # an assumption: measure your model and pass it

    def __post_init__(self):
        for f in dataclasses.fields(self):
            validate.number(f"Rates.{f.name}", getattr(self, f.name))


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """A fleet of `instances` identical caches (`cache`) and, when `storage_pages` is set,
    one storage tier shared by all of them (pages per allocator, LRU when full).

    `route`: random | round_robin | affinity (the instance holding the longest prefix of
    the prompt among those whose queue is at most `load_bound` requests longer than the
    shortest). `window_policy`: the stop points whose SWA pages a request keeps.
    `max_input_tokens`: prompts cut to this many tokens (None: whole). `serial`: every
    request runs alone and every transfer lands before the next one starts, whatever the
    trace's timestamps say: the order the real multi-process check uses, where timing
    decides nothing. `seed`: of random routing.
    """

    cache: HiCacheConfig
    instances: int = 1
    route: str = "affinity"
    load_bound: int = 4
    storage_pages: Mapping[str, int] | None = None
    window_policy: WindowPolicy = WindowPolicy.parse(DEFAULT_WINDOW_POLICY)
    rates: Rates = Rates()
    max_input_tokens: int | None = None
    serial: bool = False
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.cache, HiCacheConfig):
            raise ValueError(f"SimConfig.cache must be a HiCacheConfig, got {type(self.cache).__name__}")
        if self.cache.storage.url is not None:
            raise ValueError(f"SimConfig.cache.storage.url must be None (the simulated store is "
                             f"SimConfig.storage_pages), got {self.cache.storage.url!r}")
        validate.count("SimConfig.instances", self.instances, minimum=1)
        validate.count("SimConfig.load_bound", self.load_bound)
        validate.count("SimConfig.seed", self.seed)
        if self.route not in ROUTES:
            raise ValueError(f"SimConfig.route must be one of {', '.join(ROUTES)}; got {self.route!r}")
        if self.storage_pages is not None:
            if not isinstance(self.storage_pages, Mapping):
                raise ValueError(f"SimConfig.storage_pages must be {{allocator: pages}}, got {self.storage_pages!r}")
            for a, n in self.storage_pages.items():
                validate.count(f"SimConfig.storage_pages[{a!r}]", n)
        if not isinstance(self.window_policy, WindowPolicy):
            raise ValueError(f"SimConfig.window_policy must be a WindowPolicy, got {self.window_policy!r}")
        if not isinstance(self.rates, Rates):
            raise ValueError(f"SimConfig.rates must be Rates, got {type(self.rates).__name__}")
        if self.max_input_tokens is not None:
            validate.count("SimConfig.max_input_tokens", self.max_input_tokens, minimum=1)
        validate.flag("SimConfig.serial", self.serial)

    @property
    def has_storage(self) -> bool:
        return self.storage_pages is not None


__all__ = ["ROUTES", "Rates", "SimConfig"]
