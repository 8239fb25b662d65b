"""Cache configuration: frozen dataclasses in three sections, each default written once.

    HiCacheConfig        tiers (device, host), write policy, load-back threshold and cost model
      .transfer          TransferConfig: how bytes move between device and host
      .storage           StorageConfig: the L3 tier below the host (off without a `url`)

Pure Python (no jax). Every bad value raises `ValueError` naming the section, the field
and the value. Policies are enums; a string of one of their values is accepted and
stored as the member. Components take their section (`TransferEngine(..., config.transfer)`,
`StorageTier(..., config.storage)`), so a default lives here and nowhere else.
"""
from __future__ import annotations

import dataclasses
import enum
import os

from hicache_jax import validate


class WritePolicyName(enum.StrEnum):
    """`HiCacheConfig.write_policy`: when device pages get a host copy (see `tree.policy.WritePolicy`)."""

    WRITE_THROUGH = "write_through"                      # back up on the first hit
    WRITE_THROUGH_SELECTIVE = "write_through_selective"  # back up on the second hit
    WRITE_BACK = "write_back"                            # back up only when evicted from device


class StorageWritePolicy(enum.StrEnum):
    """`StorageConfig.write_policy`: when a host copy is put in the store."""

    WRITE_THROUGH = "write_through"   # when the backup that made it lands
    WRITE_BACK = "write_back"         # when the host tier evicts it


class PrefetchPolicy(enum.StrEnum):
    """`StorageConfig.prefetch_policy`: how long `acquire` waits for pages read from the store."""

    BEST_EFFORT = "best_effort"       # not at all: what has arrived is used, the rest next time
    WAIT_COMPLETE = "wait_complete"   # until the reads end (at most the call timeout)
    TIMEOUT = "timeout"               # a budget growing with the prompt (`prefetch_wait_s`)


class _Checker:
    """Field checks of one section; errors read "<Section> field '<name>' ..."."""

    def __init__(self, owner):
        self._owner = owner
        self.prefix = f"{type(owner).__name__} field "

    def count(self, name: str, value, minimum: int = 0) -> int:
        return validate.count(f"{self.prefix}'{name}'", value, minimum)

    def optional_count(self, name: str, value, minimum: int = 0) -> None:
        if value is not None:
            self.count(name, value, minimum)

    def number(self, name: str, value, positive: bool = True) -> float:
        return validate.number(f"{self.prefix}'{name}'", value, positive=positive)

    def choice(self, name: str, value, kind: type[enum.Enum]) -> None:
        if not isinstance(value, str) or value not in kind.__members__.values():
            raise ValueError(f"{self.prefix}{name!r} must be one of {', '.join(kind)}; got {value!r}")
        object.__setattr__(self._owner, name, kind(value))   # a plain string becomes the member


DEFAULT_LOAD_BACK_THRESHOLD = 10        # tokens: smaller host hits are recomputed
DEFAULT_LINK_BYTES_PER_SECOND = 25e9    # the cost model's host -> device rate
DEFAULT_PREFETCH_SHARE = 0.5            # of each host allocator, at most this much reserved by prefetches


@dataclasses.dataclass(frozen=True)
class TransferConfig:
    """How bytes move between the device pools and the host tier.

    Backups run in device order with the model's steps, so a large batch delays the next
    step by its whole transfer time: with `backup_bytes_per_step` set, write-through batches
    are cut into pieces of at most that size and each `step()` dispatches pieces up to that
    many bytes (oldest first, at least one); write-back demotions and load-backs are never
    paced. With `layer_groups` = n > 1 the host tier stores each page as n parts, one per
    group of consecutive layers, so a deferred load-back can be landed by the model's step
    group by group (`Landing`); a deferred load leaves one whole anchor block of one of
    `landing_buckets` sizes (the largest powers of two of a chunk) to the step, so the step
    compiles for that many shapes, at warm-up (`HiCache.landing_examples`). A one-block load
    of at least `early_copy_bytes` starts its copy before the plan is checked. A load that
    gathers pieces of several host blocks moves by one program per piece and allocator;
    with `fuse_after` = n > 0 a shape of pieces seen n times gets a program of its own (one
    dispatch), compiled on a background thread. Off by default: under traffic most shapes
    come once or twice, and each compilation holds the serving thread's GIL for about 0.45 s
    of tracing and lowering (Mosaic GPU kernels), which stalls the loop's steps
    (BENCHMARKS.md, "Fused loads stall a replay on the H200"). Turn it on where the same hit
    shapes recur (a benchmark, a fixed batch of system prompts) and warm them up. Rows that
    are part of a host block and hold at least `view_bytes` move as a DLPack view of just
    those rows (one DMA) instead of a kernel reading a slice of the block over PCIe, whose
    speed depends on the machine; smaller runs are read (making a view costs 0.15-0.2 ms on
    an H100); None: never view.
    """

    max_staging_bytes: int = 512 << 20          # device staging per allocator; bounds a chunk
    layer_groups: int = 1
    landing_buckets: int = 3
    early_copy_bytes: int = 12 << 20            # measured on the H200 (transfer/blocks.py)
    backup_bytes_per_step: int | None = None
    timeout_s: float = 30.0                     # a transfer not done by then is failed
    host_memory_limit_bytes: int | None = None  # default: XLA's pinned pool cap (`xla_pinned_limit_bytes`)
    kernels: str = "auto"                       # pack/unpack kernels: a name of `pallas_kernels.IMPLS`
    block_bytes: int | None = None              # bytes one kernel copy moves (default: the backend's)
    fuse_after: int = 0                         # loads of one shape of pieces before its program compiles (0: never)
    view_bytes: int | None = 4 << 20            # parts of host blocks this large move as views of their rows (H100)

    def __post_init__(self):
        check = _Checker(self)
        check.count("max_staging_bytes", self.max_staging_bytes, minimum=1)
        check.count("layer_groups", self.layer_groups, minimum=1)
        check.count("landing_buckets", self.landing_buckets, minimum=1)
        check.count("early_copy_bytes", self.early_copy_bytes)
        check.optional_count("backup_bytes_per_step", self.backup_bytes_per_step, minimum=1)
        check.number("timeout_s", self.timeout_s)
        check.optional_count("host_memory_limit_bytes", self.host_memory_limit_bytes, minimum=1)
        check.optional_count("block_bytes", self.block_bytes, minimum=1)
        check.count("fuse_after", self.fuse_after)
        check.optional_count("view_bytes", self.view_bytes)
        if not isinstance(self.kernels, str):
            raise ValueError(f"TransferConfig field 'kernels' must be a kernel name, got {self.kernels!r}")

    def host_limit_bytes(self) -> int:
        """The most pinned host memory the host tier may take: `host_memory_limit_bytes`, or
        by default the cap of XLA's pinned pool (`xla_pinned_limit_bytes`)."""
        return self.host_memory_limit_bytes if self.host_memory_limit_bytes is not None else xla_pinned_limit_bytes()


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    """The L3 tier: off unless `url` names a store (file:///dir, gs://..., s3://...,
    mooncake://host:port, memory://). `model_id` names the weights in every key."""

    url: str | None = None
    write_policy: StorageWritePolicy = StorageWritePolicy.WRITE_THROUGH
    prefetch_policy: PrefetchPolicy = PrefetchPolicy.TIMEOUT
    prefetch_timeout_s: float = 0.05            # timeout policy: base + per 1K prompt tokens, capped
    prefetch_timeout_per_1k_tokens_s: float = 0.01
    prefetch_timeout_max_s: float = 1.0
    prefetch_share: float = DEFAULT_PREFETCH_SHARE
    model_id: str = ""
    call_timeout_s: float = 5.0                 # the longest any storage call may block the serving loop
    retry_after_s: float = 10.0                 # after a failure, serve from L1/L2 only this long
    connect_retry_s: float = 0.0                # keep trying to reach a store that is down this long (0: once)
    io_threads: int = 2

    def __post_init__(self):
        check = _Checker(self)
        if self.url is not None:
            if not (isinstance(self.url, str) and "://" in self.url):
                raise ValueError(f"StorageConfig field 'url' must be a storage URL such as file:///dir or "
                                 f"mooncake://host:port, got {self.url!r}")
            from hicache_jax.storage.urls import check_url   # the URL's form only: nothing is opened
            try:
                check_url(self.url)
            except ValueError as e:
                raise ValueError(f"StorageConfig field 'url': {e}") from None
        check.choice("write_policy", self.write_policy, StorageWritePolicy)
        check.choice("prefetch_policy", self.prefetch_policy, PrefetchPolicy)
        for name in ("prefetch_timeout_s", "prefetch_timeout_per_1k_tokens_s", "prefetch_timeout_max_s",
                     "call_timeout_s", "retry_after_s"):
            check.number(name, getattr(self, name))
        check.number("connect_retry_s", self.connect_retry_s, positive=False)
        share = check.number("prefetch_share", self.prefetch_share)
        if share > 1:
            raise ValueError(f"StorageConfig field 'prefetch_share' must be in (0, 1], got {share!r}")
        if not isinstance(self.model_id, str):
            raise ValueError(f"StorageConfig field 'model_id' must be a str, got {self.model_id!r}")
        check.count("io_threads", self.io_threads, minimum=1)

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def prefetch_wait_s(self, prompt_tokens: int) -> float | None:
        """How long `acquire` waits for a prefetch of a prompt this long (None: until it ends)."""
        match self.prefetch_policy:
            case PrefetchPolicy.BEST_EFFORT:
                return 0.0
            case PrefetchPolicy.WAIT_COMPLETE:
                return None
        return min(self.prefetch_timeout_max_s,
                   self.prefetch_timeout_s + self.prefetch_timeout_per_1k_tokens_s * prompt_tokens / 1000)


@dataclasses.dataclass(frozen=True)
class HiCacheConfig:
    """How big each tier is and how the cache behaves. Validated at construction.

    Device tier: `device_pages` anchor pages (tokens = pages x page_size) and
    `swa_device_pages` SWA pages (default: as many). Host tier, exactly one of:
    `host_pages` (anchor pages, or {allocator: pages}), `host_ratio` (host pages = ratio x
    device pages, every allocator), or `host_budget_bytes` ({allocator: bytes}: a per-pool
    budget, turned into pages by the bytes of one page of every pool that allocator
    addresses). Default: `host_ratio=2.0`. `host_pages=0`: no host tier (a device prefix
    cache: nothing is backed up, an evicted page is dropped; no storage tier either).

    Load-back: a host hit is brought back only if it moves at least
    `max(1, load_back_threshold)` tokens (or an SWA window), and, when
    `recompute_seconds_per_token` is set, only if moving its bytes at
    `link_bytes_per_second`, plus `load_overhead_seconds` (the host time a load costs
    whatever its size: planning, program calls), is faster than recomputing its tokens.
    """

    device_pages: int
    swa_device_pages: int | None = None
    host_pages: int | dict[str, int] | None = None
    host_ratio: float | None = None
    host_budget_bytes: dict[str, int] | None = None
    write_policy: WritePolicyName = WritePolicyName.WRITE_THROUGH
    write_through_threshold: int | None = None   # hits before a backup; the policy's default when None
    load_back_threshold: int = DEFAULT_LOAD_BACK_THRESHOLD
    recompute_seconds_per_token: float | None = None
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND
    load_overhead_seconds: float = 0.0
    check_invariants: bool = False               # recompute every invariant after each call (tests)
    transfer: TransferConfig = TransferConfig()
    storage: StorageConfig = StorageConfig()

    def __post_init__(self):
        check = _Checker(self)
        check.count("device_pages", self.device_pages, minimum=1)
        check.optional_count("swa_device_pages", self.swa_device_pages, minimum=1)
        given = [n for n in ("host_pages", "host_ratio", "host_budget_bytes") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of host_pages, host_ratio, host_budget_bytes; got {', '.join(given)}")
        if isinstance(self.host_pages, dict):
            for k, v in self.host_pages.items():
                check.count(f"host_pages[{k!r}]", v)
        else:
            check.optional_count("host_pages", self.host_pages)
        if self.host_ratio is not None:
            check.number("host_ratio", self.host_ratio)
        if self.host_budget_bytes is not None:
            if not isinstance(self.host_budget_bytes, dict):
                raise ValueError(f"HiCacheConfig field 'host_budget_bytes' must be {{allocator: bytes}}, "
                                 f"got {self.host_budget_bytes!r}")
            for k, v in self.host_budget_bytes.items():
                check.count(f"host_budget_bytes[{k!r}]", v)
        check.choice("write_policy", self.write_policy, WritePolicyName)
        check.optional_count("write_through_threshold", self.write_through_threshold, minimum=1)
        if isinstance(self.load_back_threshold, bool) or not isinstance(self.load_back_threshold, int):
            raise ValueError(f"HiCacheConfig field 'load_back_threshold' must be an integer, "
                             f"got {self.load_back_threshold!r}")
        if self.recompute_seconds_per_token is not None:
            check.number("recompute_seconds_per_token", self.recompute_seconds_per_token)
        check.number("link_bytes_per_second", self.link_bytes_per_second)
        if check.number("load_overhead_seconds", self.load_overhead_seconds, positive=False) < 0:
            raise ValueError(f"HiCacheConfig field 'load_overhead_seconds' must be >= 0, "
                             f"got {self.load_overhead_seconds!r}")
        if not isinstance(self.check_invariants, bool):
            raise ValueError(f"HiCacheConfig field 'check_invariants' must be a bool, got {self.check_invariants!r}")
        for name, kind in (("transfer", TransferConfig), ("storage", StorageConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"HiCacheConfig field {name!r} must be a {kind.__name__}, "
                                 f"got {getattr(self, name)!r}")

    def page_counts(self, layout) -> tuple[dict[str, int], dict[str, int]]:
        """(device pages, host pages) per allocator of `layout` (pure: no allocation)."""
        allocators = [p.name for p in layout.allocator_pools]
        anchor = layout.anchor.name
        device = {a: self.device_pages if a == anchor else (self.swa_device_pages or self.device_pages)
                  for a in allocators}
        if isinstance(self.host_pages, dict):
            host = dict(self.host_pages)
        elif self.host_pages is not None:
            host = {a: self.host_pages for a in allocators}
        elif self.host_budget_bytes is not None:
            host = {a: b // max(1, layout.page_bytes_of(a)) for a, b in self.host_budget_bytes.items()}
        else:
            ratio = 2.0 if self.host_ratio is None else self.host_ratio
            host = {a: max(1, int(device[a] * ratio)) for a in allocators}
        unknown = sorted(set(host) - set(allocators))
        missing = sorted(set(allocators) - set(host))
        if unknown or missing:
            raise ValueError(f"host page budgets name {unknown or missing}: they must cover exactly the "
                             f"allocators {allocators}")
        if any(host.values()) and not all(host.values()):
            raise ValueError(f"host pages {host}: give every allocator pages, or none (host_pages=0: no host tier)")
        return device, host


def xla_pinned_limit_bytes() -> int:
    """The cap of XLA's pinned host allocator: `XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB` GiB when
    set (XLA reads the same variable), else XLA's default of 64 GiB. Read when a cache is
    built, never at import."""
    raw = os.environ.get("XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB")
    if raw is None:
        return 64 << 30
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB must be a number of GiB, got {raw!r}") from None
    return int(gib * (1 << 30))
